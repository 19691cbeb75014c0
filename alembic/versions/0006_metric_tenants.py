"""The tenants that get a label of their own in the metrics

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

Issue 24: /metrics labels the top K tenants by activity by name and folds the rest into
one series; every server process must label alike, so the leader decides the set and
writes it here, each set with the instant from which it applies (app.metrics).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_tenant_sets",
        sa.Column("effective_at", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("tenants", postgresql.ARRAY(sa.Text()), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("metric_tenant_sets")
