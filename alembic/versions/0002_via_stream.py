"""jobs.via_stream: finishing a stream-activated job returns a credit to its stream

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column(
        "jobs",
        sa.Column("via_stream", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
