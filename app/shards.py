"""Shards: the part of the tables, and of the key space, a tenant's jobs and lanes live in.

One PostgreSQL needs none of this; a distributed one (Citus, distributed by ``shard``)
does, and the schema carries it now (alembic 0008, docs/scaling.md, ADR 024), so that
the move needs no new keys and no rewrite of the tables.

* A tenant's shard is a hash of its id: the first 11 bits of its MD5, 0 to 2047.  Every
  job and lane of a tenant has its shard, so a tenant's rows are always together.
* A job key carries its shard in its low 11 bits: ``(n << 11) | shard``, n from the one
  key sequence.  A key alone tells where its job is, so a lookup by key is single-shard;
  and keys still grow in the order jobs are made, whatever their tenants, so the primary
  key is still appended to at its right edge and key order is still creation order.
  (With the shard in the high bits, as Zeebe puts its partition, a batch over 100
  tenants inserted into 100 places of the primary key and cost PostgreSQL a third more
  per job: ADR 024.)

The SQL functions of alembic 0008 (``jobfair_shard``, ``jobfair_job_key``,
``jobfair_key_shard``) are the twins of these; tests/integration/test_citus_readiness.py
checks that they agree.
"""

from __future__ import annotations

import hashlib

SHARD_BITS = 11
SHARDS = 1 << SHARD_BITS
SHARD_MASK = SHARDS - 1


def shard_of(tenant_id: str) -> int:
    """The tenant's shard, 0 to SHARDS - 1: the first 11 bits of the MD5 of its id
    (ASCII: TENANT_ID_RE)."""
    first = int.from_bytes(hashlib.md5(tenant_id.encode()).digest()[:2], "big")
    return first >> (16 - SHARD_BITS)


def job_key(shard: int, n: int) -> int:
    """The key of the job numbered ``n`` (a value of the key sequence, below 2**52) in
    ``shard``."""
    return (n << SHARD_BITS) | shard


def shard_of_key(key: int) -> int:
    """The shard a job key names."""
    return key & SHARD_MASK
