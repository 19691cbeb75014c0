"""Jobfair's problem+json answers as exceptions a caller can branch on."""

from __future__ import annotations

from typing import Any


class JobfairError(Exception):
    """Anything that went wrong talking to Jobfair."""


class ProblemError(JobfairError):
    """An RFC 9457 problem answer: ``status``, ``type`` (stable per kind), ``detail``."""

    def __init__(self, status: int, body: dict[str, Any], retry_after_s: float | None = None):
        self.status = status
        self.type: str = str(body.get("type", "about:blank"))
        self.title: str = str(body.get("title", ""))
        self.detail: str = str(body.get("detail", ""))
        self.instance: str = str(body.get("instance", ""))
        self.retry_after_s = retry_after_s
        super().__init__(f"{status} {self.title}: {self.detail}")


class InvalidArgument(ProblemError):
    """400: the request was malformed or out of range; nothing changed."""


class Unauthorized(ProblemError):
    """401: missing or invalid API key."""


class Forbidden(ProblemError):
    """403: the key may not touch this tenant, job type or operation."""


class NotFound(ProblemError):
    """404: no such job (or tenant, or job type)."""


class Conflict(ProblemError):
    """409: the job is not in a state that allows this (already finished, not activated)."""


class StaleActivation(Conflict):
    """409 ``urn:jobfair:stale-activation``: this worker's activation is no longer current."""


class ResourceExhausted(ProblemError):
    """503 (or 429): back pressure, or the database unavailable; nothing was changed:
    retry after ``retry_after_s``."""


class OutcomeUnknown(ProblemError):
    """503 ``urn:jobfair:outcome-unknown``: the server lost its database while the call's
    changes were being committed; they may or may not have been made.  The client sends
    the call again only when sending it twice is harmless (reads, finish calls, creations
    with an idempotency key); otherwise this reaches the caller, who should check (read
    the job) before creating it again.  Not a ``ResourceExhausted``: code that retries
    those must not retry this blindly."""


OUTCOME_UNKNOWN = "urn:jobfair:outcome-unknown"

_BY_STATUS: dict[int, type[ProblemError]] = {
    400: InvalidArgument,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: ResourceExhausted,
    503: ResourceExhausted,
}


def problem(status: int, body: Any, retry_after: str | None) -> ProblemError:
    if not isinstance(body, dict):
        body = {"title": "HTTP_ERROR", "detail": str(body)[:500]}
    kind = _BY_STATUS.get(status, ProblemError)
    if status == 409 and body.get("type") == "urn:jobfair:stale-activation":
        kind = StaleActivation
    if status == 503 and body.get("type") == OUTCOME_UNKNOWN:
        kind = OutcomeUnknown
    seconds = None
    if retry_after is not None:
        try:
            seconds = max(0.0, float(retry_after))
        except ValueError:
            seconds = None
    return kind(status, body, seconds)
