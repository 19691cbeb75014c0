"""jobfair_release_holds picks the capped tenants itself, behind a gate cap changes wait on

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Found from outside (ADR 016, "A cap set while a finish is in flight"): a finishing
statement chose the capped tenants to release from its own snapshot.  A cap set on an
uncapped tenant after that snapshot was not seen, so the finish released nothing, while
a claim that counted its jobs (not yet committed as finished) held the lane: no job left
active, the lane held for good.  Now finishers pass every tenant they ended; the
function takes a shared gate lock, and only then, with a fresh snapshot, picks the capped
ones.  A tenant's configuration change, once committed, takes the gate exclusively (it
waits for every finish in flight) and releases the tenant's lanes again.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Releases the held lanes of those of ``tenants`` that have a cap, and notifies their job
# types on ``channel``.  In order, each statement with a fresh snapshot (a volatile
# function's statements each take one):
# 1. the gate (``gate_class``, 0), shared: a cap change committed before this sees it
#    taken; one committed after waits for this transaction (store.py, upsert_tenant);
# 2. the tenants of ``tenants`` that have a cap now (one committed before 1 is seen), or
#    held lanes (a cap removed);
# 3. their cap locks (``lock_class``), in key order;
# 4. the release of their held lanes: every hold committed under those locks is seen.
# Index: tenants pkey, lanes_held_idx, lanes_type_vtime_idx.
RELEASE_HOLDS = """
CREATE FUNCTION jobfair_release_holds(
    lock_class int, gate_class int, tenants text[], channel text
) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    capped text[];
    released int;
BEGIN
    IF coalesce(cardinality(tenants), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(gate_class, 0);
    SELECT array_agg(DISTINCT c.tenant_id) INTO capped FROM (
        SELECT t.tenant_id FROM tenants t
        WHERE t.tenant_id = ANY(tenants) AND t.max_active_jobs IS NOT NULL
        UNION ALL
        -- Held, but capped no longer (its cap removed, or the tenant deleted).
        SELECT l.tenant_id FROM lanes l WHERE l.held AND l.tenant_id = ANY(tenants)
    ) c;
    IF capped IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM jobfair_lock_tenant_caps(lock_class, capped);
    WITH unheld AS (
        UPDATE lanes l
        SET held = false,
            vtime = GREATEST(l.vtime, COALESCE(
                (SELECT min(x.vtime) FROM lanes x
                 WHERE x.job_type = l.job_type AND x.active AND NOT x.held),
                (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = l.job_type),
                0))
        WHERE l.held AND l.tenant_id = ANY(capped)
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
    op.execute("DROP FUNCTION jobfair_release_holds(int, text[], text)")
    op.execute(RELEASE_HOLDS)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
