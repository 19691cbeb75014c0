"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 03:17:34.804802
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        sa.schema.CreateSequence(sa.Sequence("job_key_seq", start=2251799813685249, cache=1000))
    )
    op.create_table(
        "job_types",
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("max_active_jobs", sa.Integer(), nullable=True),
        sa.Column("aging_interval_ms", sa.Integer(), nullable=True),
        sa.Column("aging_step", sa.Integer(), nullable=True),
        sa.CheckConstraint("aging_interval_ms > 0", name="job_types_aging_interval_check"),
        sa.CheckConstraint("aging_step BETWEEN 0 AND 100", name="job_types_aging_step_check"),
        sa.CheckConstraint("max_active_jobs >= 0", name="job_types_max_active_jobs_check"),
        sa.PrimaryKeyConstraint("job_type"),
    )
    op.create_table(
        "jobs",
        sa.Column(
            "job_key",
            sa.BigInteger(),
            server_default=sa.text("nextval('job_key_seq')"),
            nullable=False,
        ),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("activation_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "variables",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "custom_headers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("activated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "(state = 'ACTIVATED') = (deadline IS NOT NULL)", name="jobs_deadline_check"
        ),
        sa.CheckConstraint(
            "state IN ('SCHEDULED', 'CREATED', 'ACTIVATED', 'COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED')",  # noqa: E501
            name="jobs_state_check",
        ),
        sa.CheckConstraint("priority BETWEEN 0 AND 100", name="jobs_priority_check"),
        sa.CheckConstraint("retries >= 0", name="jobs_retries_check"),
        sa.PrimaryKeyConstraint("job_key"),
        postgresql_with={
            "autovacuum_vacuum_scale_factor": "0.01",
            "autovacuum_vacuum_insert_scale_factor": "0.05",
            "autovacuum_analyze_scale_factor": "0.02",
            "fillfactor": "90",
        },
    )
    op.create_index(
        "jobs_active_tenant_idx",
        "jobs",
        ["tenant_id"],
        unique=False,
        postgresql_where=sa.text("state = 'ACTIVATED'"),
    )
    op.create_index(
        "jobs_active_type_idx",
        "jobs",
        ["job_type"],
        unique=False,
        postgresql_where=sa.text("state = 'ACTIVATED'"),
    )
    op.create_index(
        "jobs_idempotency_idx",
        "jobs",
        ["tenant_id", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_index(
        "jobs_lease_idx",
        "jobs",
        ["deadline"],
        unique=False,
        postgresql_where=sa.text("state = 'ACTIVATED'"),
    )
    op.create_index(
        "jobs_ready_idx",
        "jobs",
        ["job_type", "tenant_id", sa.literal_column("priority DESC"), "queued_at", "job_key"],
        unique=False,
        postgresql_where=sa.text("state = 'CREATED'"),
    )
    op.create_index(
        "jobs_scheduled_idx",
        "jobs",
        ["run_at"],
        unique=False,
        postgresql_where=sa.text("state = 'SCHEDULED'"),
    )
    op.create_index(
        "jobs_terminal_idx",
        "jobs",
        ["completed_at"],
        unique=False,
        postgresql_where=sa.text("state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED')"),
    )
    op.create_table(
        "lanes",
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("vtime", sa.Double(), server_default=sa.text("0"), nullable=False),
        sa.Column("active", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("activated_total", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("job_type", "tenant_id"),
        postgresql_with={
            "autovacuum_vacuum_scale_factor": "0",
            "autovacuum_vacuum_threshold": "500",
            "fillfactor": "50",
        },
    )
    op.create_index(
        "lanes_type_vtime_idx", "lanes", ["job_type", "active", "vtime", "tenant_id"], unique=False
    )
    op.create_table(
        "tenants",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("weight", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("max_active_jobs", sa.Integer(), nullable=True),
        sa.CheckConstraint("max_active_jobs >= 0", name="tenants_max_active_jobs_check"),
        sa.CheckConstraint("weight BETWEEN 1 AND 10000", name="tenants_weight_check"),
        sa.PrimaryKeyConstraint("tenant_id"),
    )


def downgrade() -> None:
    # Forward-only: Jobfair never migrates down.
    raise NotImplementedError("forward-only migrations")
