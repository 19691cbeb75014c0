"""Domain errors.  One handler (``app.api.problems``) turns them into problem+json."""

from __future__ import annotations


class JobfairError(Exception):
    status = 500
    type = "urn:jobfair:internal"
    title = "INTERNAL"
    # Response headers every error of the class carries (a 401's challenge).
    headers: tuple[tuple[str, str], ...] = ()

    def __init__(self, detail: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


class InvalidArgument(JobfairError):
    status = 400
    type = "urn:jobfair:invalid-argument"
    title = "INVALID_ARGUMENT"


class PayloadTooLarge(JobfairError):
    """The request's body is over the size limit (``max_body_bytes``)."""

    status = 413
    type = "urn:jobfair:payload-too-large"
    title = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(JobfairError):
    """A body sent as something other than JSON."""

    status = 415
    type = "urn:jobfair:unsupported-media-type"
    title = "UNSUPPORTED_MEDIA_TYPE"


BAD_KEY = "the API key or access token is unknown, revoked or expired"


class Unauthenticated(JobfairError):
    """No key, or one that is unknown, revoked or expired (or a token that is not ours)."""

    status = 401
    type = "urn:jobfair:unauthenticated"
    title = "UNAUTHENTICATED"
    headers = (("WWW-Authenticate", 'Bearer realm="jobfair", Basic realm="jobfair"'),)


class Forbidden(JobfairError):
    """A valid key without the right: its role's, or its tenants' and job types' scope."""

    status = 403
    type = "urn:jobfair:forbidden"
    title = "FORBIDDEN"


class TooManyRequests(JobfairError):
    """A key over its request rate, or holding as many long polls and streams as it may."""

    status = 429
    type = "urn:jobfair:too-many-requests"
    title = "TOO_MANY_REQUESTS"


class NotFound(JobfairError):
    status = 404
    type = "urn:jobfair:not-found"
    title = "NOT_FOUND"


class InvalidState(JobfairError):
    """The job is not in a state that allows the operation (cancel of an active job, ...)."""

    status = 409
    type = "urn:jobfair:invalid-state"
    title = "INVALID_STATE"


class StaleActivation(InvalidState):
    """The caller's ``activationCount`` is not the job's current activation."""

    type = "urn:jobfair:stale-activation"


class ResourceExhausted(JobfairError):
    status = 503
    type = "urn:jobfair:resource-exhausted"
    title = "RESOURCE_EXHAUSTED"


class Overloaded(ResourceExhausted):
    """The server process works on as many requests as it may at once
    (``JOBFAIR_MAX_IN_FLIGHT``, app.admission): nothing was done, send it again later."""


class StoreUnavailable(ResourceExhausted):
    """The database cannot take the call now: unreachable, restarting, out of connection
    slots, or every pooled connection busy.  The storage layer (``app.db``) raises it for
    every such failure of the driver, so nothing above it knows the driver's errors: the
    HTTP layer answers 503 with ``Retry-After``, background loops back off and retry."""


class OutcomeUnknown(StoreUnavailable):
    """The database went away while the call's changes were being committed (its COMMIT,
    or a single-statement write, had been sent and no answer came): they may or may not
    have been made.  A 503 of its own type and without ``Retry-After``: sending the call
    again is safe only if doing it twice is (an ``idempotencyKey``, an ``activationCount``
    that fences a second finish); otherwise check first (read the job)."""

    type = "urn:jobfair:outcome-unknown"
    title = "OUTCOME_UNKNOWN"
