"""lanes.held: a lane whose tenant is at its cap leaves the lane reads until capacity frees

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

A claim that leaves a tenant at its ``maxActiveJobs`` marks the lanes it read of that
tenant held, under the tenant's cap lock; lane reads skip held lanes (the first columns
of ``lanes_type_vtime_idx`` are now job_type, active, held), so tenants at their cap cost
a read nothing however many they are.  Whatever frees a tenant's capacity -- a job of it
finished, failed or expired, its configuration changed -- releases its held lanes with
``jobfair_release_holds``, which takes the same cap locks first (ADR 016).
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Takes the cap locks of ``tenants`` (class ``lock_class``, key hashtext(tenant)) in key
# order, the order every claimer takes them in, so that two takers never deadlock.
LOCK_TENANT_CAPS = """
CREATE FUNCTION jobfair_lock_tenant_caps(lock_class int, tenants text[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k int;
BEGIN
    FOR k IN SELECT DISTINCT hashtext(t) FROM unnest(tenants) AS t ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(lock_class, k);
    END LOOP;
END
$$
"""

# Releases the held lanes of ``tenants`` (their capacity was freed, or their cap changed)
# and notifies each of their job types on ``channel``, so that waiters that found only
# held lanes read again.  The cap locks come first; the release is a statement of its own
# with a later snapshot (a volatile function's statements each take one), so it sees every
# hold that a claimer committed under those locks, and a claimer that locks after it
# counts the capacity freed: no lane stays held with room to take a job.  A released lane
# re-enters at the current virtual time if it fell behind it, as an idle lane does: being
# held at a cap banks no credit (ADR 016).  Index: lanes_held_idx; lanes_type_vtime_idx for
# the virtual time.  Locks: the tenants' cap locks and the released lanes' rows.
RELEASE_HOLDS = """
CREATE FUNCTION jobfair_release_holds(lock_class int, tenants text[], channel text)
RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    released int;
BEGIN
    IF coalesce(cardinality(tenants), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM jobfair_lock_tenant_caps(lock_class, tenants);
    WITH unheld AS (
        UPDATE lanes l
        SET held = false,
            vtime = GREATEST(l.vtime, COALESCE(
                (SELECT min(x.vtime) FROM lanes x
                 WHERE x.job_type = l.job_type AND x.active AND NOT x.held),
                (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = l.job_type),
                0))
        WHERE l.held AND l.tenant_id = ANY(tenants)
        RETURNING l.job_type
    ),
    notified AS (
        SELECT pg_notify(channel, job_type) FROM (SELECT DISTINCT job_type FROM unheld) d
    )
    SELECT (SELECT count(*) FROM unheld) + 0 * (SELECT count(*) FROM notified)
    INTO released;
    RETURN released;
END
$$
"""


def upgrade() -> None:
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column(
        "lanes",
        sa.Column("held", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.drop_index("lanes_type_vtime_idx", table_name="lanes")
    op.create_index(
        "lanes_type_vtime_idx", "lanes", ["job_type", "active", "held", "vtime", "tenant_id"]
    )
    op.create_index("lanes_held_idx", "lanes", ["tenant_id"], postgresql_where=sa.text("held"))
    op.execute(LOCK_TENANT_CAPS)
    op.execute(RELEASE_HOLDS)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
