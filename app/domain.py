"""Job records as clients see them, and the limits API.md sets on input."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from app.scheduler import Aging, effective_priority

DEFAULT_TENANT = "<default>"
# A job sent without a fairnessKey has its tenant's default key, spelled so outside and
# stored as '' (app.db.schema: jobs.fairness_key).
DEFAULT_KEY = "<default>"
DEFAULT_PRIORITY = 50
DEFAULT_RETRIES = 3
MAX_LEASE_MS = 86_400_000
MAX_REQUEST_TIMEOUT_MS = 3_600_000  # a long poll holds a request at most an hour
MAX_ACTIVATE_JOBS = 1000
MAX_COMPLETE_BATCH = 1000

# Match with ``fullmatch``: ``$`` alone also matches before a final newline.
TENANT_ID_RE = re.compile(r"^(<default>|[A-Za-z0-9_.-]{1,31})$")
JOB_TYPE_RE = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")
# Tenant ids' characters and ':' and '@' (an end user's address, "org:42"), up to 128; no
# '/', so that a key is one segment of a path (/v2/tenants/{t}/keys/{k}).
FAIRNESS_KEY_RE = re.compile(r"^(<default>|[A-Za-z0-9_.:@-]{1,128})$")


def stored_key(fairness_key: str | None) -> str:
    """A fairness key as stored: '' for the default key (absent or ``<default>``)."""
    return "" if fairness_key is None or fairness_key == DEFAULT_KEY else fairness_key


def shown_key(stored: str) -> str:
    """A stored fairness key as clients see it."""
    return stored or DEFAULT_KEY


class JobState(StrEnum):
    """A job's state as stored.  ``SCHEDULED`` is internal: a job whose runAt (or retry
    back-off) is still ahead, shown to clients as CREATED (``public_state``)."""

    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    ACTIVATED = "ACTIVATED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    ERROR_THROWN = "ERROR_THROWN"
    CANCELED = "CANCELED"


# States a job leaves only if an operator asks (FAILED, revived by PATCH retries > 0) or
# never; retention deletes them (prune_terminal, in app/db/sql/maintenance.sql, spells the
# same set).
TERMINAL_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.ERROR_THROWN, JobState.CANCELED}
)
# Terminal states nothing revives: a job in one of them is finished for good.
FINISHED_STATES = TERMINAL_STATES - {JobState.FAILED}


def utcnow() -> datetime:
    return datetime.now(UTC)


def rfc3339(value: datetime | None) -> str | None:
    """``2026-11-30T05:35:58.405Z``.  Memoised: the jobs of one batch share their
    timestamps (activated together, created together), and formatting five per job was a
    fifth of the server's time when activating 100 jobs at a time."""
    return None if value is None else _rfc3339(value)


@functools.lru_cache(maxsize=4096)
def _rfc3339(value: datetime) -> str:
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.isoformat(timespec="milliseconds")[:-6] + "Z"


def public_state(state: JobState) -> JobState:
    """``SCHEDULED`` is internal: a delayed job is CREATED to everyone outside."""
    return JobState.CREATED if state is JobState.SCHEDULED else state


def visible_variables(
    variables: dict[str, Any], fetch_variables: Sequence[str] | None
) -> dict[str, Any]:
    """Only the named variables when the worker asked for some (fetchVariables)."""
    if not fetch_variables:
        return variables
    return {k: v for k, v in variables.items() if k in fetch_variables}


class StoredJobFields(Protocol):
    """What a job record is rendered from: a job as stored (``app.db.rows.JobRow``)."""

    @property
    def job_key(self) -> int: ...
    @property
    def job_type(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def state(self) -> JobState: ...
    @property
    def priority(self) -> int: ...
    @property
    def retries(self) -> int: ...
    @property
    def activation_count(self) -> int: ...
    @property
    def worker(self) -> str | None: ...
    @property
    def deadline(self) -> datetime | None: ...
    @property
    def run_at(self) -> datetime: ...
    @property
    def queued_at(self) -> datetime: ...
    @property
    def variables(self) -> dict[str, Any]: ...
    @property
    def custom_headers(self) -> dict[str, Any]: ...
    @property
    def error_code(self) -> str | None: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def activated_at(self) -> datetime | None: ...
    @property
    def completed_at(self) -> datetime | None: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def fairness_key(self) -> str: ...
    @property
    def cost(self) -> float: ...


def job_record(
    row: StoredJobFields,
    now: datetime,
    aging: Aging,
    fetch_variables: Sequence[str] | None = None,
) -> dict[str, Any]:
    state = public_state(row.state)
    variables = visible_variables(row.variables, fetch_variables)
    if state is JobState.CREATED:
        eff = effective_priority(row.priority, row.queued_at, now, aging)
    elif row.activated_at is not None:
        # What its (latest) pick used: the claim aged it by the same formula at its own
        # clock, the one that stamped activated_at.
        eff = effective_priority(row.priority, row.queued_at, row.activated_at, aging)
    else:
        eff = row.priority
    return {
        "jobKey": str(row.job_key),
        "type": row.job_type,
        "tenantId": row.tenant_id,
        "fairnessKey": row.fairness_key or DEFAULT_KEY,
        "state": state,
        "priority": row.priority,
        "effectivePriority": eff,
        "retries": row.retries,
        "activationCount": row.activation_count,
        "worker": row.worker,
        "deadline": rfc3339(row.deadline),
        "runAt": rfc3339(row.run_at),
        "variables": variables,
        "customHeaders": row.custom_headers,
        "errorCode": row.error_code,
        "errorMessage": row.error_message,
        "createdAt": rfc3339(row.created_at),
        "activatedAt": rfc3339(row.activated_at),
        # completed_at is when it reached any final state: shown as finishedAt, and as
        # completedAt only when it completed (a FAILED job was not completed).
        "completedAt": rfc3339(row.completed_at) if state is JobState.COMPLETED else None,
        "finishedAt": rfc3339(row.completed_at),
        "idempotencyKey": row.idempotency_key,
        "cost": row.cost,
    }


def tenant_of(job: Mapping[str, Any]) -> str:
    """A job to insert's tenant (INSERT_JOBS fills the same default in SQL)."""
    tenant: str = job.get("tenantId", DEFAULT_TENANT)
    return tenant


# -- what the job browser selects (the store's listing and bulk statements read these) --


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What ``GET /v2/jobs`` (and the bulk operations) select: each None means any.
    ``tenant_scope`` / ``type_scope``: the caller's key's tenants and types (None: all)."""

    job_type: str | None = None
    tenant_id: str | None = None
    states: frozenset[JobState] | None = None  # public states (CREATED covers delayed)
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    tenant_scope: frozenset[str] | None = None
    type_scope: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class FailedFilter:
    tenant_id: str | None
    job_type: str | None
    created_after: datetime | None
    created_before: datetime | None
