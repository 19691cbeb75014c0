"""One job at a time, in creation order, per fairness key

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

Issue 44 section 2.  A job type whose ``job_types.key_ordering`` is 'fifo' activates each
fairness key's jobs one at a time, in key order (ADR 041): a key's *head* is its first job
in key order that is not done -- CREATED, SCHEDULED, ACTIVATED or FAILED -- and only a
CREATED head is ever claimed.  It rides on the key caps of 0016: such a type counts as
having a per-key cap of 1 (so an ACTIVATED head leaves no room), and
``jobfair_lock_and_count_keys`` gives a key no room while its first job waiting is not
CREATED (backing off, delayed, or FAILED), so the claim holds it
out of the key reads; ``jobfair_release_key_holds`` now also releases the keys of such
types, whatever ends, revives or promotes their heads.

Expanding: one NULL column on ``job_types`` (small; no rewrite) and the two functions
replaced with their old behaviour kept for every type that is not FIFO.  The heads'
index on ``jobs`` is built CONCURRENTLY after the migration (``app.migrations``).
Servers of 0012 to 0016 serve beside it during a rolling upgrade; they know nothing of
FIFO keys, so ``keyOrdering`` is to be set once no older server is left (docs/upgrading.md).
Nothing to contract later.

Tested beside a 0016 server's open transaction, no table rewritten:
tests/integration/test_migrations.py::
test_0017_to_0019_expand_beside_0016_servers_and_rewrite_no_table.
"""

import time
from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 to 0016 run beside it (see above).
oldest_server = "0012"

TRIES, LOCK_WAIT = 60, "1s"
ALTER = (
    "ALTER TABLE job_types ADD COLUMN IF NOT EXISTS key_ordering text"
    " CONSTRAINT job_types_key_ordering_check CHECK (key_ordering IN ('fifo'))"
)

# 0016's count, and for a FIFO type a key's room is none while its first job waiting in
# key order (CREATED, SCHEDULED or FAILED) is not CREATED; the type's per-key cap is then
# 1 at most, which counts an ACTIVATED head.
LOCK_AND_COUNT_KEYS = """
CREATE OR REPLACE FUNCTION jobfair_lock_and_count_keys(
    lock_class int, type_lock_class int, tenants text[], keys text[], job_type text
) RETURNS TABLE (tenant_id text, fairness_key text, room int)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    per_key int;
    fifo bool;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(type_lock_class, hashtext(job_type));
    PERFORM jobfair_lock_key_caps(lock_class, tenants, keys);
    SELECT y.max_active_per_key, y.key_ordering IS NOT DISTINCT FROM 'fifo' INTO per_key, fifo
    FROM job_types y WHERE y.job_type = jobfair_lock_and_count_keys.job_type;
    IF fifo THEN
        per_key := LEAST(COALESCE(per_key, 1), 1);
    END IF;
    RETURN QUERY
    SELECT u.t, u.f, LEAST(
        (SELECT w.max_active_jobs - (SELECT count(*) FROM (
                SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = u.t
                  AND j.fairness_key = u.f LIMIT w.max_active_jobs) a)
         FROM key_weights w WHERE w.tenant_id = u.t AND w.fairness_key = u.f
           AND w.max_active_jobs IS NOT NULL),
        (SELECT per_key - count(*) FROM (
                SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = u.t
                  AND j.fairness_key = u.f AND j.job_type = jobfair_lock_and_count_keys.job_type
                LIMIT per_key) a
         WHERE per_key IS NOT NULL),
        (SELECT 0 FROM (
                SELECT j.state FROM jobs j
                WHERE (j.state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE
                  AND j.job_type = jobfair_lock_and_count_keys.job_type
                  AND j.tenant_id = u.t AND j.fairness_key = u.f
                ORDER BY j.job_key LIMIT 1) head
         WHERE fifo AND head.state <> 'CREATED'))::int
    FROM (SELECT DISTINCT t, f FROM unnest(tenants, keys) AS x(t, f)) u;
END
$$
"""

# 0016's release, with the keys of FIFO types among those it looks at: their holds go
# whenever a job of theirs ends, is revived or is promoted (the next claim counts again
# and holds a key whose head is still not CREATED).
RELEASE_KEY_HOLDS = """
CREATE OR REPLACE FUNCTION jobfair_release_key_holds(
    lock_class int, gate_class int, tenants text[], keys text[], types text[], channel text
) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ct text[];
    ck text[];
    released int;
BEGIN
    IF coalesce(cardinality(tenants), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(gate_class, 0);
    IF array_position(types, NULL) IS NULL
       AND NOT EXISTS (SELECT 1 FROM job_types y
                       WHERE y.max_active_per_key IS NOT NULL OR y.key_ordering IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM key_weights w WHERE w.max_active_jobs IS NOT NULL) THEN
        -- No key has a cap and no type is FIFO: nothing these jobs ended can be held (a
        -- cap set since is released by its change, behind the gate).  Two probes.
        RETURN 0;
    END IF;
    SELECT array_agg(c.t), array_agg(c.f) INTO ct, ck FROM (
        SELECT DISTINCT u.t, u.f FROM unnest(tenants, keys, types) AS u(t, f, y)
        WHERE u.y IS NULL  -- a cap changed, or the sweep: every held key named
           OR EXISTS (SELECT 1 FROM key_weights w WHERE w.tenant_id = u.t
                        AND w.fairness_key = u.f AND w.max_active_jobs IS NOT NULL)
           OR EXISTS (SELECT 1 FROM job_types y WHERE y.job_type = u.y
                        AND (y.max_active_per_key IS NOT NULL OR y.key_ordering IS NOT NULL))
           OR EXISTS (SELECT 1 FROM lane_keys h WHERE h.job_type = u.y AND h.tenant_id = u.t
                        AND h.fairness_key = u.f AND h.held)
    ) c;
    IF ct IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM jobfair_lock_key_caps(lock_class, ct, ck);
    WITH unheld AS (
        UPDATE lane_keys k
        SET held = false,
            vtime = GREATEST(k.vtime, COALESCE(
                (SELECT min(x.vtime) FROM lane_keys x
                 WHERE x.job_type = k.job_type AND x.tenant_id = k.tenant_id
                   AND x.active AND NOT x.held),
                (SELECT max(x.vtime) FROM lane_keys x
                 WHERE x.job_type = k.job_type AND x.tenant_id = k.tenant_id),
                0))
        FROM unnest(ct, ck) AS p(t, f)
        WHERE k.held AND k.tenant_id = p.t AND k.fairness_key = p.f
        RETURNING k.job_type
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
    bind = op.get_bind()
    for attempt in range(TRIES):
        try:
            with bind.begin_nested():  # a savepoint: a try that times out is undone alone
                bind.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                bind.exec_driver_sql(ALTER)
            break
        except DBAPIError as exc:
            if "lock timeout" not in str(exc) or attempt == TRIES - 1:
                raise
            time.sleep(0.5)  # let the servers' queued work through
    bind.exec_driver_sql("SET LOCAL lock_timeout = 0")
    for function in (LOCK_AND_COUNT_KEYS, RELEASE_KEY_HOLDS):
        op.execute(function)
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
