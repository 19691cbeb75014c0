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
on: the default is kept in the catalog, the table's file stays); ``lanes`` grows with
job types × tenants, not with jobs.  Servers of 0012 to 0014 never name the column: they
read, write and insert lanes beside it during a rolling upgrade (their holds just do not
count).  Nothing to contract later.

The ALTER needs ACCESS EXCLUSIVE on ``lanes`` for a moment, and while it waits for the
servers' transactions every later one queues behind it: so it waits at most 1 s at a
time, and between tries (up to 60) the servers go on.
(``tests/integration/test_migrations.py::test_0015_adds_a_column_beside_0014_servers``)
"""

import time
from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 to 0014 run beside it (see above).
oldest_server = "0012"


TRIES, LOCK_WAIT = 60, "1s"
ADD_COLUMN = "ALTER TABLE lanes ADD COLUMN IF NOT EXISTS held_count bigint NOT NULL DEFAULT 0"


def upgrade() -> None:
    bind = op.get_bind()
    for attempt in range(TRIES):
        try:
            with bind.begin_nested():  # a savepoint: a try that times out is undone alone
                bind.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                bind.exec_driver_sql(ADD_COLUMN)
            break
        except DBAPIError as exc:
            if "lock timeout" not in str(exc) or attempt == TRIES - 1:
                raise
            time.sleep(0.5)  # let the servers' queued work through
    bind.exec_driver_sql("SET LOCAL lock_timeout = 0")
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
