"""Shards: every job and lane carries its tenant's shard; job keys carry it too

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

Issue 26, section 3: the schema made ready to be distributed by tenant (Citus, with
``shard`` as the distribution column; docs/scaling.md, ADR 024), on one PostgreSQL
changing nothing a query sees.

- ``jobfair_shard(tenant_id)``: a tenant's shard, 0 to 2047, the first 11 bits of the
  MD5 of its id.  Twin of ``app.shards.shard_of`` (tests/integration/test_citus_readiness.py).
- ``jobfair_job_key(shard, n)``: a new job's key, ``(n << 11) | shard`` with n from
  ``job_key_seq``: a key alone names its job's shard (``jobfair_key_shard``), so a lookup
  by key is single-shard, and keys still grow in the order jobs are made.  The sequence
  now stops at 2**52 - 1, so that every key stays below 2**63.
- ``jobs.shard``, ``lanes.shard`` and ``job_events.shard`` (a job's history lives beside
  it), in the primary keys and in the idempotency index
  (Citus requires the distribution column in every unique index; the shard is a function
  of what those indexes already hold, so they mean what they meant).  Existing indexes
  keep their columns and their order; ``jobs_pkey`` still starts with ``job_key``.
- ``jobs_shard_check``, ``job_events_shard_check``: a job's shard is the one its key
  names.  ``lanes_shard_check``: a lane's shard is its tenant's.

Jobs made before this migration keep their keys (below 2**52; the new ones are above
2**62), and with them the shard their key names, not their tenant's: a key is a name
clients hold, and it does not change.  On one PostgreSQL that changes nothing; only a
distributed database needs every job in its tenant's shard (``SELECT count(*) FROM jobs
WHERE shard <> jobfair_shard(tenant_id)`` counts those that are not, gone once retention
has deleted them).  An idempotency key of such a job still finds it (insert_jobs looks
for the tenant's key outside the tenant's shard too).

Servers of earlier versions cannot create jobs once this has run: the key column has no
default any more and every job needs its shard (deploy/README.md, "Scaling out", says how
to upgrade).

The primary keys and the idempotency index are rebuilt, and every row of jobs, lanes
and job_events written once: on a large table this takes minutes, with writes to jobs blocked.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SHARD_MASK = (1 << 11) - 1
KEY_MAX = (1 << 52) - 1  # the last n whose key, n << 11, is below 2**63

FUNCTIONS = (
    """CREATE FUNCTION jobfair_shard(tenant_id text) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT (('x' || left(md5(tenant_id), 4))::bit(16)::int >> 5)::smallint
    $$""",
    """CREATE FUNCTION jobfair_job_key(shard smallint, n bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT (n << 11) | shard
    $$""",
    f"""CREATE FUNCTION jobfair_key_shard(job_key bigint) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT (job_key & {SHARD_MASK})::smallint
    $$""",
)


def upgrade() -> None:
    for function in FUNCTIONS:
        op.execute(function)
    op.execute(f"ALTER SEQUENCE job_key_seq MAXVALUE {KEY_MAX}")

    # A key is made by jobfair_job_key, from the tenant's shard: no default can know it.
    op.execute("ALTER TABLE jobs ADD COLUMN shard smallint, ALTER COLUMN job_key DROP DEFAULT")
    op.execute("UPDATE jobs SET shard = jobfair_key_shard(job_key)")
    op.execute(
        "ALTER TABLE jobs ALTER COLUMN shard SET NOT NULL,"
        " DROP CONSTRAINT jobs_pkey,"
        " ADD CONSTRAINT jobs_pkey PRIMARY KEY (job_key, shard),"
        " ADD CONSTRAINT jobs_shard_check"
        f" CHECK (shard = (job_key & {SHARD_MASK}))"
    )
    op.execute("DROP INDEX jobs_idempotency_idx")
    op.execute(
        "CREATE UNIQUE INDEX jobs_idempotency_idx ON jobs (tenant_id, idempotency_key, shard)"
        " WHERE idempotency_key IS NOT NULL"
    )

    op.execute("ALTER TABLE job_events ADD COLUMN shard smallint")
    op.execute("UPDATE job_events SET shard = jobfair_key_shard(job_key)")
    op.execute(
        "ALTER TABLE job_events ALTER COLUMN shard SET NOT NULL,"
        " DROP CONSTRAINT job_events_pkey,"
        " ADD CONSTRAINT job_events_pkey PRIMARY KEY (job_key, activation_count, step, shard),"
        " ADD CONSTRAINT job_events_shard_check"
        f" CHECK (shard = (job_key & {SHARD_MASK}))"
    )

    op.execute("ALTER TABLE lanes ADD COLUMN shard smallint")
    op.execute("UPDATE lanes SET shard = jobfair_shard(tenant_id)")
    op.execute(
        "ALTER TABLE lanes ALTER COLUMN shard SET NOT NULL,"
        " DROP CONSTRAINT lanes_pkey,"
        " ADD CONSTRAINT lanes_pkey PRIMARY KEY (job_type, tenant_id, shard),"
        " ADD CONSTRAINT lanes_shard_check CHECK (shard = jobfair_shard(tenant_id))"
    )


def downgrade() -> None:
    # Forward-only, as every migration here; and the keys made since carry their shard.
    raise NotImplementedError("forward-only migrations")
