"""A job browser's API: attempt history, listing indexes, pause, workers seen

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Issue 24, section 3:

- ``job_events``: a job's attempt history: a row per ended activation (its start, worker
  and lease, and how and when it ended: completed, failed, retried, error-thrown,
  lease-expired, released, canceled), per revive and per cancel, written by the
  statement that makes the transition.  Keyed (job_key, activation_count, step): the
  activation it belongs to and its place in it (1 end, 2 revived, 3 canceled), which
  orders a job's history without trusting clocks, makes a second row for one step
  impossible, and lets the claim drop a whole old activation by key (the history is
  bounded: app.db.history).  No foreign key: the check would cost every transition a
  probe and a row lock of jobs; retention deletes the rows with the job.
- ``jobs_done_tenant_idx``: the terminal jobs by tenant, the state before the key, so
  that ``GET /v2/jobs?tenantId=x&state=COMPLETED`` reads one index range in key order,
  however small the tenant.  Terminal rows only: a job enters it once, when it finishes,
  and the live states keep their own partial indexes.  None by type: it cost the drain
  as much again (ADR 023), and a type is a large share of the jobs, which the key index
  finds a page of soon.  On a large table the builds block writes to jobs while they run
  (minutes for tens of millions of rows).
- ``jobs_failed_idx``: FAILED jobs by key, for listing and retrying incidents without a
  tenant or type.  FAILED jobs are few; it costs an entry per incident.
- ``tenants.paused``, ``job_types.paused``: pause and resume, shared by every server.
- ``workers``: which worker names activated jobs of each type, and when they were last
  seen (written in batches, at most every few seconds per server process).
- ``jobfair_release_holds`` never releases the lanes of a paused tenant: a paused
  tenant's lanes are held as lanes at a cap are (ADR 016), and capacity freed by the
  tenant's last active jobs must not let them out.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TERMINAL = "state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED')"
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

# As alembic 0004's, with paused tenants left out of both the capped tenants and the
# tenants with held lanes: their lanes stay held until they are resumed.
RELEASE_HOLDS = """
CREATE OR REPLACE FUNCTION jobfair_release_holds(
    lock_class int, gate_class int, tenants text[], channel text
) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    capped text[];
    released int;
BEGIN
    IF coalesce(cardinality(tenants), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(gate_class, 0);
    SELECT array_agg(DISTINCT c.tenant_id) INTO capped FROM (
        SELECT t.tenant_id FROM tenants t
        WHERE t.tenant_id = ANY(tenants) AND t.max_active_jobs IS NOT NULL AND NOT t.paused
        UNION ALL
        -- Held, but capped no longer (its cap removed, the tenant deleted or resumed).
        SELECT l.tenant_id FROM lanes l
        WHERE l.held AND l.tenant_id = ANY(tenants)
          AND NOT EXISTS (SELECT 1 FROM tenants p WHERE p.tenant_id = l.tenant_id AND p.paused)
    ) c;
    IF capped IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM jobfair_lock_tenant_caps(lock_class, capped);
    WITH unheld AS (
        UPDATE lanes l
        SET held = false,
            vtime = GREATEST(l.vtime, COALESCE(
                (SELECT min(x.vtime) FROM lanes x
                 WHERE x.job_type = l.job_type AND x.active AND NOT x.held),
                (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = l.job_type),
                0))
        WHERE l.held AND l.tenant_id = ANY(capped)
          AND NOT EXISTS (SELECT 1 FROM tenants p WHERE p.tenant_id = l.tenant_id AND p.paused)
        RETURNING l.job_type
    ),
    notified AS (
        SELECT pg_notify(channel, job_type) FROM (SELECT DISTINCT job_type FROM unheld) d
    )
    SELECT (SELECT count(*) FROM unheld) + 0 * (SELECT count(*) FROM notified)
    INTO released;
    RETURN released;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column("job_key", sa.BigInteger(), nullable=False),
        sa.Column("activation_count", sa.Integer(), nullable=False),
        sa.Column("step", sa.SmallInteger(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("worker", sa.Text()),
        sa.Column("deadline", sa.DateTime(timezone=True)),
        sa.Column("retries", sa.Integer()),
        sa.Column("error_code", sa.Text()),
        sa.Column("error_message", sa.Text()),
        sa.PrimaryKeyConstraint("job_key", "activation_count", "step", name="job_events_pkey"),
        sa.CheckConstraint(
            "event IN (" + ", ".join(f"'{e}'" for e in EVENTS) + ")",
            name="job_events_event_check",
        ),
        sa.CheckConstraint("step BETWEEN 1 AND 3", name="job_events_step_check"),
        postgresql_with={
            "autovacuum_vacuum_scale_factor": "0.02",
            "autovacuum_vacuum_insert_scale_factor": "0.05",
        },
    )
    op.create_index(
        "jobs_done_tenant_idx",
        "jobs",
        ["tenant_id", "state", "job_key"],
        postgresql_where=sa.text(TERMINAL),
    )
    op.create_index(
        "jobs_failed_idx", "jobs", ["job_key"], postgresql_where=sa.text("state = 'FAILED'")
    )
    # Constant defaults: PostgreSQL adds the columns without rewriting the tables.
    op.add_column(
        "tenants",
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column(
        "job_types",
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.create_table(
        "workers",
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("worker", sa.Text(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_activated_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("job_type", "worker", name="workers_pkey"),
    )
    op.execute(RELEASE_HOLDS)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
