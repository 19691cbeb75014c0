"""API keys and the signing key of OAuth access tokens

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Issue 22: keys with a role and tenant and job-type scopes, the secret stored only as its
SHA-256 (ADR 019); and the one secret every server process signs and checks the OAuth
client-credentials tokens with (made by the first server to start).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text(), primary_key=True),
        sa.Column("secret_sha256", sa.LargeBinary(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("tenants", postgresql.ARRAY(sa.Text())),
        sa.Column("job_types", postgresql.ARRAY(sa.Text())),
        sa.Column("name", sa.Text()),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.Text()),
        sa.Column("last_used_at", sa.DateTime(timezone=True)),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("role IN ('admin', 'producer', 'worker')", name="api_keys_role_check"),
    )
    op.create_table(
        "signing_keys",
        sa.Column("id", sa.SmallInteger(), primary_key=True),
        sa.Column("secret", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name="signing_keys_one_row"),
    )


def downgrade() -> None:
    op.drop_table("signing_keys")
    op.drop_table("api_keys")
