"""Fairness keys: a second level of stride scheduling inside each lane

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

Issue 28, section 1 (ADR 027): a job may carry a fairness key (an end user, a project:
whatever a tenant's own users are), and a tenant's share of a job type is divided among
its backlogged keys by key weight, as the type's activations are divided among its
tenants by tenant weight.

- ``jobs.fairness_key``: the job's key, ``''`` for the tenant's one default key (shown
  as ``<default>``).  A column with a constant default: no table rewrite.
- ``jobs_ready_idx`` gains the key after the tenant: ``(job_type, tenant_id,
  fairness_key, priority DESC, queued_at, job_key)``.  A claim walks one key's heads,
  as it walked one lane's; a lane's ready probe reads its last key's last entry.
- ``lane_keys``: one row per (job type, tenant, key), the key's virtual time, whether it
  may have ready jobs (``active``, kept by the lanes' no-lost-wake-up protocol, on the
  lane's bucket lock) and its running count of activations.  Distributed by the tenant's
  shard, beside its lane.  Every lane gets its default key's row, active if the lane is.
- ``key_weights``: a key's weight (keys without a row weigh 1), beside its tenant's keys.

Servers before this revision do not keep the key rows that activations now read (their
producers and sweepers would make jobs ready without waking their keys), and their claims
would read a lane's whole backlog through the new index: ``oldest_server`` is this
revision, and a deployment replaces every server at once (as for 0008).

The ready index is rebuilt: on a large backlog this takes a while, with writes to jobs
blocked.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Contracting: servers of 0009 neither wake keys nor claim by them (see above).
oldest_server = "0010"


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN fairness_key text NOT NULL DEFAULT ''")
    op.execute("DROP INDEX jobs_ready_idx")
    op.execute(
        "CREATE INDEX jobs_ready_idx ON jobs"
        " (job_type, tenant_id, fairness_key, priority DESC, queued_at, job_key)"
        " WHERE state = 'CREATED'"
    )
    op.execute(
        """CREATE TABLE lane_keys (
            job_type text NOT NULL,
            tenant_id text NOT NULL,
            fairness_key text NOT NULL,
            shard smallint NOT NULL,
            vtime double precision DEFAULT 0 NOT NULL,
            active boolean DEFAULT true NOT NULL,
            activated_total bigint DEFAULT 0 NOT NULL,
            CONSTRAINT lane_keys_pkey PRIMARY KEY (job_type, tenant_id, fairness_key, shard),
            CONSTRAINT lane_keys_shard_check CHECK (shard = jobfair_shard(tenant_id))
        ) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
                fillfactor = 50)"""
    )
    op.execute(
        "CREATE INDEX lane_keys_vtime_idx ON lane_keys"
        " (job_type, tenant_id, active, vtime, fairness_key)"
    )
    op.execute(
        """CREATE TABLE key_weights (
            tenant_id text NOT NULL,
            fairness_key text NOT NULL,
            shard smallint NOT NULL,
            weight integer NOT NULL,
            CONSTRAINT key_weights_pkey PRIMARY KEY (tenant_id, fairness_key, shard),
            CONSTRAINT key_weights_weight_check CHECK (weight BETWEEN 1 AND 10000),
            CONSTRAINT key_weights_shard_check CHECK (shard = jobfair_shard(tenant_id))
        )"""
    )
    # Every job so far has the default key: each lane's one key, active as its lane is.
    op.execute(
        "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active,"
        "                       activated_total)"
        " SELECT job_type, tenant_id, '', shard, 0, active, activated_total FROM lanes"
    )
    op.execute(f"UPDATE schema_compat SET oldest_server = '{oldest_server}'")


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
