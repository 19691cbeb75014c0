"""The oldest server version a schema still serves, for rolling upgrades

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

Issue 26: a rolling upgrade migrates first, then replaces the replicas one by one.  A
server used to be ready only on the exact schema it was built for, so the migration made
every replica of the previous version unready at once, and one that restarted refused to
start: until the rollout ended, only the new replicas served.

``schema_compat`` holds one row: the oldest revision whose servers still work on this
schema.  A server whose own head is that revision or later serves a database migrated
past it (``app.migrations.serves``), ready, without migrating it back or failing.  Every
migration from this one on sets it (CONTRIBUTING.md, "Adding a migration"): an expanding
one (a new table, a nullable column, a new function beside the old) to the revision
before it or earlier; a contracting one (a column dropped, a meaning changed) to itself.

0008 servers could serve this schema (it only adds this table), but they do not read it.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Every migration from this one on declares the oldest revision whose servers serve its
# schema, and writes it (tests/integration/test_migrations.py checks both).
oldest_server = "0008"


def upgrade() -> None:
    op.create_table(
        "schema_compat",
        sa.Column("one", sa.Boolean(), server_default=sa.true(), primary_key=True),
        sa.Column("oldest_server", sa.Text(), nullable=False),
        sa.CheckConstraint("one", name="schema_compat_one_row"),
    )
    op.execute(f"INSERT INTO schema_compat (oldest_server) VALUES ('{oldest_server}')")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
