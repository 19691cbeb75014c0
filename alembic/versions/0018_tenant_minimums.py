"""A guaranteed minimum per tenant

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

Issue 44 section 3.  ``tenants.min_active_jobs``: while a tenant has fewer ACTIVATED jobs
than that and ready jobs of a type being activated, its lanes are given picks before the
weighted share, up to it, and those picks are not charged to its virtual time (ADR 042).
At most its ``max_active_jobs``.

Expanding: one NULL column on ``tenants`` (no rewrite) with two checks that hold for every
row as it is (NULL), added NOT VALID and validated in the same migration (a scan of the
tenants table, which grows with tenants, not jobs).  Its partial index is built
CONCURRENTLY after the migration (``app.migrations``).  Servers of 0012 to 0017 never
name the column and serve beside it during a rolling upgrade: they give a tenant below
its minimum nothing before the weighted share, so minimums hold only as the new servers
serve.  Nothing to contract later.

Tested beside a 0016 server's open transaction, no table rewritten:
tests/integration/test_migrations.py::
test_0017_to_0019_expand_beside_0016_servers_and_rewrite_no_table.
"""

import time
from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 to 0017 run beside it (see above).
oldest_server = "0012"

TRIES, LOCK_WAIT = 60, "1s"
ALTERS = (
    "ALTER TABLE tenants ADD COLUMN IF NOT EXISTS min_active_jobs integer",
    "ALTER TABLE tenants ADD CONSTRAINT tenants_min_active_jobs_check"
    " CHECK (min_active_jobs >= 0) NOT VALID",
    "ALTER TABLE tenants ADD CONSTRAINT tenants_min_within_max_check"
    " CHECK (min_active_jobs <= max_active_jobs) NOT VALID",
)
# SHARE UPDATE EXCLUSIVE: writes to tenants go on while they are checked.
VALIDATES = (
    "ALTER TABLE tenants VALIDATE CONSTRAINT tenants_min_active_jobs_check",
    "ALTER TABLE tenants VALIDATE CONSTRAINT tenants_min_within_max_check",
)


def upgrade() -> None:
    bind = op.get_bind()
    for alter in ALTERS:
        for attempt in range(TRIES):
            try:
                with bind.begin_nested():  # a savepoint: a try that times out is undone alone
                    bind.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                    bind.exec_driver_sql(alter)
                break
            except DBAPIError as exc:
                if "lock timeout" not in str(exc) or attempt == TRIES - 1:
                    raise
                time.sleep(0.5)  # let the servers' queued work through
    bind.exec_driver_sql("SET LOCAL lock_timeout = 0")
    for validate in VALIDATES:
        op.execute(validate)
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
