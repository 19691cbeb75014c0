"""Native job endpoints (API.md "Producers" and "Workers"), routed by ``app.api.routes``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from pydantic import TypeAdapter
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

from app.activation import ActivateRequest, keep_alive_factory
from app.api import context, schemas, security, traced
from app.api.callers import HttpCaller
from app.api.finishes import fail, fenced
from app.api.parsing import (
    ascii_digits,
    body,
    check_payload_size,
    job_key,
    payload,
    payload_limit,
    query_params,
    validate,
)
from app.api.problems import JSON
from app.domain import FAIRNESS_KEY_RE, job_record, tenant_of, utcnow
from app.errors import InvalidArgument
from app.jobs import JobChanges

CREATE_JOB = TypeAdapter(schemas.CreateJob)
CREATE_BATCH = TypeAdapter(schemas.CreateBatch)


def _check_jobs(request: Request, jobs: list[schemas.CreateJob], payload_limit: int | None) -> None:
    """The rules a schema cannot say, and the key's scope (403 for a tenant or type out
    of it).  ``payload_limit``: check each job's variables + customHeaders against it, or
    None when the whole body is under it (then no job in it can be over: the usual case,
    which skips the work)."""
    caller = security.principal(request)
    header = request.app.state.settings.fairness_key_header
    for i, job in enumerate(jobs):
        if caller.scoped:
            security.require_scope(caller, tenant_of(job), job["type"])
        if job.get("runAt") is not None and job.get("delay") is not None:
            raise InvalidArgument("give runAt or delay, not both")
        if header:
            _key_from_header(job, header, i if len(jobs) > 1 else None)
        if payload_limit is not None:
            check_payload_size(
                payload_limit, job.get("variables", {}), job.get("customHeaders", {})
            )


def _key_from_header(job: schemas.CreateJob, header: str, index: int | None) -> None:
    """A job sent without ``fairnessKey`` takes the one its ``customHeaders`` name under
    ``header`` (JOBFAIR_FAIRNESS_KEY_HEADER), validated as the field is; a job sending
    both must send the same key."""
    value = job.get("customHeaders", {}).get(header)
    if value is None:
        return
    where = "customHeaders." + header if index is None else f"jobs.{index}.customHeaders.{header}"
    if not isinstance(value, str) or not FAIRNESS_KEY_RE.fullmatch(value):
        raise InvalidArgument(
            f"{where}: a fairness key must be a string matching {FAIRNESS_KEY_RE.pattern}"
        )
    sent = job.get("fairnessKey")
    if sent is not None and sent != value:
        raise InvalidArgument(f"fairnessKey {sent!r} and {where} {value!r} disagree; send one")
    job["fairnessKey"] = value


async def create_job(request: Request) -> Response:
    spec = await body(request, CREATE_JOB)
    _check_jobs(request, [spec], payload_limit(request))
    now = utcnow()
    services = context.services(request)
    with traced.create(request, [spec]):
        record, created = await services.jobs.create_one(spec, now)
    if not security.principal(request).sees(record["tenantId"], record["type"]):
        raise security.taken_out_of_scope()  # an existing job of another type: not shown
    return JSON(record, status_code=201 if created else 200)


async def create_batch(request: Request) -> Response:
    jobs = (await body(request, CREATE_BATCH))["jobs"]
    limit = request.app.state.settings.max_batch_jobs
    if len(jobs) > limit:
        raise InvalidArgument(f"jobs: at most {limit} jobs per batch, got {len(jobs)}")
    _check_jobs(request, jobs, payload_limit(request))
    now = utcnow()
    services = context.services(request)
    caller = security.principal(request)
    if caller.scoped:  # an idempotencyKey taken by a job the key may not see: nothing made
        hidden = await security.visible_jobs(request, await services.jobs.idempotent(jobs))
        if hidden:
            raise security.taken_out_of_scope()
    with traced.create(request, jobs):
        inserted = await services.jobs.create(jobs, now)
    if caller.scoped:
        # Taken between that check and the insert (a concurrent create of another type
        # under the same key): the new jobs of the batch stay, the hidden one is not shown.
        existing = [i.job_key for i in inserted if not i.created]
        if existing and await security.visible_jobs(request, existing):
            raise security.taken_out_of_scope()
    return JSON({"jobKeys": [str(i.job_key) for i in inserted]}, status_code=201)


async def activate(request: Request) -> Response:
    spec = await body(request, schemas.Activate)
    caller = HttpCaller(request)
    tenants = security.activation_tenants(caller.principal, spec.type, spec.tenantIds)
    req = ActivateRequest(spec.type, spec.maxJobs, spec.timeout, spec.worker, tenants)
    got = await traced.long_poll(request, req, caller, spec.requestTimeout)
    now = utcnow()
    return JSON({"jobs": [job_record(r, now, got.aging, spec.fetchVariables) for r in got.rows]})


async def stream(request: Request) -> Response:
    """SSE: ``event: job`` per activated job, at most ``maxJobs`` unfinished at once."""
    q = query_params(request)
    unknown = set(q) - {"type", "maxJobs", "timeout", "worker", "tenantIds", "fetchVariables"}
    if unknown:
        raise InvalidArgument(f"unknown query parameters: {', '.join(sorted(unknown))}")
    raw: dict[str, object] = {
        "type": q.get("type"),
        "maxJobs": _int_param(q.get("maxJobs"), "maxJobs"),
        "timeout": _int_param(q.get("timeout"), "timeout"),
    }
    if q.get("worker") is not None:
        raw["worker"] = q.get("worker")
    # Comma-separated; empty means none.  Every item is validated, an empty one included.
    if q.get("tenantIds"):
        raw["tenantIds"] = q["tenantIds"].split(",")
    if q.get("fetchVariables"):
        raw["fetchVariables"] = q["fetchVariables"].split(",")
    spec = validate(schemas.Activate, raw)
    principal = security.principal(request)
    tenants = security.activation_tenants(principal, spec.type, spec.tenantIds)
    req = ActivateRequest(spec.type, spec.maxJobs, spec.timeout, spec.worker, tenants)
    caller = traced.stream_caller(request, req)
    writes = caller.services.activation.stream(req, caller, spec.fetchVariables)
    return EventSourceResponse(
        _encoded(writes),
        ping=request.app.state.settings.keep_alive_s,
        ping_message_factory=keep_alive_factory(),
    )


async def _encoded(writes: AsyncGenerator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    """Each write's events as one chunk (sse-starlette sends bytes as they are), in the
    form it gives an event of its own.  Closing it closes the stream's generator at
    once, which gives back what was not written (not when the collector finds it)."""
    try:
        async for events in writes:
            yield b"".join(ServerSentEvent(**e).encode() for e in events)
    finally:
        await writes.aclose()


def _int_param(value: str | None, name: str) -> int | None:
    """A decimal integer in ASCII (``int`` alone also reads ``'١'``, ``' 1'``, ``'1_0'``)."""
    if value is None:
        return None
    if not ascii_digits(value.removeprefix("-"), 19):
        raise InvalidArgument(f"{name} must be a decimal integer, got {value!r}")
    return int(value)


async def complete_batch(request: Request) -> Response:
    spec = await body(request, schemas.CompleteBatch)
    items = []
    for item in spec.jobs:
        [variables] = payload(request, item.variables)
        items.append((job_key(item.jobKey), item.activationCount, variables))
    # Jobs out of the key's scope are answered as unknown ones, and not touched.
    hidden = await security.visible_jobs(request, [k for k, _, _ in items])
    shown = [i for i in items if i[0] not in hidden]
    with traced.finish(request, "jobfair complete", **{"jobfair.jobs": len(shown)}):
        verdicts = iter(await context.services(request).jobs.complete_many(shown, utcnow()))
    results = [(k, 404) if k in hidden else next(verdicts) for k, _, _ in items]
    return JSON({"results": [{"jobKey": str(k), "status": s} for k, s in results]})


async def get_job(request: Request, key: str) -> Response:
    k = job_key(key)
    record = await context.services(request).jobs.get(k, utcnow())
    if not security.principal(request).sees(record["tenantId"], record["type"]):
        raise security.not_found(k)
    return JSON(record)


async def cancel_job(request: Request, key: str) -> Response:
    k = job_key(key)
    await security.visible_job(request, k)
    await context.services(request).jobs.cancel(k, utcnow())
    return Response(status_code=204)


async def complete_job(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await body(request, schemas.Complete)
    await security.visible_job(request, k)
    [variables] = payload(request, spec.variables)
    with traced.finish(request, "jobfair complete", **{"jobfair.job_key": key}):
        await context.services(request).jobs.complete(k, spec.activationCount, variables)
    return Response(status_code=204)


async def fail_job(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await body(request, schemas.Fail)
    await security.visible_job(request, k)
    with traced.finish(request, "jobfair fail", **{"jobfair.job_key": key}):
        await fail(request, k, spec.activationCount, spec)
    return Response(status_code=204)


async def throw_error(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await body(request, schemas.ThrowError)
    await security.visible_job(request, k)
    count = await fenced(request, k, spec.activationCount, spec.jobLeaseToken)
    [variables] = payload(request, spec.variables)
    with traced.finish(request, "jobfair error", **{"jobfair.job_key": key}):
        await context.services(request).jobs.throw_error(
            k, count, spec.errorCode, spec.errorMessage, variables, utcnow()
        )
    return Response(status_code=204)


async def update_job(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await body(request, schemas.UpdateJob)
    cs = spec.changeset
    if cs.retries is None and cs.timeout is None and cs.priority is None:
        raise InvalidArgument("changeset must set at least one of retries, timeout, priority")
    changes = JobChanges(retries=cs.retries, timeout_ms=cs.timeout, priority=cs.priority)
    await security.visible_job(request, k)
    count = await fenced(request, k, spec.activationCount, spec.jobLeaseToken)
    await context.services(request).jobs.update(k, changes, count, utcnow())
    return Response(status_code=204)
