"""What each lane and key has been served, in its job type's units; what a lease's
estimate added to its lane and key

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

Issue 28, sections 3 and 4 (ADR 029).  ``lanes.units_total`` and ``lane_keys.units_total``
are running counts of what a lane or key was served in its type's units: by cost, the
costs of its jobs activated (written with the charges); by worker time, the seconds its
leases held before they ended (written with the settlements).  The stats and the
metrics measure a type fair by cost or by worker time in them, as they measure one fair
by activations in ``activated_total``.

``jobs.lane_charge`` and ``jobs.key_charge``: by worker time, the virtual time the
activation's estimate (``charged``) added to its lane and its key, at their weights then.
The settlement takes back exactly these, so that a weight changed while the lease is out
neither banks the lane credit nor charges it twice (ADR 029).

Expanding: a server of 0012 leaves them as they are, so while it runs beside a newer
one its activations are missing from the realised shares of cost and worker time, and
its worker-time activations (no ``lane_charge``) are settled at the weights of their
end, as before.  A constant default or none: adding them rewrites no table.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 run beside it (see above).
oldest_server = "0012"


def upgrade() -> None:
    op.execute("ALTER TABLE lanes ADD COLUMN units_total double precision NOT NULL DEFAULT 0")
    op.execute("ALTER TABLE lane_keys ADD COLUMN units_total double precision NOT NULL DEFAULT 0")
    op.execute(
        "ALTER TABLE jobs ADD COLUMN lane_charge double precision,"
        " ADD COLUMN key_charge double precision"
    )
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
