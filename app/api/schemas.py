"""Request bodies, exactly as API.md writes them.  Unknown fields are rejected."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, NotRequired, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    with_config,
)
from pydantic.json_schema import JsonDict
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from app.api import faithful
from app.domain import (
    DEFAULT_KEY,
    DEFAULT_PRIORITY,
    DEFAULT_RETRIES,
    DEFAULT_TENANT,
    FAIRNESS_KEY_RE,
    JOB_TYPE_RE,
    MAX_ACTIVATE_JOBS,
    MAX_COMPLETE_BATCH,
    MAX_LEASE_MS,
    MAX_REQUEST_TIMEOUT_MS,
    TENANT_ID_RE,
)

# -- numbers: every integer bounded by what its column (or its use) holds -----------------

INT32_MAX = (1 << 31) - 1  # an int4 column
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def _json_integer(value: object) -> object:
    """A JSON number, left to pydantic's int validation: 58 and 58.0 alike (JSON and JSON
    Schema do not tell them apart), 58.5, NaN and 1e400 refused there.  A string or a
    boolean is not a number, whatever it spells."""
    if type(value) is int or type(value) is float:
        return value
    raise PydanticCustomError("int_type", "Input should be a valid integer")


JsonInteger = BeforeValidator(_json_integer)


def _json_number(value: object) -> object:
    """A JSON number, left to pydantic's float validation (NaN and infinities refused
    there): a string or a boolean is not a number, whatever it spells."""
    if type(value) is int or type(value) is float:
        return value
    raise PydanticCustomError("float_type", "Input should be a valid number")


JsonNumber = BeforeValidator(_json_number)
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), JsonInteger]
Priority = Annotated[int, Field(ge=0, le=100), JsonInteger]
Retries = Annotated[int, Field(ge=0, le=1_000_000), JsonInteger]
LeaseMs = Annotated[int, Field(ge=1, le=MAX_LEASE_MS), JsonInteger]
BackoffMs = Annotated[int, Field(ge=0, le=MAX_LEASE_MS * 365), JsonInteger]
# What a job declares it costs (ADR 029): charged to its lane when its type is fair by
# cost.  Bounded so that a lane's virtual time stays a meaningful float8.
MIN_COST, MAX_COST = 1e-6, 1e9
Cost = Annotated[
    float,
    Field(ge=MIN_COST, le=MAX_COST, allow_inf_nan=False),
    JsonNumber,
]
DelayMs = Annotated[int, Field(ge=0, le=MAX_LEASE_MS * 3650), JsonInteger]
ActivationCount = Annotated[int, Field(ge=0, le=INT32_MAX), JsonInteger]
MaxActiveJobs = Annotated[int, Field(ge=0, le=INT32_MAX), JsonInteger]
MaxJobs = Annotated[int, Field(ge=1, le=MAX_ACTIVATE_JOBS), JsonInteger]
# 0: the server's default; negative: answer at once.
RequestTimeoutMs = Annotated[int, Field(ge=INT64_MIN, le=MAX_REQUEST_TIMEOUT_MS), JsonInteger]

# -- strings: none may hold NUL, which PostgreSQL cannot store in text or jsonb ------------
# (Lone surrogates cannot arrive: the JSON parser refuses them, and paths and query
# strings decode invalid UTF-8 to U+FFFD.  A pattern fails on them anyway.)

NO_NUL = faithful.NO_NUL


def _decimal_at_most(bound: int) -> str:
    """A regular expression for the decimal strings of 0..``bound`` (leading zeros too)
    of as many digits as ``bound`` at most: exact, so that the document says what the
    server takes."""
    digits = str(bound)
    shorter = f"[0-9]{{1,{len(digits) - 1}}}"
    longest = [
        f"{digits[:i]}[0-{int(d) - 1}][0-9]{{{len(digits) - i - 1}}}"
        for i, d in enumerate(digits)
        if d != "0"
    ]
    return "^(" + "|".join([shorter, *longest, digits]) + ")$"


JOB_KEY_PATTERN = _decimal_at_most(INT64_MAX)
TENANT_ID_PATTERN = TENANT_ID_RE.pattern
JOB_TYPE_PATTERN = JOB_TYPE_RE.pattern
TenantId = Annotated[str, StringConstraints(strict=True, pattern=TENANT_ID_PATTERN)]
FAIRNESS_KEY_PATTERN = FAIRNESS_KEY_RE.pattern
FairnessKey = Annotated[str, StringConstraints(strict=True, pattern=FAIRNESS_KEY_PATTERN)]
JobType = Annotated[str, StringConstraints(strict=True, pattern=JOB_TYPE_PATTERN)]
JobKey = Annotated[str, StringConstraints(strict=True, pattern=JOB_KEY_PATTERN)]
ShortText = Annotated[str, StringConstraints(strict=True, max_length=10_000, pattern=NO_NUL)]
Worker = Annotated[str, StringConstraints(strict=True, max_length=128, pattern=NO_NUL)]
ErrorCode = Annotated[
    str, StringConstraints(strict=True, min_length=1, max_length=1000, pattern=NO_NUL)
]
IdempotencyKey = Annotated[
    str, StringConstraints(strict=True, min_length=1, max_length=255, pattern=NO_NUL)
]
VariableName = Annotated[str, StringConstraints(strict=True, max_length=1000, pattern=NO_NUL)]
LeaseToken = Annotated[str, StringConstraints(strict=True, max_length=1000, pattern=NO_NUL)]

# -- free-form values: stored as sent, or refused naming the path (``faithful``) ---------

# Stands for the JsonValue schema (openapi.py's), put in its place when the document is
# built: pydantic resolves a "$ref" it did not make, and finds none.
JSON_VALUE_REF = {"x-jobfair-json-value": True}
# The first and last days of the calendar are refused, in any zone: an offset can move
# them out of it in UTC (9999-12-31T23:59:59-14:00), and a schema cannot say "in UTC".
EDGE_DAYS = ("0001-01-01", "9999-12-31")
INSTANT_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "pattern": f"^(?!{'|'.join(EDGE_DAYS)})",
}
JsonObject = Annotated[
    dict[str, Any],
    AfterValidator(faithful.check),
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": JSON_VALUE_REF,
        }
    ),
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# RFC 3339's date-time, in ASCII digits (Python's own parser takes more: week dates,
# hours without minutes, any separator, digits of any script).
RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def instant(name: str) -> Callable[[str], str]:
    """A validator of the field ``name``: an RFC 3339 instant, respelled in UTC as
    Python's isoformat: the one spelling both this server and PostgreSQL read the same
    way.  Moved to UTC here, so that an instant beyond the calendar there
    (9999-12-31T23:59:59-14:00) is refused here."""

    def check(v: str) -> str:
        if not RFC3339.fullmatch(v):
            raise ValueError(f"{name} must be an RFC 3339 instant, e.g. 2026-11-30T02:18:41Z")
        if v.startswith(EDGE_DAYS):
            raise ValueError(f"{name} must lie between 0001-01-02 and 9999-12-30")
        try:
            parsed = datetime.fromisoformat(v.upper().replace("Z", "+00:00"))
            return parsed.astimezone(UTC).isoformat()
        except ValueError as exc:  # a 13th month, a 61st second
            raise ValueError(f"{name} is not a valid instant: {exc}") from None
        except OverflowError:
            raise ValueError(f"{name} must lie between the years 1 and 9999 in UTC") from None

    return check


_instant = instant("runAt")


def _defaults_to(value: int | str | dict[str, Any]) -> Any:
    """A TypedDict field has no default; the store fills it in.  Documented here."""
    return Field(json_schema_extra={"default": value})


# A job as producers send it, validated but kept as the client spelled it: a dict, not a
# model, because a large batch validates several times faster that way (ADR 007), and the store
# hands it to PostgreSQL as it is (app.db.job_rows.INSERT_JOBS fills in the defaults).
# runAt or delay, not both (a null one is absent).
NOT_BOTH: JsonDict = {
    "not": {
        "required": ["runAt", "delay"],
        "properties": {"runAt": {"type": "string"}, "delay": {"type": "number"}},
    }
}


@with_config(ConfigDict(extra="forbid", json_schema_extra=NOT_BOTH))
class CreateJob(TypedDict):
    type: JobType
    tenantId: NotRequired[Annotated[TenantId, _defaults_to(DEFAULT_TENANT)]]
    fairnessKey: NotRequired[Annotated[FairnessKey, _defaults_to(DEFAULT_KEY)]]
    cost: NotRequired[Annotated[Cost, _defaults_to(1)]]
    priority: NotRequired[Annotated[Priority, _defaults_to(DEFAULT_PRIORITY)]]
    retries: NotRequired[Annotated[Retries, _defaults_to(DEFAULT_RETRIES)]]
    variables: NotRequired[Annotated[JsonObject, _defaults_to({})]]
    customHeaders: NotRequired[Annotated[JsonObject, _defaults_to({})]]
    runAt: NotRequired[
        Annotated[str, AfterValidator(_instant), WithJsonSchema(INSTANT_SCHEMA)] | None
    ]
    delay: NotRequired[DelayMs | None]
    idempotencyKey: NotRequired[IdempotencyKey | None]


@with_config(ConfigDict(extra="forbid"))
class CreateBatch(TypedDict):
    jobs: Annotated[list[CreateJob], Field(min_length=1)]


class Activate(Strict):
    type: JobType
    maxJobs: MaxJobs
    timeout: LeaseMs
    worker: Worker | None = None
    requestTimeout: RequestTimeoutMs | None = None
    tenantIds: Annotated[list[TenantId], Field(min_length=1, max_length=1000)] | None = None
    fetchVariables: list[VariableName] | None = None


class Complete(Strict):
    activationCount: ActivationCount
    variables: JsonObject | None = None


class Fail(Strict):
    activationCount: ActivationCount
    retries: Retries | None = None
    errorMessage: ShortText | None = None
    retryBackOff: BackoffMs = 0
    variables: JsonObject | None = None


class FailFields(Protocol):
    """What a failure carries on either surface (``Fail`` here, ``CamundaFail``)."""

    @property
    def retries(self) -> int | None: ...
    @property
    def errorMessage(self) -> str | None: ...
    @property
    def retryBackOff(self) -> int: ...
    @property
    def variables(self) -> dict[str, Any] | None: ...


class ThrowError(Strict):
    activationCount: ActivationCount | None = None
    jobLeaseToken: LeaseToken | None = None
    operationReference: Int64 | None = None
    errorCode: ErrorCode
    errorMessage: ShortText | None = None
    variables: JsonObject | None = None


class CompleteItem(Strict):
    jobKey: JobKey
    activationCount: ActivationCount
    variables: JsonObject | None = None


class CompleteBatch(Strict):
    jobs: Annotated[list[CompleteItem], Field(min_length=1, max_length=MAX_COMPLETE_BATCH)]


class Changeset(Strict):
    # At least one of them, and not null (the route says so too).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [f], "properties": {f: {"type": "integer"}}}
                for f in ("retries", "timeout", "priority")
            ]
        }
    )

    retries: Retries | None = None
    timeout: LeaseMs | None = None
    priority: Priority | None = None


class UpdateJob(Strict):
    changeset: Changeset
    activationCount: ActivationCount | None = None
    jobLeaseToken: LeaseToken | None = None
    operationReference: Int64 | None = None


# At least one activation in 1,000 s; at most a million a second or at once: past that a
# limit limits nothing a server gives.
MIN_RATE_PER_S = 0.001
MAX_RATE = 1_000_000


class RateLimit(Strict):
    """A token bucket (ADR 028): ``perSecond`` activations a second on average, up to
    ``burst`` at once."""

    perSecond: Annotated[
        float, Field(ge=MIN_RATE_PER_S, le=MAX_RATE, allow_inf_nan=False), JsonNumber
    ]
    burst: Annotated[float, Field(ge=1, le=MAX_RATE, allow_inf_nan=False), JsonNumber]


class PutTenant(Strict):
    weight: Annotated[int, Field(ge=1, le=10_000), JsonInteger] = 1
    maxActiveJobs: MaxActiveJobs | None = None
    # Its guaranteed minimum (ADR 042), at most maxActiveJobs; None or absent: none.
    minActiveJobs: MaxActiveJobs | None = None
    # None or absent: no limit (a PUT sets the whole configuration, as maxActiveJobs).
    rateLimit: RateLimit | None = None


class PutKey(Strict):
    weight: Annotated[int, Field(ge=1, le=10_000), JsonInteger] = 1
    # The key's ACTIVATED jobs of every type at most (ADR 040); None or absent: no cap.
    maxActiveJobs: MaxActiveJobs | None = None


class PutJobType(Strict):
    maxActiveJobs: MaxActiveJobs | None = None
    agingIntervalMs: Annotated[int, Field(ge=1, le=INT32_MAX), JsonInteger] | None = None
    agingStep: Annotated[int, Field(ge=0, le=100), JsonInteger] | None = None
    rateLimit: RateLimit | None = None
    # What its lanes are charged by (ADR 029); None or absent: by activations.
    fairnessBy: Literal["activations", "workerTime", "cost"] | None = None
    # Every fairness key's ACTIVATED jobs of the type at most (ADR 040); None: no cap.
    maxActivePerKey: Annotated[int, Field(ge=1, le=INT32_MAX), JsonInteger] | None = None
    # "fifo": each fairness key's jobs one at a time in creation order (ADR 041); None or
    # absent: by priority, as many at a time as the caps allow.
    keyOrdering: Literal["fifo"] | None = None


# -- operators' bulk operations ------------------------------------------------------------

MAX_BULK = 100_000
DEFAULT_BULK = 10_000


CreatedAfter = Annotated[
    str, AfterValidator(instant("createdAfter")), WithJsonSchema(INSTANT_SCHEMA)
]
CreatedBefore = Annotated[
    str, AfterValidator(instant("createdBefore")), WithJsonSchema(INSTANT_SCHEMA)
]
BulkLimit = Annotated[int, Field(ge=1, le=MAX_BULK), JsonInteger]


class RetryJobs(Strict):
    """Revive FAILED jobs matching every filter given (none: every FAILED job)."""

    type: JobType | None = None
    tenantId: TenantId | None = None
    createdAfter: CreatedAfter | None = None
    createdBefore: CreatedBefore | None = None
    retries: Annotated[int, Field(ge=1, le=1_000_000), JsonInteger] = 1
    limit: BulkLimit = DEFAULT_BULK
    # Count what would be revived (up to limit), change nothing: what a confirmation says.
    dryRun: Annotated[bool, Field(strict=True)] = False


class CancelJobs(Strict):
    """Cancel a tenant's CREATED jobs (delayed ones too), of one type if given."""

    tenantId: TenantId
    type: JobType | None = None
    limit: BulkLimit = DEFAULT_BULK
