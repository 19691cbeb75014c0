"""Request bodies, exactly as API.md writes them.  Unknown fields are rejected."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, NotRequired, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    with_config,
)
from typing_extensions import TypedDict

from app.domain import (
    DEFAULT_PRIORITY,
    DEFAULT_RETRIES,
    DEFAULT_TENANT,
    JOB_TYPE_RE,
    MAX_ACTIVATE_JOBS,
    MAX_COMPLETE_BATCH,
    MAX_LEASE_MS,
    TENANT_ID_RE,
)

Int = Annotated[int, Field(strict=True)]
TENANT_ID_PATTERN = TENANT_ID_RE.pattern
JOB_TYPE_PATTERN = JOB_TYPE_RE.pattern
TenantId = Annotated[str, StringConstraints(pattern=TENANT_ID_PATTERN)]
JobType = Annotated[str, StringConstraints(pattern=JOB_TYPE_PATTERN)]
Priority = Annotated[int, Field(strict=True, ge=0, le=100)]
Retries = Annotated[int, Field(strict=True, ge=0, le=1_000_000)]
LeaseMs = Annotated[int, Field(strict=True, ge=1, le=MAX_LEASE_MS)]
BackoffMs = Annotated[int, Field(strict=True, ge=0, le=MAX_LEASE_MS * 365)]
ActivationCount = Annotated[int, Field(strict=True, ge=0)]
JobKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,19}$")]
ShortText = Annotated[str, StringConstraints(max_length=10_000)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _instant(v: str) -> str:
    """An RFC 3339 instant with a zone, respelled as Python's isoformat: the one
    spelling both this server and PostgreSQL read the same way."""
    try:
        parsed = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError("runAt must be an RFC 3339 instant, e.g. 2026-11-30T02:18:41Z") from exc
    if parsed.tzinfo is None:
        raise ValueError("runAt must carry a time zone (use Z for UTC)")
    return parsed.isoformat()


def _defaults_to(value: int | str | dict[str, Any]) -> Any:
    """A TypedDict field has no default; the store fills it in.  Documented here."""
    return Field(json_schema_extra={"default": value})


# A job as producers send it, validated but kept as the client spelled it: a dict, not a
# model, because a 10,000-job batch validates three times faster that way, and the store
# hands it to PostgreSQL as it is (store.INSERT_JOBS fills in the defaults).
@with_config(ConfigDict(extra="forbid"))
class CreateJob(TypedDict):
    type: JobType
    tenantId: NotRequired[Annotated[TenantId, _defaults_to(DEFAULT_TENANT)]]
    priority: NotRequired[Annotated[Priority, _defaults_to(DEFAULT_PRIORITY)]]
    retries: NotRequired[Annotated[Retries, _defaults_to(DEFAULT_RETRIES)]]
    variables: NotRequired[Annotated[dict[str, Any], _defaults_to({})]]
    customHeaders: NotRequired[Annotated[dict[str, Any], _defaults_to({})]]
    runAt: NotRequired[Annotated[str, AfterValidator(_instant)] | None]
    delay: NotRequired[Annotated[int, Field(strict=True, ge=0, le=MAX_LEASE_MS * 3650)] | None]
    idempotencyKey: NotRequired[
        Annotated[str, StringConstraints(min_length=1, max_length=255)] | None
    ]


@with_config(ConfigDict(extra="forbid"))
class CreateBatch(TypedDict):
    jobs: Annotated[list[CreateJob], Field(min_length=1)]


class Activate(Strict):
    type: JobType
    maxJobs: Annotated[int, Field(strict=True, ge=1, le=MAX_ACTIVATE_JOBS)]
    timeout: LeaseMs
    worker: Annotated[str, StringConstraints(max_length=128)] | None = None
    requestTimeout: Int | None = None
    tenantIds: Annotated[list[TenantId], Field(min_length=1, max_length=1000)] | None = None
    fetchVariables: list[Annotated[str, StringConstraints(max_length=1000)]] | None = None


class Complete(Strict):
    activationCount: ActivationCount
    variables: dict[str, Any] | None = None


class Fail(Strict):
    activationCount: ActivationCount
    retries: Retries | None = None
    errorMessage: ShortText | None = None
    retryBackOff: BackoffMs = 0
    variables: dict[str, Any] | None = None


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
    jobLeaseToken: str | None = None
    operationReference: Int | None = None
    errorCode: Annotated[str, StringConstraints(min_length=1, max_length=1000)]
    errorMessage: ShortText | None = None
    variables: dict[str, Any] | None = None


class CompleteItem(Strict):
    jobKey: JobKey
    activationCount: ActivationCount
    variables: dict[str, Any] | None = None


class CompleteBatch(Strict):
    jobs: Annotated[list[CompleteItem], Field(min_length=1, max_length=MAX_COMPLETE_BATCH)]


class Changeset(Strict):
    retries: Retries | None = None
    timeout: LeaseMs | None = None
    priority: Priority | None = None


class UpdateJob(Strict):
    changeset: Changeset
    activationCount: ActivationCount | None = None
    jobLeaseToken: str | None = None
    operationReference: Int | None = None


class PutTenant(Strict):
    weight: Annotated[int, Field(strict=True, ge=1, le=10_000)] = 1
    maxActiveJobs: Annotated[int, Field(strict=True, ge=0)] | None = None


class PutJobType(Strict):
    maxActiveJobs: Annotated[int, Field(strict=True, ge=0)] | None = None
    agingIntervalMs: Annotated[int, Field(strict=True, ge=1, le=MAX_LEASE_MS * 365)] | None = None
    agingStep: Annotated[int, Field(strict=True, ge=0, le=100)] | None = None
