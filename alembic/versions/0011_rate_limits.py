"""Rate limits inside fair share: a token bucket per tenant and per job type

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

Issue 28, section 2 (ADR 028): a tenant's activations (of every job type) and a job
type's (of every tenant) may be limited to ``rate_per_s`` a second with a burst of
``rate_burst``.  The bucket is stored beside the limit as a (``rate_tokens``,
``rate_at``) pair: a claim computes the tokens available at its read, under the tenant's
and the type's cap locks, and writes back what it left, so the limit holds across every
server process and replica.  All four columns are NULL where there is no limit.

Servers before this revision would claim from a rate-limited tenant without taking its
tokens (N replicas giving N times the rate, or no limit at all): ``oldest_server`` is
this revision, and a deployment replaces every server at once (as for 0010).  The
columns are nullable, without defaults: no table rewrite.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Contracting: servers of 0010 claim without taking tokens (see above).
oldest_server = "0011"


def upgrade() -> None:
    for table in ("tenants", "job_types"):
        op.execute(
            f"ALTER TABLE {table} ADD COLUMN rate_per_s double precision,"
            " ADD COLUMN rate_burst double precision,"
            " ADD COLUMN rate_tokens double precision,"
            " ADD COLUMN rate_at timestamp with time zone,"
            f" ADD CONSTRAINT {table}_rate_check CHECK ("
            "(rate_per_s IS NULL AND rate_burst IS NULL AND rate_tokens IS NULL"
            "  AND rate_at IS NULL)"
            " OR (rate_per_s > 0 AND rate_burst >= 1 AND rate_tokens IS NOT NULL"
            "     AND rate_at IS NOT NULL))"
        )
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
