"""Native job endpoints (API.md "Producers" and "Workers"), routed by ``app.api.routes``."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from fastapi import Request
from pydantic import TypeAdapter
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from app.activation import ActivateRequest
from app.api import context, schemas, security
from app.api.parsing import (
    ascii_digits,
    body,
    check_payload_size,
    fence,
    job_key,
    payload,
    payload_limit,
    query_params,
    validate,
)
from app.api.problems import JSON
from app.db import jobs as stored
from app.db.jobs import tenant_of
from app.db.rows import JobRow
from app.domain import FAIRNESS_KEY_RE, job_record, utcnow
from app.errors import InvalidArgument, ResourceExhausted, StaleActivation, Unauthenticated
from app.jobs import JobChanges
from app.streaming import Stream, keep_alive_factory

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
        hidden = await security.visible_jobs(request, await stored.idempotent(services.db, jobs))
        if hidden:
            raise security.taken_out_of_scope()
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
    services = context.services(request)
    tenants = security.activation_tenants(security.principal(request), spec.type, spec.tenantIds)
    req = ActivateRequest(spec.type, spec.maxJobs, spec.timeout, spec.worker, tenants)
    rows = await long_poll(request, req, spec.requestTimeout)
    now = utcnow()
    aging = await services.activation.recent_aging(spec.type)
    jobs = [job_record(r, now, aging, spec.fetchVariables) for r in rows]
    return JSON({"jobs": jobs})


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
    services = context.services(request)
    if services.streams.shutdown.is_set():
        raise ResourceExhausted("the server is shutting down", retry_after_s=1)
    services.waiters.admit()  # every waiter place taken: 503 now, not an error after the 200
    request.app.admission.leave(request.scope)  # a waiter from now on, not work in flight
    caller = security.principal(request)
    tenants = security.activation_tenants(caller, spec.type, spec.tenantIds)
    req = ActivateRequest(spec.type, spec.maxJobs, spec.timeout, spec.worker, tenants)
    held = services.limits.waiter(caller)
    held.__enter__()  # left when the stream ends (the response's events, below)
    sightings = services.workers
    sightings.seen(req.job_type, req.worker, utcnow(), False)
    remember = services.keys.remember if caller.scoped else None

    def on_jobs(rows: Sequence[JobRow]) -> None:
        sightings.seen(req.job_type, req.worker, utcnow(), True)
        if remember is not None:
            remember(rows)

    s = Stream(
        req,
        services.waiters,
        services.streams,
        services.db,
        services.activation,
        check_ms=request.app.state.settings.backup_poll_ms,
        fetch_variables=spec.fetchVariables,
        is_disconnected=request.is_disconnected,
        on_jobs=on_jobs,
        allowed=None
        if caller.key_id is None
        else functools.partial(services.keys.still_live, caller),
    )
    return EventSourceResponse(
        _holding(s.events(), held),
        ping=request.app.state.settings.keep_alive_s,
        ping_message_factory=keep_alive_factory(),
    )


async def _holding(
    events: AsyncIterator[dict[str, Any]], held: AbstractContextManager[None]
) -> AsyncIterator[dict[str, Any]]:
    """``events``, with the key's waiter place ``held`` given back when they end."""
    try:
        async for event in events:
            yield event
    finally:
        held.__exit__(None, None, None)


def _int_param(value: str | None, name: str) -> int | None:
    """A decimal integer in ASCII (``int`` alone also reads ``'١'``, ``' 1'``, ``'1_0'``)."""
    if value is None:
        return None
    if not ascii_digits(value.removeprefix("-"), 19):
        raise InvalidArgument(f"{name} must be a decimal integer, got {value!r}")
    return int(value)


async def long_poll(
    request: Request, req: ActivateRequest, request_timeout_ms: int | None
) -> list[JobRow]:
    """Activate, waiting up to ``requestTimeout`` (0/absent: the server default, negative:
    no wait) for at least one job.  Jobs activated for a client that is gone by then are
    given back at once rather than left to their lease timeout."""
    settings = request.app.state.settings
    wait_ms = min(
        request_timeout_ms or settings.default_request_timeout_ms, settings.long_poll_cap_ms
    )
    services = context.services(request)
    caller = security.principal(request)
    gone = asyncio.Event()
    with services.limits.waiter(caller):
        watcher = asyncio.create_task(watch_disconnect(request, gone))
        try:
            rows: list[JobRow] = await services.waiters.long_poll(
                req,
                max(0, wait_ms) / 1000,
                gone,
                # Waiting is not work in flight (app.admission).
                on_wait=functools.partial(request.app.admission.leave, request.scope),
            )
        finally:
            watcher.cancel()
    services.workers.seen(req.job_type, req.worker, utcnow(), bool(rows))
    if gone.is_set() and rows:
        await services.waiters.release(rows)
        return []
    if rows and not await services.keys.still_live(caller):  # revoked while it waited
        await services.waiters.release(rows)
        raise Unauthenticated(security.BAD_KEY)
    if caller.scoped:
        services.keys.remember(rows)
    return rows


async def watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    """The body is read, so the next ASGI message is the client going away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


async def complete_batch(request: Request) -> Response:
    spec = await body(request, schemas.CompleteBatch)
    items = []
    for item in spec.jobs:
        [variables] = payload(request, item.variables)
        items.append((job_key(item.jobKey), item.activationCount, variables))
    # Jobs out of the key's scope are answered as unknown ones, and not touched.
    hidden = await security.visible_jobs(request, [k for k, _, _ in items])
    shown = [i for i in items if i[0] not in hidden]
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
    await context.services(request).jobs.complete(k, spec.activationCount, variables)
    return Response(status_code=204)


async def fail_job(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await body(request, schemas.Fail)
    await security.visible_job(request, k)
    await fail(request, k, spec.activationCount, spec)
    return Response(status_code=204)


async def fail(request: Request, key: int, count: int | None, spec: schemas.FailFields) -> None:
    """A failure from either surface (they differ in the fence and the default retries)."""
    [variables] = payload(request, spec.variables)
    await context.services(request).jobs.fail(
        key,
        count,
        retries=spec.retries,
        error_message=spec.errorMessage,
        retry_backoff_ms=spec.retryBackOff,
        variables=variables,
        now=utcnow(),
    )


async def fenced(
    request: Request, key: int, activation_count: int | None, token: str | None
) -> int | None:
    """``parsing.fence``; a token that holds no lease of a job that does not exist is
    answered as the unknown job it names (404)."""
    try:
        return fence(key, activation_count, token)
    except StaleActivation:
        await context.services(request).jobs.get(key, utcnow())
        raise


async def throw_error(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await body(request, schemas.ThrowError)
    await security.visible_job(request, k)
    count = await fenced(request, k, spec.activationCount, spec.jobLeaseToken)
    [variables] = payload(request, spec.variables)
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
