"""Count the holds a lane's cap makes

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

Issue 40.  A tenant at its cap is held out of the claims (``lanes.held``) until a finish
frees room, often within the same second: the stats' samples, a few seconds apart, saw a
lane capped at 1 held at one sample and free at the next, and its entitlement counted
it as free -- "starved" on the screens.  ``lanes.held_count`` counts the holds a claim
makes (it goes up by one each time a claim holds the lane), so that a sample sees that
the lane was held since the last one, however briefly (app.shares).

Expanding: one column with a constant default, added without a rewrite (PostgreSQL 11
on: the default is kept in the catalog); ``lanes`` grows with job types × tenants, not
with jobs, and the ACCESS EXCLUSIVE lock is the catalog change's alone.  Servers of 0012
to 0014 never name the column and serve beside it during a rolling upgrade (their holds
just do not count).  Nothing to contract later.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 to 0014 run beside it (see above).
oldest_server = "0012"


def upgrade() -> None:
    # Do not queue behind a long transaction on lanes with every later reader behind us.
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute("ALTER TABLE lanes ADD COLUMN held_count bigint NOT NULL DEFAULT 0")
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
