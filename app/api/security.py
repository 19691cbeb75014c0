"""Who may call what: the one place that checks it.

Every operation of ``app.api.routes`` names a ``Permission``; ``authorize`` runs before
every route's endpoint, on the direct path (``app.api.direct``) and on FastAPI's (a
dependency of every route ``operation.include`` registers), so a route cannot forget it.
It finds the caller's key (``Authorization: Bearer``, HTTP Basic, or an OAuth access
token), checks that the key's role holds the permission, applies the key's rate limit,
and leaves the caller's ``Principal`` on the request for the endpoint, which applies
the key's tenant and job-type scope (``principal``, ``require_scope``,
``visible_job``, ``activation_tenants``).

What each role holds:

- ``admin``: every permission, over every tenant and job type;
- ``producer``: ``PRODUCE``, ``READ_JOBS``, ``READ_STATS`` (its tenants and types);
- ``worker``: ``WORK``, ``READ_JOBS``, ``READ_STATS`` (its tenants and types);
- any valid key: ``AUTHENTICATED``, ``METRICS`` and ``DOCS``;
- no key: ``PUBLIC``; also ``METRICS`` and ``DOCS`` when settings open them.

With auth off (loopback only) every caller is ``EVERYONE``.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request
from starlette.types import Scope

from app.api import context
from app.api.limits import KeyLimits
from app.errors import BAD_KEY, Forbidden, InvalidState, NotFound, Unauthenticated
from app.keys import EVERYONE, KeyService, Principal, Role

PRINCIPAL = "jobfair.principal"  # the request scope's entry authorize leaves


class Permission(enum.Enum):
    """What an operation needs (not who holds it: that is ``ROLES``)."""

    # No key: liveness, readiness, the OAuth token endpoint (it takes the key itself).
    PUBLIC = "public"
    # The API's own description: open unless settings.docs_open is false.
    DOCS = "docs"
    # The Prometheus scrape: any key, or none when settings.metrics_open.
    METRICS = "metrics"
    # Any valid key (Camunda's topology, which its clients ask first).
    AUTHENTICATED = "authenticated"
    # Create and cancel jobs.
    PRODUCE = "produce"
    # Read jobs: one by key, or Camunda's search.
    READ_JOBS = "read-jobs"
    # The fairness statistics of the key's tenants and types.
    READ_STATS = "read-stats"
    # Take and finish jobs: activate, stream, complete, fail, throw an error, extend the
    # lease (PATCH, which also sets retries and priority).
    WORK = "work"
    # Configure tenants and job types, manage keys.
    ADMIN = "admin"


ANY_KEY = frozenset({Permission.AUTHENTICATED, Permission.METRICS, Permission.DOCS})
ROLES: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.PRODUCER: ANY_KEY
    | {Permission.PRODUCE, Permission.READ_JOBS, Permission.READ_STATS, Permission.PUBLIC},
    Role.WORKER: ANY_KEY
    | {Permission.WORK, Permission.READ_JOBS, Permission.READ_STATS, Permission.PUBLIC},
}

MISSING_KEY = (
    "this operation needs an API key: send 'Authorization: Bearer <key>' "
    "(an admin makes one with `jobfair keys create --role worker` or POST /v2/keys)"
)


class Guarded(Protocol):
    """What ``authorize`` reads of an operation (``app.api.operation.Operation``)."""

    @property
    def permission(self) -> Permission: ...

    @property
    def summary(self) -> str: ...


@dataclass(slots=True)
class Gate:
    """What ``authorize`` reads, in one attribute of the app (``App.gate``, set by the
    lifespan): a worker pays for the check on every call it makes, so it is kept to a
    few attribute reads (the settings and services lookups cost more than the key's
    hash, measured in ADR 019)."""

    off: bool  # auth is off (loopback only)
    docs_open: bool
    metrics_open: bool
    keys: KeyService
    limits: KeyLimits


async def authorize(request: Request, operation: Guarded) -> None:
    """Refuse ``request`` (raise a ``JobfairError``, answered as problem+json) unless
    its caller holds ``operation.permission``; leave its ``Principal`` on it.  Called
    before the endpoint, before the body is read."""
    needed = operation.permission
    scope = request.scope
    if needed is Permission.PUBLIC:
        scope[PRINCIPAL] = EVERYONE
        return
    gate: Gate = scope["app"].gate
    if (
        gate.off
        or (needed is Permission.DOCS and gate.docs_open)
        or (needed is Permission.METRICS and gate.metrics_open)
    ):
        scope[PRINCIPAL] = EVERYONE
        return
    caller = await authenticate(scope, gate.keys)
    if needed not in ROLES[caller.role]:
        raise Forbidden(f"a {caller.role} key may not do this: {operation.summary}")
    if gate.limits.rate > 0:
        gate.limits.admit(caller)
    scope[PRINCIPAL] = caller


async def authenticate(scope: Scope, keys: KeyService) -> Principal:
    """The key the request carries, verified; ``Unauthenticated`` if none or not valid."""
    found_header: bytes | None = None
    for name, value in scope["headers"]:  # ASGI: names in lower case
        if name == b"authorization":
            if found_header is not None:  # which one counts is a proxy's guess: neither
                raise Unauthenticated("send one Authorization header, not several")
            found_header = value
    if found_header is None:
        raise Unauthenticated(MISSING_KEY)
    header = found_header.decode("latin-1")
    scheme, _, credentials = header.strip().partition(" ")
    credentials = credentials.strip()
    found: Principal | None = None
    kind = scheme.lower()
    if kind == "bearer" and credentials:
        found = await keys.verify(credentials)
    elif kind == "basic" and credentials:
        user, password = basic_credentials(credentials)
        if user is not None and password is not None:
            found = await keys.verify_basic(user, password)
    else:
        raise Unauthenticated("the Authorization header must be 'Bearer <key>' or HTTP Basic")
    if found is None:
        raise Unauthenticated(BAD_KEY)
    return found


def basic_credentials(encoded: str) -> tuple[str | None, str | None]:
    """(user, password) of an HTTP Basic credential, or (None, None) if malformed."""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None, None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else (None, None)


def principal(request: Request) -> Principal:
    """The caller ``authorize`` found (it ran before every endpoint)."""
    found: Principal = request.scope[PRINCIPAL]
    return found


# -- the key's scope, applied by the endpoints --------------------------------------------


def require_scope(caller: Principal, tenant: str, job_type: str) -> None:
    """403 unless the key may touch jobs of ``tenant`` and ``job_type`` (a request that
    names them itself: a create, an activation)."""
    if caller.tenants is not None and tenant not in caller.tenants:
        raise Forbidden(f"this key may not use tenant {tenant}")
    if caller.types is not None and job_type not in caller.types:
        raise Forbidden(f"this key may not use job type {job_type}")


def activation_tenants(
    caller: Principal, job_type: str, tenant_ids: Sequence[str] | None
) -> Sequence[str] | None:
    """The tenants an activation may draw from: those it names (403 if one is out of the
    key's scope), or all of the key's when it names none."""
    if caller.types is not None and job_type not in caller.types:
        raise Forbidden(f"this key may not use job type {job_type}")
    if caller.tenants is None:
        return tenant_ids
    if tenant_ids is None:
        return sorted(caller.tenants)
    outside = sorted(set(tenant_ids) - caller.tenants)
    if outside:
        raise Forbidden(f"this key may not use tenants {', '.join(outside)}")
    return tenant_ids


def taken_out_of_scope() -> InvalidState:
    """A create whose idempotencyKey is taken by a job outside the key's scope (another
    job type of the same tenant): refused without that job's record or key."""
    return InvalidState("idempotencyKey is taken by a job this key may not see")


def not_found(job_key: int) -> NotFound:
    """What a job out of the key's scope answers: the same as a job that does not exist."""
    return NotFound(f"job {job_key} does not exist")


async def visible_job(request: Request, job_key: int) -> None:
    """404 unless the job is in the caller's scope (or does not exist: then the operation
    answers its own 404)."""
    caller = principal(request)
    if not caller.scoped:
        return
    keys: KeyService = request.scope["app"].gate.keys
    found = keys.known_scope(job_key)  # the jobs this process activated: no read
    if found is None:
        found = (await keys.job_scopes([job_key])).get(job_key)
    if found is not None and not caller.sees(*found):
        raise not_found(job_key)


async def visible_jobs(request: Request, job_keys: Sequence[int]) -> set[int]:
    """Those of ``job_keys`` out of the caller's scope (answered as unknown jobs)."""
    caller = principal(request)
    if not caller.scoped:
        return set()
    scopes = await context.services(request).keys.job_scopes(job_keys)
    return {k for k, s in scopes.items() if not caller.sees(*s)}


# -- abuse bounds per key -------------------------------------------------------------------
