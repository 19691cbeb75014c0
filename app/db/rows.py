"""What the storage modules answer: typed rows, never records read by position.

Rows that travel on the hot path (a job, a claim) are built positionally from records
whose columns the statements list in field order (``JOB_COLUMNS``): one constructor call
per row.  The others are built by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from app.domain import JobState
from app.scheduler import FairnessBy

# The columns of a job record, in JobRow's field order: every statement that answers
# jobs selects or returns exactly these, so that JobRow(*record) builds the row.
JOB_COLUMNS = """job_key, job_type, tenant_id, state, priority, retries, activation_count,
    worker, deadline, run_at, queued_at, variables, custom_headers, error_code,
    error_message, created_at, activated_at, completed_at, idempotency_key, fairness_key,
    cost, charged, lane_charge, key_charge"""
JOB_FIELDS = 24


def job_columns(alias: str) -> str:
    """JOB_COLUMNS of the table aliased ``alias``."""
    return ", ".join(f"{alias}.{c.strip()}" for c in JOB_COLUMNS.split(","))


class JobRow(NamedTuple):
    """A job as stored.  A named tuple: one is built per job on the hot path, and a
    frozen dataclass of 19 fields took three times as long to build."""

    job_key: int
    job_type: str
    tenant_id: str
    state: JobState
    priority: int
    retries: int
    activation_count: int
    worker: str | None
    deadline: datetime | None
    run_at: datetime
    queued_at: datetime
    variables: dict[str, Any]
    custom_headers: dict[str, Any]
    error_code: str | None
    error_message: str | None
    created_at: datetime
    activated_at: datetime | None
    completed_at: datetime | None
    idempotency_key: str | None
    fairness_key: str  # '': the tenant's default key (DEFAULT_KEY outside)
    cost: float = 1.0  # what it declares it costs (ADR 029)
    # The worker-time estimate its current activation was charged (None: its type is not
    # fair by worker time), settled when the lease ends; and the virtual time it added to
    # the lane and to the key (charged / the weights at activation, alembic 0013).
    charged: float | None = None
    lane_charge: float | None = None
    key_charge: float | None = None


_STATES = {state.value: state for state in JobState}


def job_row(values: Any, at: int = 0) -> JobRow:
    """The JobRow in ``values`` (a record or tuple) from column ``at`` on."""
    v = tuple(values)[at : at + JOB_FIELDS]
    return JobRow(v[0], v[1], v[2], _STATES[v[3]], *v[4:])


class Inserted(NamedTuple):
    job_key: int
    created: bool


class Claimed(NamedTuple):
    """A job a claim activated, and the index (1-based) of the request share it went to."""

    share: int
    job: JobRow


class JobFence(NamedTuple):
    """What a finish is judged by: the job's state and current activation."""

    job_key: int
    state: JobState
    activation_count: int


class ExpiredLease(NamedTuple):
    """A job whose lease ran out, back to CREATED: the activation it was at, and whose."""

    job_key: int
    job_type: str
    tenant_id: str
    activation_count: int
    worker: str | None
    activated_at: datetime | None = None
    fairness_key: str = ""
    charged: float | None = None  # as Ended's: the worker-time estimate to settle
    lane_charge: float | None = None
    key_charge: float | None = None


class Ended(NamedTuple):
    """A job a finish or release changed, the state it left it in, and when it had been
    activated (for the metrics' processing time); and, for the settlement of a charge by
    worker time (ADR 029), its fairness key and what its activation was charged (None:
    nothing to settle)."""

    job_key: int
    job_type: str
    tenant_id: str
    state: JobState
    activated_at: datetime | None
    fairness_key: str = ""
    charged: float | None = None
    # The virtual time that estimate added to its lane and its key (charged / weight
    # when it was activated; None: a server before alembic 0013 activated it): what its
    # settlement takes back, whatever the weights are now.
    lane_charge: float | None = None
    key_charge: float | None = None


@dataclass(frozen=True, slots=True)
class TypeConfig:
    """A job type's configuration; None where it leaves a setting to the server."""

    max_active_jobs: int | None
    aging_interval_ms: int | None
    aging_step: int | None
    rate_limited: bool = False  # the type has a token bucket (ADR 028)
    fairness_by: FairnessBy = FairnessBy.ACTIVATIONS  # what its lanes are charged by (ADR 029)
    # Every fairness key's ACTIVATED jobs of the type at most (ADR 040); None: no cap.
    max_active_per_key: int | None = None
    # Each key's jobs one at a time, in key order (keyOrdering "fifo", ADR 041).
    key_fifo: bool = False
    # Some tenant has a minimum: lane reads read the lanes below theirs too (ADR 042).
    minimums: bool = False


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job with its type's aging settings, so a record renders in one round trip."""

    job: JobRow
    type_config: TypeConfig


@dataclass(frozen=True, slots=True)
class LaneRow:
    tenant_id: str
    vtime: float
    weight: int
    max_active_jobs: int | None
    rate_limited: bool = False  # its tenant has a token bucket (ADR 028)
    # Its estimate of a job's lease seconds (ADR 029; None: none of its jobs finished yet).
    unit_est: float | None = None
    # Its tenant's minimum, where the tenant was found below it (ADR 042); else None.
    min_active_jobs: int | None = None


@dataclass(frozen=True, slots=True)
class KeyRead:
    """What a key read found of the lanes a round allotted picks to: per tenant, up to
    the number of keys asked for that have a ready job, in (vtime, key) order, each as
    (key, vtime, weight); the active keys met without one (to be parked), as (tenant,
    key); and the tenants whose read stopped at its limit (``more``: there may be ready
    keys beyond) -- for the others, every active key not excluded was seen.  A ready key
    comes as (key, vtime, weight, its own cap or None)."""

    ready: dict[str, list[tuple[str, float, int, int | None]]]  # and the key's cap
    empty: list[tuple[str, str]]
    more: set[str]


@dataclass(frozen=True, slots=True)
class LaneRead:
    """What a lane read found: the type's configuration; up to ``limit`` lanes with a
    ready job, in (vtime, tenant) order; the active lanes met that have none (to be
    parked); and whether there may be ready lanes beyond those read (``more``: the scan
    stopped at a ready lane past ``limit``, or at SCANNED_LANES) -- when not, every
    active lane not excluded was seen."""

    config: TypeConfig
    ready: list[LaneRow]
    empty: list[str]
    more: bool
    paused: bool = False  # the job type is paused: nothing may be claimed
    # The keys the charges carried emptied (tenant, key), to be parked.
    emptied_keys: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LeadClaim:
    """What a one-pick claim got: the job (None if nothing), its lane's and its key's
    weights and its type's aging as the statement resolved them; and, when it got
    nothing, whether that is because the type is dry for the asker's tenants (else the
    full rounds are needed)."""

    job: JobRow | None
    lane_weight: int | None
    key_weight: int | None
    aging_step: int | None
    aging_interval_ms: int | None
    dry: bool
    fairness_by: FairnessBy = FairnessBy.ACTIVATIONS  # its type's (ADR 029)


class TenantRow(NamedTuple):
    tenant_id: str
    weight: int
    max_active_jobs: int | None
    paused: bool
    rate_per_s: float | None  # None: no rate limit (then the other rate_ fields are too)
    rate_burst: float | None
    rate_tokens: float | None  # the bucket: its tokens at rate_at (ADR 028)
    rate_at: datetime | None
    read_at: datetime  # the database's clock when the row was read
    min_active_jobs: int | None = None  # its guaranteed minimum (ADR 042); None: none


class JobTypeRow(NamedTuple):
    job_type: str
    max_active_jobs: int | None
    aging_interval_ms: int | None
    aging_step: int | None
    paused: bool
    rate_per_s: float | None  # None: no rate limit (then the other rate_ fields are too)
    rate_burst: float | None
    rate_tokens: float | None  # the bucket: its tokens at rate_at (ADR 028)
    rate_at: datetime | None
    read_at: datetime  # the database's clock when the row was read
    fairness_by: str | None = None  # None: by activations (ADR 029)
    max_active_per_key: int | None = None  # None: no per-key cap (ADR 040)
    key_ordering: str | None = None  # 'fifo': one at a time per key, in order (ADR 041)


class LaneSampleRow(NamedTuple):
    """A lane as the share window samples it (``lane_samples``, app/db/sql/metrics.sql)."""

    job_type: str
    tenant_id: str
    activated_total: int
    active: bool
    held: bool
    vtime: float
    weight: int
    units_total: float = 0.0
    fairness_by: str | None = None  # its type's (None: by activations)
    held_count: int = 0  # the holds claims made of it at its tenant's cap (alembic 0015)


class KeySampleRow(NamedTuple):
    """A fairness key as the key window samples it (``key_samples``, app/db/sql/metrics.sql), with
    its lane's sums."""

    job_type: str
    tenant_id: str
    fairness_key: str  # as stored ('': the default key)
    activated_total: int
    active: bool
    vtime: float
    weight: int
    lane_total: int
    backlogged_weight: int
    least_vtime: float | None
    units_total: float = 0.0
    lane_units: float = 0.0


class TenantSet(NamedTuple):
    """Tenants labelled by name in the metrics, from ``effective_at`` on."""

    effective_at: datetime
    tenants: frozenset[str]


@dataclass(frozen=True, slots=True)
class LaneStats:
    """One lane's counts for ``GET /v2/stats`` (see ``stats`` in app/db/sql/operators.sql)."""

    job_type: str
    tenant_id: str
    ready: int
    delayed: int
    active: int
    oldest_ready_at: datetime | None
    oldest_ready_key: int | None
    tenant_cap: int | None
    type_cap: int | None
    tenant_active: int | None
    tenant_paused: bool = False
    type_paused: bool = False

    @classmethod
    def of(cls, r: Mapping[str, Any]) -> LaneStats:
        return cls(
            r["job_type"],
            r["tenant_id"],
            r["ready"],
            r["delayed"],
            r["active"],
            r["oldest_ready_at"],
            r["oldest_ready_key"],
            r["tenant_cap"],
            r["type_cap"],
            r["tenant_active"],
            r["tenant_paused"],
            r["type_paused"],
        )


class KeyRow(NamedTuple):
    """An API key as stored (``app.db.key_rows``): never its secret, only the secret's hash."""

    key_id: str
    secret_sha256: bytes
    role: str
    tenants: list[str] | None  # None: every tenant
    job_types: list[str] | None  # None: every job type
    name: str | None
    expires_at: datetime | None
    created_at: datetime
    created_by: str | None
    last_used_at: datetime | None
    revoked_at: datetime | None


class WorkerRow(NamedTuple):
    """A worker name seen asking for jobs of a type (``app.db.worker_rows``)."""

    job_type: str
    worker: str
    last_seen_at: datetime
    last_activated_at: datetime | None
