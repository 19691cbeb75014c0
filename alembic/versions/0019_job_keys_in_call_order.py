"""Job keys drawn in the order creates ask for them

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

FIFO keys (ADR 041) activate a fairness key's jobs in job-key order, and say that jobs
one producer creates one after the other are in its order.  With ``CACHE 1000`` every
database session drew its own block of a thousand keys, so a job created later through
another connection (another server, or the same server's pool) got a smaller key and
went first (found by a review; tests/integration/test_key_ordering.py).  ``CACHE 1``:
each create draws the next key of one sequence (ADR 041 has what it costs).

Expanding: servers of every release draw keys the same way.  A session that drew a block
before the change uses it up first (at most a thousand keys), so the order holds once
the servers' connections have been renewed.  Nothing to contract later.

Tested beside a 0016 server's open transaction, no table rewritten:
tests/integration/test_migrations.py::
test_0017_to_0019_expand_beside_0016_servers_and_rewrite_no_table.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 to 0018 run beside it.
oldest_server = "0012"


def upgrade() -> None:
    op.execute("ALTER SEQUENCE job_key_seq CACHE 1")
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
