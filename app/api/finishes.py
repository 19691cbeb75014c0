"""What the finish endpoints of both surfaces (native and Camunda's) share: the failure,
and the fence a lease token or an activationCount gives."""

from __future__ import annotations

from fastapi import Request

from app.api import context, schemas
from app.api.parsing import fence, payload
from app.domain import utcnow
from app.errors import StaleActivation


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
