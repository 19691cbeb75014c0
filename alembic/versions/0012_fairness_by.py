"""Fairness by cost and by worker time: what a job type's lanes are charged by

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

Issue 28, section 3 (ADR 029).  ``job_types.fairness_by``: NULL (by activations, as
before), 'cost' or 'workerTime'.  ``jobs.cost``: what a job declares it costs (default
1), charged to its lane by cost.  ``jobs.charged``: the worker-time estimate its current
activation was charged, written by the claim only by worker time (NULL otherwise), and
settled against the time the lease was held when it ends.  ``lanes.unit_est``: the lane's
estimate of its next job's lease seconds (NULL until one finished).

Expanding: a server of 0011 charges every type by activations, ignores the new columns
and leaves ``charged`` NULL (its activations are never settled); jobs it inserts cost 1.
A mixed deployment shares worker time less exactly while it lasts, and loses nothing.
``jobs.cost`` has a constant default, so adding it rewrites no table (PostgreSQL 11+).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0011 run beside it (see above).
oldest_server = "0011"


def upgrade() -> None:
    op.execute(
        "ALTER TABLE job_types ADD COLUMN fairness_by text,"
        " ADD CONSTRAINT job_types_fairness_by_check"
        " CHECK (fairness_by IN ('cost', 'workerTime'))"
    )
    op.execute(
        "ALTER TABLE jobs ADD COLUMN cost double precision NOT NULL DEFAULT 1,"
        " ADD COLUMN charged double precision,"
        " ADD CONSTRAINT jobs_cost_check CHECK (cost > 0 AND cost < 'Infinity') NOT VALID"
    )
    # Checked in a second step, which scans the table under a lock that blocks no write
    # (every row then costs 1, the default): ADD CONSTRAINT alone scans it under the
    # ACCESS EXCLUSIVE lock of the ALTER.
    op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_cost_check")
    op.execute("ALTER TABLE lanes ADD COLUMN unit_est double precision")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
