"""The schema, declared once.  Alembic migrates it; tests prove the two agree.

Table layout (ADR 002): one ``jobs`` table whose *partial* indexes are the queues.  A job
is in the ready index only while it is ``CREATED``; delayed jobs wait in ``SCHEDULED``
(shown to clients as ``CREATED``) until the promoter moves them in, so the claim never
walks over rows it cannot take.  ``lanes`` holds the stride scheduler's virtual time per
(job type, tenant).  Both carry the tenant's shard (app.shards; docs/scaling.md).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from app.domain import JobState

metadata = MetaData()

# Camunda's keys start at partition 1's base (1 << 51) + 1, and so does this sequence.
# A key is jobfair_job_key(shard, nextval) = nextval << 11 | shard (app.shards, alembic
# 0008), so the sequence stops where that would pass 2**63.
job_key_seq = Sequence(
    "job_key_seq",
    start=2251799813685249,
    maxvalue=(1 << 52) - 1,
    # One key at a time (alembic 0019): keys in the order creates draw them, whichever
    # session draws them (FIFO keys are in job-key order, ADR 041).
    cache=1,
    metadata=metadata,
)

# Every JobState, in the order the migrations wrote the CHECK constraint (SCHEDULED: a
# job whose runAt or retry back-off is still ahead).
JOB_STATES = (
    JobState.SCHEDULED,
    JobState.CREATED,
    JobState.ACTIVATED,
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.ERROR_THROWN,
    JobState.CANCELED,
)
assert set(JOB_STATES) == set(JobState)

jobs = Table(
    "jobs",
    metadata,
    # Made by jobfair_job_key from the tenant's shard (no default could know it).
    Column("job_key", BigInteger, job_key_seq, nullable=False),
    # The tenant's shard, named by the key's low bits too: the distribution column of a
    # distributed database (docs/scaling.md), in every unique index.  Jobs made before
    # alembic 0008 keep their keys, and the shard those name.
    Column("shard", SmallInteger, nullable=False),
    Column("job_type", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("retries", Integer, nullable=False),
    Column("activation_count", Integer, nullable=False, server_default=text("0")),
    Column("worker", Text),
    Column("deadline", DateTime(timezone=True)),
    Column("run_at", DateTime(timezone=True), nullable=False),
    # When the job joined the ready queue at its priority: FIFO order and the aging clock.
    Column("queued_at", DateTime(timezone=True), nullable=False),
    Column("variables", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("custom_headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("error_code", Text),
    Column("error_message", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("activated_at", DateTime(timezone=True)),
    Column("completed_at", DateTime(timezone=True)),
    Column("idempotency_key", Text),
    # Activated for an SSE stream: finishing it returns a credit (NOTIFY jobfair_done).
    Column("via_stream", Boolean, nullable=False, server_default=text("false")),
    # The job's fairness key inside its tenant ('': the tenant's default key, shown as
    # <default>); its lane's share is divided among its keys (alembic 0010, ADR 027).
    Column("fairness_key", Text, nullable=False, server_default=text("''")),
    # What the job declares it costs: charged to its lane when its type is fair by cost
    # (alembic 0012, ADR 029).
    Column("cost", Double, nullable=False, server_default=text("1")),
    # The worker-time estimate its current activation was charged, settled against the
    # time its lease was held when it ends; NULL unless its type is fair by worker time.
    Column("charged", Double),
    # The virtual time that estimate added to its lane and its key (alembic 0013): what
    # its settlement takes back, whatever the weights are by then.
    Column("lane_charge", Double),
    Column("key_charge", Double),
    CheckConstraint("cost > 0 AND cost < 'Infinity'", name="jobs_cost_check"),
    CheckConstraint(
        "state IN (" + ", ".join(f"'{s}'" for s in JOB_STATES) + ")", name="jobs_state_check"
    ),
    CheckConstraint("priority BETWEEN 0 AND 100", name="jobs_priority_check"),
    CheckConstraint("retries >= 0", name="jobs_retries_check"),
    CheckConstraint("(state = 'ACTIVATED') = (deadline IS NOT NULL)", name="jobs_deadline_check"),
    CheckConstraint("shard = (job_key & 2047)", name="jobs_shard_check"),
    PrimaryKeyConstraint("job_key", "shard", name="jobs_pkey"),
    # Dead tuples are the cost of a queue table: vacuum it early and often.
    postgresql_with={
        "autovacuum_vacuum_scale_factor": "0.01",
        "autovacuum_vacuum_insert_scale_factor": "0.05",
        "autovacuum_analyze_scale_factor": "0.02",
        "fillfactor": "90",
    },
)

# The ready queue: one lane's jobs by key, each key's best first.  Every claim walks only
# the heads of a lane's keys here.
Index(
    "jobs_ready_idx",
    jobs.c.job_type,
    jobs.c.tenant_id,
    jobs.c.fairness_key,
    jobs.c.priority.desc(),
    jobs.c.queued_at,
    jobs.c.job_key,
    postgresql_where=text("state = 'CREATED'"),
)
# Delayed jobs, by the instant they become due (the promoter's scan).
Index("jobs_scheduled_idx", jobs.c.run_at, postgresql_where=text("state = 'SCHEDULED'"))
# Leases, by expiry (the lease sweeper's scan).
Index("jobs_lease_idx", jobs.c.deadline, postgresql_where=text("state = 'ACTIVATED'"))
# Active counts bounded by a cap: "count at most maxActiveJobs rows" reads only these.
Index("jobs_active_tenant_idx", jobs.c.tenant_id, postgresql_where=text("state = 'ACTIVATED'"))
Index("jobs_active_type_idx", jobs.c.job_type, postgresql_where=text("state = 'ACTIVATED'"))
# A fairness key's ACTIVATED jobs, of every type and of one (the key caps' counts,
# jobfair_lock_and_count_keys; alembic 0016).  Built CONCURRENTLY after the migrations
# (app.migrations.CONCURRENT).
Index(
    "jobs_active_key_idx",
    jobs.c.tenant_id,
    jobs.c.fairness_key,
    jobs.c.job_type,
    postgresql_where=text("state = 'ACTIVATED'"),
)
# Each fairness key's jobs waiting (FAILED ones included: an incident blocks its key), in
# key order: the first is the key's head when its type is FIFO and none of its jobs is
# ACTIVATED (alembic 0017, ADR 041).  ACTIVATED jobs are left out: the per-key count
# finds them (jobs_active_key_idx), and an activation then adds no entry here.  Built
# CONCURRENTLY after the migrations (app.migrations.CONCURRENT).
Index(
    "jobs_waiting_key_idx",
    jobs.c.job_type,
    jobs.c.tenant_id,
    jobs.c.fairness_key,
    jobs.c.job_key,
    # Spelled IS TRUE so that only the statements that spell it so are planned on it.
    postgresql_where=text("(state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE"),
)
# Terminal jobs by age, for retention.
Index(
    "jobs_terminal_idx",
    jobs.c.completed_at,
    postgresql_where=text("state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED')"),
)
# The listing (``GET /v2/jobs``) of a tenant's finished jobs: by tenant, then state, in
# key order (alembic 0007).  A job enters it once, as it finishes.  None by type: types
# are few and dense, and the key index finds a page of one soon (ADR 023).
TERMINAL = text("state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED')")
Index(
    "jobs_done_tenant_idx",
    jobs.c.tenant_id,
    jobs.c.state,
    jobs.c.job_key,
    postgresql_where=TERMINAL,
)
# Incidents by key, whatever their tenant or type (few: an entry per FAILED job).
Index("jobs_failed_idx", jobs.c.job_key, postgresql_where=text("state = 'FAILED'"))
Index(
    "jobs_idempotency_idx",
    jobs.c.tenant_id,
    jobs.c.idempotency_key,
    jobs.c.shard,
    unique=True,
    postgresql_where=text("idempotency_key IS NOT NULL"),
)

lanes = Table(
    "lanes",
    metadata,
    Column("job_type", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    # jobfair_shard(tenant_id): as jobs.shard.
    Column("shard", SmallInteger, nullable=False),
    # Stride scheduling's virtual time: +1/weight per activation.
    Column("vtime", Double, nullable=False, server_default=text("0")),
    # True while the lane may hold ready jobs; see app/db/lanes.py for the no-lost-wake-up protocol.
    Column("active", Boolean, nullable=False, server_default=text("true")),
    # True while the lane's tenant is at its cap: lane reads skip it until capacity frees
    # (app/db/lanes.py: hold_lanes, jobfair_release_holds; ADR 016).
    Column("held", Boolean, nullable=False, server_default=text("false")),
    Column("activated_total", BigInteger, nullable=False, server_default=text("0")),
    # The lane's estimate of its next job's lease seconds (fair by worker time: alembic
    # 0012, ADR 029), an exponentially weighted mean of its jobs' held times; NULL until
    # one finished.
    Column("unit_est", Double),
    # What the lane was served in its type's units (alembic 0013, ADR 029): by cost its
    # jobs' costs, by worker time its ended leases' seconds; what realised shares of
    # such types are measured in.
    Column("units_total", Double, nullable=False, server_default=text("0")),
    # How many times a claim held the lane at its tenant's cap (alembic 0015): the stats
    # see a hold between two samples by it moving (app.shares).
    Column("held_count", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("job_type", "tenant_id", "shard", name="lanes_pkey"),
    CheckConstraint("shard = jobfair_shard(tenant_id)", name="lanes_shard_check"),
    postgresql_with={
        "autovacuum_vacuum_scale_factor": "0",
        "autovacuum_vacuum_threshold": "500",
        "fillfactor": "50",
    },
)
# Backlogged lanes not held, by virtual time (the activator's read), and min/max vtime per
# type.
Index(
    "lanes_type_vtime_idx",
    lanes.c.job_type,
    lanes.c.active,
    lanes.c.held,
    lanes.c.vtime,
    lanes.c.tenant_id,
)
# Held lanes by tenant, for releasing them when the tenant's capacity frees.
Index("lanes_held_idx", lanes.c.tenant_id, postgresql_where=text("held"))

# The second level (ADR 027): each lane's fairness keys, with the key's virtual time
# inside its lane.  ``active`` is kept as the lane's is (app/db/lanes.py: the protocol,
# on the lane's bucket lock); ``held`` as the lane's, for keys at their caps.
lane_keys = Table(
    "lane_keys",
    metadata,
    Column("job_type", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("fairness_key", Text, nullable=False),
    # jobfair_shard(tenant_id): beside its lane.
    Column("shard", SmallInteger, nullable=False),
    # Stride scheduling inside the lane: +1/key weight per activation.
    Column("vtime", Double, nullable=False, server_default=text("0")),
    # True while the key may hold ready jobs.
    Column("active", Boolean, nullable=False, server_default=text("true")),
    Column("activated_total", BigInteger, nullable=False, server_default=text("0")),
    # As lanes.units_total, for the key.
    Column("units_total", Double, nullable=False, server_default=text("0")),
    # True while the key is at its cap (alembic 0016): held out of the key reads until a
    # finish frees room (jobfair_release_key_holds), as a lane at its tenant's cap is.
    Column("held", Boolean, nullable=False, server_default=text("false")),
    PrimaryKeyConstraint("job_type", "tenant_id", "fairness_key", "shard", name="lane_keys_pkey"),
    CheckConstraint("shard = jobfair_shard(tenant_id)", name="lane_keys_shard_check"),
    postgresql_with={
        "autovacuum_vacuum_scale_factor": "0",
        "autovacuum_vacuum_threshold": "500",
        "fillfactor": "50",
    },
)
# A lane's backlogged keys by virtual time (the key read), and its least and greatest.
Index(
    "lane_keys_vtime_idx",
    lane_keys.c.job_type,
    lane_keys.c.tenant_id,
    lane_keys.c.active,
    lane_keys.c.vtime,
    lane_keys.c.fairness_key,
)

# The held keys (alembic 0016), built CONCURRENTLY after the migrations.
Index("lane_keys_held_idx", lane_keys.c.job_type, postgresql_where=text("held"))

# Weights of fairness keys inside their tenant (PUT /v2/tenants/{t}/keys/{k}); a key
# without a row weighs 1.  Beside the tenant's lanes and keys (its shard).
key_weights = Table(
    "key_weights",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("fairness_key", Text, nullable=False),
    Column("shard", SmallInteger, nullable=False),
    Column("weight", Integer, nullable=False),
    # The key's ACTIVATED jobs of every type at most (alembic 0016); NULL: no cap.
    Column("max_active_jobs", Integer),
    PrimaryKeyConstraint("tenant_id", "fairness_key", "shard", name="key_weights_pkey"),
    CheckConstraint("weight BETWEEN 1 AND 10000", name="key_weights_weight_check"),
    CheckConstraint("max_active_jobs >= 0", name="key_weights_max_active_jobs_check"),
    CheckConstraint("shard = jobfair_shard(tenant_id)", name="key_weights_shard_check"),
)

# Whether any key has a cap of its own (alembic 0016; every finish asks), built
# CONCURRENTLY after the migrations.
Index(
    "key_weights_capped_idx",
    key_weights.c.tenant_id,
    postgresql_where=text("max_active_jobs IS NOT NULL"),
)

tenants = Table(
    "tenants",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("weight", Integer, nullable=False, server_default=text("1")),
    Column("max_active_jobs", Integer),
    # Paused: its lanes are held out of the reads until it is resumed (app.db.operating).
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    # A token bucket (alembic 0011, ADR 028): the tenant's activations, of every job
    # type, limited to rate_per_s a second with a burst of rate_burst; rate_tokens at
    # rate_at, written by the claims that take them.  All NULL: no limit.
    Column("rate_per_s", Double),
    Column("rate_burst", Double),
    Column("rate_tokens", Double),
    Column("rate_at", DateTime(timezone=True)),
    # Its guaranteed minimum (alembic 0018, ADR 042): while it has fewer ACTIVATED jobs,
    # its lanes with ready jobs are served before the weighted share, up to it.  NULL:
    # none.
    Column("min_active_jobs", Integer),
    CheckConstraint("weight BETWEEN 1 AND 10000", name="tenants_weight_check"),
    CheckConstraint("max_active_jobs >= 0", name="tenants_max_active_jobs_check"),
    CheckConstraint("min_active_jobs >= 0", name="tenants_min_active_jobs_check"),
    CheckConstraint("min_active_jobs <= max_active_jobs", name="tenants_min_within_max_check"),
    CheckConstraint(
        "(rate_per_s IS NULL AND rate_burst IS NULL AND rate_tokens IS NULL"
        "  AND rate_at IS NULL)"
        " OR (rate_per_s > 0 AND rate_burst >= 1 AND rate_tokens IS NOT NULL"
        "     AND rate_at IS NOT NULL)",
        name="tenants_rate_check",
    ),
)

# The tenants with a minimum (ADR 042).  Built CONCURRENTLY after the migrations.
Index(
    "tenants_min_idx",
    tenants.c.tenant_id,
    postgresql_where=text("min_active_jobs > 0"),
)

job_types = Table(
    "job_types",
    metadata,
    Column("job_type", Text, primary_key=True),
    Column("max_active_jobs", Integer),
    Column("aging_interval_ms", Integer),
    Column("aging_step", Integer),
    # Paused: no activation gives a job of the type until it is resumed.
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    # A token bucket (alembic 0011, ADR 028): the type's activations, of every tenant,
    # limited to rate_per_s a second with a burst of rate_burst; rate_tokens at rate_at,
    # written by the claims that take them.  All NULL: no limit.
    Column("rate_per_s", Double),
    Column("rate_burst", Double),
    Column("rate_tokens", Double),
    Column("rate_at", DateTime(timezone=True)),
    # What its lanes are charged by (alembic 0012, ADR 029): NULL by activations,
    # 'cost' by the jobs' declared cost, 'workerTime' by the seconds their leases held.
    Column("fairness_by", Text),
    # Every fairness key's ACTIVATED jobs of the type at most (alembic 0016); NULL: none.
    Column("max_active_per_key", Integer),
    # 'fifo': each fairness key's jobs activated one at a time in key order (alembic
    # 0017, ADR 041); NULL: by priority, as many at a time as the caps allow.
    Column("key_ordering", Text),
    CheckConstraint("max_active_jobs >= 0", name="job_types_max_active_jobs_check"),
    CheckConstraint("max_active_per_key >= 1", name="job_types_max_active_per_key_check"),
    CheckConstraint("fairness_by IN ('cost', 'workerTime')", name="job_types_fairness_by_check"),
    CheckConstraint("key_ordering IN ('fifo')", name="job_types_key_ordering_check"),
    CheckConstraint("aging_interval_ms > 0", name="job_types_aging_interval_check"),
    CheckConstraint("aging_step BETWEEN 0 AND 100", name="job_types_aging_step_check"),
    CheckConstraint(
        "(rate_per_s IS NULL AND rate_burst IS NULL AND rate_tokens IS NULL"
        "  AND rate_at IS NULL)"
        " OR (rate_per_s > 0 AND rate_burst >= 1 AND rate_tokens IS NOT NULL"
        "     AND rate_at IS NOT NULL)",
        name="job_types_rate_check",
    ),
)

# A job's attempt history (app.db.history): a row per ended activation (its start,
# worker and lease, how and when it ended), per revive and per cancel, written by the
# statement that makes the transition.  Keyed by the activation it belongs to and its
# step (1: the activation's end, 2: revived, 3: canceled); no foreign key (retention
# deletes a job's rows with it).  The job's creation and its running activation are
# read from the job itself.
EVENTS = (
    "completed",
    "failed",
    "retried",
    "error-thrown",
    "lease-expired",
    "released",
    "revived",
    "canceled",
)
job_events = Table(
    "job_events",
    metadata,
    Column("job_key", BigInteger, nullable=False),
    Column("activation_count", Integer, nullable=False),
    Column("step", SmallInteger, nullable=False),
    # The job's shard (its key's), as jobs.shard: a job's history lives beside it.
    Column("shard", SmallInteger, nullable=False),
    Column("event", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True)),
    Column("worker", Text),
    Column("deadline", DateTime(timezone=True)),
    Column("retries", Integer),
    Column("error_code", Text),
    Column("error_message", Text),
    CheckConstraint(
        "event IN (" + ", ".join(f"'{e}'" for e in EVENTS) + ")", name="job_events_event_check"
    ),
    CheckConstraint("step BETWEEN 1 AND 3", name="job_events_step_check"),
    CheckConstraint("shard = (job_key & 2047)", name="job_events_shard_check"),
    PrimaryKeyConstraint("job_key", "activation_count", "step", "shard", name="job_events_pkey"),
    postgresql_with={
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_vacuum_insert_scale_factor": "0.05",
    },
)

# Worker names seen activating each job type (app.workers), upserted in batches.
workers = Table(
    "workers",
    metadata,
    Column("job_type", Text, primary_key=True),
    Column("worker", Text, primary_key=True),
    Column("last_seen_at", DateTime(timezone=True), nullable=False),
    Column("last_activated_at", DateTime(timezone=True)),
)

# API keys (app.keys): the secret is stored only as its SHA-256 (ADR 019); tenants and
# job_types NULL mean every one.  A revoked key keeps its row, for the audit trail.
api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("secret_sha256", LargeBinary, nullable=False),
    Column("role", Text, nullable=False),
    Column("tenants", ARRAY(Text)),
    Column("job_types", ARRAY(Text)),
    Column("name", Text),
    Column("expires_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("created_by", Text),
    Column("last_used_at", DateTime(timezone=True)),
    Column("revoked_at", DateTime(timezone=True)),
    CheckConstraint("role IN ('admin', 'producer', 'worker')", name="api_keys_role_check"),
)

# What signs the OAuth access tokens (app.keys): one row, made by the first server to
# start, shared by every server process on the database.
signing_keys = Table(
    "signing_keys",
    metadata,
    Column("id", SmallInteger, primary_key=True),
    Column("secret", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("id = 1", name="signing_keys_one_row"),
)

# The tenants labelled by name in the metrics (app.metrics): decided by the leader, each
# set applying from ``effective_at`` in every process; the newest that applies is the one
# in force, a later one is coming.
metric_tenant_sets = Table(
    "metric_tenant_sets",
    metadata,
    Column("effective_at", DateTime(timezone=True), primary_key=True),
    Column("tenants", ARRAY(Text), nullable=False),
)

# One row: the oldest revision whose servers still serve this schema (alembic 0009).  A
# server built for that revision or a later one is ready on a database migrated past it
# (app.migrations.serves), which is what lets a rolling upgrade migrate first.
schema_compat = Table(
    "schema_compat",
    metadata,
    Column("one", Boolean, server_default=text("true"), primary_key=True),
    Column("oldest_server", Text, nullable=False),
    CheckConstraint("one", name="schema_compat_one_row"),
)
