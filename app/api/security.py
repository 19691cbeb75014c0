"""What each operation needs from its caller, and the one place that checks it.

Every operation of ``app.api.routes`` names a ``Permission``; ``authorize`` is called
before every route's endpoint, on the direct path (``app.api.direct``) and on FastAPI's
(a dependency of every route ``routes.include`` registers).  It allows everything for
now: API keys and their roles come next, and change this function only.

The roles to come, and the permissions each will hold:

- ``admin``: all of them;
- ``producer``: ``PRODUCE`` and ``READ_JOBS``, for the jobs of its tenants;
- ``worker``: ``WORK``, for the jobs of its tenants and types;
- no key: ``PUBLIC`` only.
"""

from __future__ import annotations

import enum
from typing import Protocol

from starlette.requests import Request


class Permission(enum.Enum):
    """What an operation needs (not who holds it: that is the roles', above)."""

    # No key: liveness, readiness, the metrics scrape, the API's own description.
    PUBLIC = "public"
    # Create and cancel jobs.
    PRODUCE = "produce"
    # Read jobs: one by key, or Camunda's search.
    READ_JOBS = "read-jobs"
    # Take and finish jobs: activate, stream, complete, fail, throw an error, extend the
    # lease (PATCH, which also sets retries and priority).
    WORK = "work"
    # Configure tenants and job types, read the fairness statistics.
    ADMIN = "admin"


class Guarded(Protocol):
    """What ``authorize`` reads of an operation (``app.api.routes.Operation``)."""

    @property
    def permission(self) -> Permission: ...


async def authorize(request: Request, operation: Guarded) -> None:
    """Refuse ``request`` (raise a ``JobfairError``, answered as problem+json) unless
    its caller holds ``operation.permission``.  Called before the endpoint, before the
    body is read.  Today every caller holds every permission."""
