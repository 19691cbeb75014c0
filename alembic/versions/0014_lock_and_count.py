"""A capped claim's locks and counts in one round trip

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

Issue 39.  A claim where a cap or a rate limit is involved takes its cap locks, then
counts (in a later statement, so that it sees every claim that committed before the
locks were its own), decides, claims and holds, all in one transaction.  Each statement
was a round trip made with the type's cap lock held, so every claim of a capped type
waited out the round trips of the one before it: under a database 10 ms away and a busy
machine a capped type drained at a few jobs a second while its workers were answered
nothing (tests/chaos/test_network.py).  ``jobfair_lock_and_count`` takes the locks and
then reads the counts and the token buckets in one call: a volatile function's
statements each take a snapshot of their own, so the reads come after the locks, as the
statements did.

Expanding: a function only.  Servers of 0012 and 0013 do not call it and serve beside it
on the new schema during a rolling upgrade: no table, column, index or constraint
changes, no table is rewritten, and the migration takes no lock on a table, so it does
not wait for (or hold up) the servers' transactions
(``tests/integration/test_migrations.py::test_0014_expands_only_while_a_0013_server_holds_its_tables``).
``bench/capped_latency.py --base 0d03170`` ran servers of 0013 on this schema.  Nothing to
contract later.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Expanding: servers of 0012 and 0013 run beside it (see above).
oldest_server = "0012"

# The cap locks of a capped claim -- the job type's (``type_key``; NULL takes none), then
# the tenants' (``lock_tenants``) in key order, one global order -- and then, read after
# them: the instant (the database's clock, the one clock of every process, for the
# buckets), the type's ACTIVATED jobs counted up to ``type_cap`` (NULL: not counted), each
# of ``capped`` tenants' cap as it is now and its ACTIVATED jobs (all types) counted up to
# it, and the token buckets of the type (if ``type_limited``) and of ``limited`` tenants.
# One row per item, by ``kind``: 'now', 'type', 'tenant', 'type_bucket', 'tenant_bucket'.
# Index: jobs_active_type_idx, jobs_active_tenant_idx, tenants pkey, job_types pkey.
LOCK_AND_COUNT = """
CREATE FUNCTION jobfair_lock_and_count(
    type_class int, type_key int, tenant_class int, lock_tenants text[],
    for_type text, type_cap int, capped text[], type_limited bool, limited text[])
RETURNS TABLE (kind text, name text, cap int, active bigint, per_s float8, burst float8,
               tokens float8, at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF type_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(type_class, type_key);
    END IF;
    PERFORM jobfair_lock_tenant_caps(tenant_class, lock_tenants);
    RETURN QUERY
    SELECT 'now'::text, NULL::text, NULL::int, NULL::bigint, NULL::float8, NULL::float8,
           NULL::float8, clock_timestamp()
    UNION ALL
    SELECT 'type', for_type, type_cap, (
        SELECT count(*) FROM (
            SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.job_type = for_type
            LIMIT type_cap) c), NULL, NULL, NULL, NULL
    WHERE type_cap IS NOT NULL
    UNION ALL
    SELECT 'tenant', t.tenant_id, t.max_active_jobs, (
        SELECT count(*) FROM (
            SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = t.tenant_id
            LIMIT t.max_active_jobs) c), NULL, NULL, NULL, NULL
    FROM tenants t WHERE t.tenant_id = ANY(capped) AND t.max_active_jobs IS NOT NULL
    UNION ALL
    SELECT 'type_bucket', y.job_type, NULL, NULL, y.rate_per_s, y.rate_burst, y.rate_tokens,
           y.rate_at
    FROM job_types y WHERE type_limited AND y.job_type = for_type AND y.rate_per_s IS NOT NULL
    UNION ALL
    SELECT 'tenant_bucket', t.tenant_id, NULL, NULL, t.rate_per_s, t.rate_burst,
           t.rate_tokens, t.rate_at
    FROM tenants t WHERE t.tenant_id = ANY(limited) AND t.rate_per_s IS NOT NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(LOCK_AND_COUNT)
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
