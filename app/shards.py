"""Shards: the part of the key space, and of the tables, a tenant's jobs and lanes live in.

One PostgreSQL needs none of this; a distributed one (Citus, distributed by ``shard``)
does, and the schema carries it now (alembic 0008, docs/scaling.md), so that the move
needs no new keys and no rewrite of the tables.

* A tenant's shard is a hash of its id: 11 bits of its MD5, XOR those of the default
  tenant, so that the default tenant is shard 0.  Every job and lane of a tenant has its
  shard, so a tenant's rows are always together.
* A job key carries its shard in its high bits, as Zeebe's keys carry their partition:
  ``((shard + 1) << 51) | n``, n from the one key sequence.  The default tenant's keys are
  therefore Camunda's partition 1 (2251799813685249 and on), as every key was before, and
  a key alone tells where its job is: a lookup by key is single-shard.

The SQL functions of alembic 0008 (``jobfair_shard``, ``jobfair_job_key``,
``jobfair_key_shard``) are the twins of these; tests/integration/test_citus_readiness.py
checks that they agree.
"""

from __future__ import annotations

import hashlib

from app.domain import DEFAULT_TENANT

SHARD_BITS = 11
SHARDS = 1 << SHARD_BITS
# The bits of a key below its shard: Camunda's (Zeebe's) key layout.
KEY_BITS = 51
KEY_COUNTER_MASK = (1 << KEY_BITS) - 1


def _hash(tenant_id: str) -> int:
    """The first 11 bits of the MD5 of the tenant's id (ASCII: TENANT_ID_RE)."""
    return int.from_bytes(hashlib.md5(tenant_id.encode()).digest()[:2], "big") >> (16 - SHARD_BITS)


_DEFAULT_HASH = _hash(DEFAULT_TENANT)


def shard_of(tenant_id: str) -> int:
    """The tenant's shard, 0 to SHARDS - 1 (0 for the default tenant)."""
    return _hash(tenant_id) ^ _DEFAULT_HASH


def job_key(shard: int, n: int) -> int:
    """The key of the job numbered ``n`` (a value of the key sequence) in ``shard``."""
    return ((shard + 1) << KEY_BITS) | (n & KEY_COUNTER_MASK)


def shard_of_key(key: int) -> int:
    """The shard a job key names (negative for a key below 2**51, which no job has)."""
    return (key >> KEY_BITS) - 1
