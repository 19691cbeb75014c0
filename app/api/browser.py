"""A job browser's endpoints: the listing, a job's history, bulk retry and cancel, the
workers seen; routed by ``app.api.routes``."""

from __future__ import annotations

import re

from fastapi import Request
from starlette.responses import Response

from app.api import context, schemas, security
from app.api.parsing import ascii_digits, body, job_key, query_params, validate
from app.api.problems import JSON
from app.browser import history_record, parse_instant
from app.domain import JOB_TYPE_RE, TENANT_ID_RE, FailedFilter, JobFilter, JobState, rfc3339, utcnow
from app.errors import InvalidArgument
from app.keys import audit

DEFAULT_PAGE = 100
MAX_PAGE = 1000
# The states the listing answers in (a delayed job is CREATED).
LISTED = tuple(s for s in JobState if s is not JobState.SCHEDULED)
LIST_PARAMS = {"type", "tenantId", "state", "createdAfter", "createdBefore", "limit", "cursor"}


class _Instants(schemas.Strict):
    """The listing's instants, validated as the bodies' are (schemas.instant)."""

    createdAfter: schemas.CreatedAfter | None = None
    createdBefore: schemas.CreatedBefore | None = None


def _states(raw: str) -> frozenset[JobState]:
    names = raw.split(",")
    wrong = [n for n in names if n not in {s.value for s in LISTED}]
    if wrong:
        raise InvalidArgument(
            f"state: {wrong[0]!r} is not one of {', '.join(s.value for s in LISTED)} "
            "(comma-separated)"
        )
    return frozenset(JobState(n) for n in names)


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_PAGE
    if not ascii_digits(raw, 4) or not 1 <= int(raw) <= MAX_PAGE:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_PAGE}, got {raw!r}")
    return int(raw)


def _name(q: dict[str, str], name: str, rule: re.Pattern[str]) -> str | None:
    """Query parameter ``name``, which must match ``rule`` if given."""
    value = q.get(name)
    if value is not None and not rule.fullmatch(value):
        raise InvalidArgument(f"{name} {value!r} must match {rule.pattern}")
    return value


async def list_jobs(request: Request) -> Response:
    q = query_params(request)
    unknown = set(q) - LIST_PARAMS
    if unknown:
        raise InvalidArgument(f"unknown query parameters: {', '.join(sorted(unknown))}")
    instants = validate(_Instants, {k: q[k] for k in ("createdAfter", "createdBefore") if k in q})
    caller = security.principal(request)
    f = JobFilter(
        job_type=_name(q, "type", JOB_TYPE_RE),
        tenant_id=_name(q, "tenantId", TENANT_ID_RE),
        states=None if "state" not in q else _states(q["state"]),
        created_after=parse_instant(instants.createdAfter),
        created_before=parse_instant(instants.createdBefore),
        tenant_scope=caller.tenants,
        type_scope=caller.types,
    )
    cursor = q.get("cursor")
    page = await context.services(request).browser.list_jobs(f, cursor, _limit(q.get("limit")))
    return JSON({"items": page.items, "nextCursor": page.next_cursor})


async def job_history(request: Request, key: str) -> Response:
    k = job_key(key)
    found = await context.services(request).browser.history(k)
    if not security.principal(request).sees(found.tenant_id, found.job_type):
        raise security.not_found(k)
    return JSON(history_record(found))


async def explain_job(request: Request, key: str) -> Response:
    k = job_key(key)
    explainer = context.services(request).explain
    caller = security.principal(request)
    job = await explainer.job(k)
    if not caller.sees(job.tenant_id, job.job_type):
        raise security.not_found(k)
    return JSON(await explainer.explain(job, utcnow(), caller.sees if caller.scoped else None))


def _by(request: Request) -> str:
    return security.principal(request).key_id or "-"


async def retry_jobs(request: Request) -> Response:
    spec = await body(request, schemas.RetryJobs)
    f = FailedFilter(
        spec.tenantId,
        spec.type,
        parse_instant(spec.createdAfter),
        parse_instant(spec.createdBefore),
    )
    browser = context.services(request).browser
    if spec.dryRun:
        count, more = await browser.count_failed(f, spec.limit)
        return JSON({"count": count, "more": more})
    count, more = await browser.retry_failed(f, spec.retries, spec.limit)
    audit.info(
        "bulk retry: %d FAILED jobs revived (type=%s tenantId=%s createdAfter=%s "
        "createdBefore=%s retries=%d) more=%s by=%s",
        count,
        spec.type,
        spec.tenantId,
        spec.createdAfter,
        spec.createdBefore,
        spec.retries,
        more,
        _by(request),
    )
    return JSON({"count": count, "more": more})


async def cancel_jobs(request: Request) -> Response:
    spec = await body(request, schemas.CancelJobs)
    browser = context.services(request).browser
    count, more = await browser.cancel_created(spec.tenantId, spec.type, spec.limit)
    audit.info(
        "bulk cancel: %d CREATED jobs canceled (tenantId=%s type=%s) more=%s by=%s",
        count,
        spec.tenantId,
        spec.type,
        more,
        _by(request),
    )
    return JSON({"count": count, "more": more})


async def list_workers(request: Request) -> Response:
    q = query_params(request)
    unknown = set(q) - {"type"}
    if unknown:
        raise InvalidArgument(f"unknown query parameters: {', '.join(sorted(unknown))}")
    job_type = _name(q, "type", JOB_TYPE_RE)
    rows = await context.services(request).workers.recent(utcnow(), job_type)
    return JSON(
        {
            "items": [
                {
                    "type": r.job_type,
                    "worker": r.worker,
                    "lastSeenAt": rfc3339(r.last_seen_at),
                    "lastActivatedAt": rfc3339(r.last_activated_at),
                }
                for r in rows
            ]
        }
    )
