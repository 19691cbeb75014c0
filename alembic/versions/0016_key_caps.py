"""Caps per fairness key

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

Issue 44.  A fairness key may have at most ``key_weights.max_active_jobs`` ACTIVATED
jobs of every type, and every key at most ``job_types.max_active_per_key`` of a type.
They are exact the way tenant caps are (ADR 016, ADR 040): a claim that meets a capped
key takes the key's cap lock (``jobfair_lock_key_caps``, after the type's and the
tenants'), counts its ACTIVATED jobs in a later statement, and marks the keys it leaves
at their caps ``lane_keys.held``; whatever ends an activation of a capped key releases
them under the same lock (``jobfair_release_key_holds``), behind the release gate that a
configuration change takes exclusively after it committed.

Expanding: three columns without a default that needs a rewrite (two NULL, one with a
constant default, kept in the catalog), two functions, and no index: the count's index
on ``jobs`` is built CONCURRENTLY after the migration (``app.migrations.CONCURRENT``).
Servers of 0012 to 0015 never name the new columns and serve beside it during a rolling
upgrade; they do not release key holds either, so a hold a new server made and an old
one's finish should have released is released by the leader's sweep
(``app.sweepers``), within its interval.  Nothing to contract later.

Each ALTER needs ACCESS EXCLUSIVE on its (small: per type, per key) table for a moment:
it waits at most 1 s at a time, as 0015's.
"""

import time
from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 to 0015 run beside it (see above).
oldest_server = "0012"

TRIES, LOCK_WAIT = 60, "1s"
ALTERS = (
    "ALTER TABLE key_weights ADD COLUMN IF NOT EXISTS max_active_jobs integer"
    " CONSTRAINT key_weights_max_active_jobs_check CHECK (max_active_jobs >= 0)",
    "ALTER TABLE job_types ADD COLUMN IF NOT EXISTS max_active_per_key integer"
    " CONSTRAINT job_types_max_active_per_key_check CHECK (max_active_per_key >= 1)",
    "ALTER TABLE lane_keys ADD COLUMN IF NOT EXISTS held boolean NOT NULL DEFAULT false",
)

# The cap locks of fairness keys (``tenants``, ``keys``: pairs), in one global order (by
# their hash, as jobfair_lock_tenant_caps takes tenants'); a claim takes them after the
# type's and the tenants' locks, a release after the tenants'.
LOCK_KEY_CAPS = """
CREATE OR REPLACE FUNCTION jobfair_lock_key_caps(lock_class int, tenants text[], keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k int;
BEGIN
    FOR k IN SELECT DISTINCT hashtext(t || chr(31) || f)
             FROM unnest(tenants, keys) AS u(t, f) ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(lock_class, k);
    END LOOP;
END
$$
"""

# A capped claim's key step: the type's per-key configuration lock shared (a change of
# the type's maxActivePerKey takes it exclusively, so it is ordered before or after each
# claim), the keys' cap locks, then -- a later statement, so it sees every claim that
# committed before the locks were this one's, and the type's per-key cap as it is now --
# each key's room: its own cap (key_weights) minus its ACTIVATED jobs of every type, and
# the type's per-key cap minus its ACTIVATED jobs of ``job_type``; the least of them
# (NULL: no cap).
LOCK_AND_COUNT_KEYS = """
CREATE OR REPLACE FUNCTION jobfair_lock_and_count_keys(
    lock_class int, type_lock_class int, tenants text[], keys text[], job_type text
) RETURNS TABLE (tenant_id text, fairness_key text, room int)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    per_key int;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(type_lock_class, hashtext(job_type));
    PERFORM jobfair_lock_key_caps(lock_class, tenants, keys);
    SELECT y.max_active_per_key INTO per_key FROM job_types y
    WHERE y.job_type = jobfair_lock_and_count_keys.job_type;
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
         WHERE per_key IS NOT NULL))::int
    FROM (SELECT DISTINCT t, f FROM unnest(tenants, keys) AS x(t, f)) u;
END
$$
"""

# Releases the held keys of the pairs (``tenants``, ``keys``) whose capacity an ended
# activation of ``types`` freed, or (a NULL type) whose caps changed, or that the sweep
# names: the release gate shared (first: a configuration change that committed before it
# is seen by the pick); nothing more when no key has a cap and no type is NULL (what
# every finish pays then: two probes); else the pairs that have a cap (their own, or the
# type's per-key cap) or a held key, picked with a snapshot of its own; their cap locks;
# then, a statement with a later snapshot that sees every hold committed under those
# locks, their keys held no longer, re-entering at their lane's key virtual time as a
# woken key does, and each type notified.  Answers how many it released.
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
       AND NOT EXISTS (SELECT 1 FROM job_types y WHERE y.max_active_per_key IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM key_weights w WHERE w.max_active_jobs IS NOT NULL) THEN
        -- No key has a cap: nothing these jobs ended can be held (a cap set since is
        -- released by its change, behind the gate).  Two probes a statement.
        RETURN 0;
    END IF;
    SELECT array_agg(c.t), array_agg(c.f) INTO ct, ck FROM (
        SELECT DISTINCT u.t, u.f FROM unnest(tenants, keys, types) AS u(t, f, y)
        WHERE u.y IS NULL  -- a cap changed, or the sweep: every held key named
           OR EXISTS (SELECT 1 FROM key_weights w WHERE w.tenant_id = u.t
                        AND w.fairness_key = u.f AND w.max_active_jobs IS NOT NULL)
           OR EXISTS (SELECT 1 FROM job_types y WHERE y.job_type = u.y
                        AND y.max_active_per_key IS NOT NULL)
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
    for function in (LOCK_KEY_CAPS, LOCK_AND_COUNT_KEYS, RELEASE_KEY_HOLDS):
        op.execute(function)
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
