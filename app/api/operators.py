"""Operator endpoints: tenants, job types, stats, health; routed by ``app.api.routes``."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from app import migrations
from app.api import context, schemas, security
from app.api.parsing import body, query_params
from app.api.problems import JSON
from app.domain import FAIRNESS_KEY_RE, JOB_TYPE_RE, TENANT_ID_RE, utcnow
from app.errors import InvalidArgument, ResourceExhausted
from app.keys import audit
from app.metrics.events import CONTENT_TYPE
from app.scheduler import FairnessBy, RateLimit


def _by(request: Request) -> str:
    """Who made a change, for the audit log: the key id ("-" with auth off)."""
    return security.principal(request).key_id or "-"


def _tenant_id(raw: str) -> str:
    if not TENANT_ID_RE.fullmatch(raw):
        raise InvalidArgument(f"tenantId {raw!r} must match {TENANT_ID_RE.pattern}")
    return raw


def _job_type(request: Request, suffix: str = "") -> str:
    """The job type a ``/v2/job-types/{type}`` path names: all of the path after the
    prefix (and before ``suffix``, an action's: ``/pause``).  Not the route's
    ``job_type`` parameter: Starlette's path convertor (``.*``) stops before a final
    newline, so ``t%0A`` would be served as ``t``."""
    raw = request.scope["path"].removeprefix("/v2/job-types/").removesuffix(suffix)
    if not JOB_TYPE_RE.fullmatch(raw):
        raise InvalidArgument(f"type {raw!r} must match {JOB_TYPE_RE.pattern}")
    return raw


def _rate_limit(spec: schemas.RateLimit | None) -> RateLimit | None:
    return None if spec is None else RateLimit(spec.perSecond, spec.burst)


def _shown_rate(rate: RateLimit | None) -> str:
    return "none" if rate is None else f"{rate.per_s:g}/s,burst={rate.burst:g}"


async def put_tenant(request: Request, tenant_id: str) -> Response:
    tid = _tenant_id(tenant_id)
    spec = await body(request, schemas.PutTenant)
    rate = _rate_limit(spec.rateLimit)
    out = await context.services(request).config.put_tenant(
        tid, spec.weight, spec.maxActiveJobs, rate, spec.minActiveJobs
    )
    audit.info(
        "tenant configured: %s weight=%s maxActiveJobs=%s minActiveJobs=%s rateLimit=%s by=%s",
        tid,
        spec.weight,
        spec.maxActiveJobs,
        spec.minActiveJobs,
        _shown_rate(rate),
        _by(request),
    )
    return JSON(out)


async def list_tenants(request: Request) -> Response:
    return JSON({"tenants": await context.services(request).config.list_tenants()})


async def get_tenant(request: Request, tenant_id: str) -> Response:
    return JSON(await context.services(request).config.get_tenant(_tenant_id(tenant_id)))


async def delete_tenant(request: Request, tenant_id: str) -> Response:
    tid = _tenant_id(tenant_id)
    await context.services(request).config.delete_tenant(tid)
    audit.info("tenant reset to defaults: %s by=%s", tid, _by(request))
    return Response(status_code=204)


def _fairness_key(raw: str) -> str:
    if not FAIRNESS_KEY_RE.fullmatch(raw):
        raise InvalidArgument(f"fairnessKey {raw!r} must match {FAIRNESS_KEY_RE.pattern}")
    return raw


async def put_key(request: Request, tenant_id: str, fairness_key: str) -> Response:
    tid, key = _tenant_id(tenant_id), _fairness_key(fairness_key)
    spec = await body(request, schemas.PutKey)
    out = await context.services(request).config.put_key(tid, key, spec.weight, spec.maxActiveJobs)
    audit.info(
        "fairness key configured: %s/%s weight=%s maxActiveJobs=%s by=%s",
        tid,
        key,
        spec.weight,
        spec.maxActiveJobs,
        _by(request),
    )
    return JSON(out)


async def get_key(request: Request, tenant_id: str, fairness_key: str) -> Response:
    tid, key = _tenant_id(tenant_id), _fairness_key(fairness_key)
    return JSON(await context.services(request).config.get_key(tid, key))


async def delete_key(request: Request, tenant_id: str, fairness_key: str) -> Response:
    tid, key = _tenant_id(tenant_id), _fairness_key(fairness_key)
    await context.services(request).config.delete_key(tid, key)
    audit.info("fairness key reset to weight 1: %s/%s by=%s", tid, key, _by(request))
    return Response(status_code=204)


async def put_job_type(request: Request, job_type: str) -> Response:
    jt = _job_type(request)
    spec = await body(request, schemas.PutJobType)
    rate = _rate_limit(spec.rateLimit)
    fairness_by = FairnessBy(spec.fairnessBy or FairnessBy.ACTIVATIONS)
    out = await context.services(request).config.put_job_type(
        jt,
        spec.maxActiveJobs,
        spec.agingIntervalMs,
        spec.agingStep,
        rate,
        fairness_by,
        spec.maxActivePerKey,
        spec.keyOrdering,
    )
    audit.info(
        "job type configured: %s maxActiveJobs=%s agingIntervalMs=%s agingStep=%s"
        " rateLimit=%s fairnessBy=%s maxActivePerKey=%s keyOrdering=%s by=%s",
        jt,
        spec.maxActiveJobs,
        spec.agingIntervalMs,
        spec.agingStep,
        _shown_rate(rate),
        fairness_by.value,
        spec.maxActivePerKey,
        spec.keyOrdering,
        _by(request),
    )
    return JSON(out)


async def list_job_types(request: Request) -> Response:
    items = await context.services(request).config.list_job_types()
    return JSON({"jobTypes": items})


async def get_job_type(request: Request, job_type: str) -> Response:
    out = await context.services(request).config.get_job_type(_job_type(request))
    return JSON(out)


async def pause_tenant(request: Request, tenant_id: str) -> Response:
    tid = _tenant_id(tenant_id)
    out = await context.services(request).config.pause_tenant(tid)
    audit.info("tenant paused: %s by=%s", tid, _by(request))
    return JSON(out)


async def resume_tenant(request: Request, tenant_id: str) -> Response:
    tid = _tenant_id(tenant_id)
    out = await context.services(request).config.resume_tenant(tid)
    audit.info("tenant resumed: %s by=%s", tid, _by(request))
    return JSON(out)


async def pause_job_type(request: Request, job_type: str) -> Response:
    jt = _job_type(request, "/pause")
    out = await context.services(request).config.pause_job_type(jt)
    audit.info("job type paused: %s by=%s", jt, _by(request))
    return JSON(out)


async def resume_job_type(request: Request, job_type: str) -> Response:
    jt = _job_type(request, "/resume")
    out = await context.services(request).config.resume_job_type(jt)
    audit.info("job type resumed: %s by=%s", jt, _by(request))
    return JSON(out)


async def stats(request: Request) -> Response:
    params = query_params(request)
    unknown = set(params) - {"type"}
    if unknown:
        raise InvalidArgument(f"unknown query parameters: {', '.join(sorted(unknown))}")
    job_type = params.get("type")
    if job_type is not None and not JOB_TYPE_RE.fullmatch(job_type):
        raise InvalidArgument(f"type {job_type!r} must match {JOB_TYPE_RE.pattern}")
    caller = security.principal(request)
    visible = caller.sees if caller.scoped else None
    return JSON(await context.services(request).stats.stats(utcnow(), job_type, visible))


async def healthz() -> Response:
    return JSON({"status": "ok"})


async def readyz(request: Request) -> Response:
    health = context.services(request).health
    # StoreUnavailable (503) if it cannot answer
    revision, oldest_server = await health.schema_revision()
    head = request.app.state.schema_head
    if not migrations.serves(revision, oldest_server):
        raise ResourceExhausted(
            f"schema at {revision}, this server needs {head}"
            + (f" (the schema serves servers from {oldest_server} on)" if oldest_server else ""),
            retry_after_s=5,
        )
    return JSON({"status": "ready", "schema": revision, "server": head})


async def metrics(request: Request) -> Response:
    services = context.services(request)
    text = await services.scrape.exposition(utcnow(), security.principal(request))
    return Response(text, media_type=CONTENT_TYPE)
