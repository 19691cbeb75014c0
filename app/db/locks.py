"""Advisory lock keys and the statements that take them.

Three kinds of lock order the writers of lanes (see ``app.db.lanes`` for the protocols):

* lane buckets (``LANE_LOCK_CLASS``): shared by whoever makes jobs ready, exclusive (tried,
  or waited for a bounded time) by a park;
* cap locks (``TYPE_CAP_LOCK_CLASS``, ``TENANT_CAP_LOCK_CLASS``, ``KEY_CAP_LOCK_CLASS``,
  taken in that order): a capped claim counts and claims under them, and whatever frees a
  capped tenant's or key's capacity releases its held lanes or keys under them;
* the release gate (``RELEASE_GATE_CLASS``, key 0): finishes take it shared, a tenant's
  configuration change exclusively after it committed;
* a job type's per-key configuration (``TYPE_KEYS_LOCK_CLASS``): the claims counting its
  keys take it shared (before the keys' cap locks), a change of the type exclusively;
* the migration lock (``MIGRATION_LOCK_CLASS``, key 0): ``MIGRATION_LOCK``.

Keys live in PostgreSQL's two-int4 space, which never overlaps the one-bigint space of
the leader lock.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

from app.db.bounds import KEY_CAP_LOCK_CLASS as KEY_CAP_LOCK_CLASS
from app.db.bounds import RELEASE_GATE_CLASS as RELEASE_GATE_CLASS
from app.db.bounds import TENANT_CAP_LOCK_CLASS as TENANT_CAP_LOCK_CLASS
from app.db.bounds import TYPE_KEYS_LOCK_CLASS as TYPE_KEYS_LOCK_CLASS

LANE_LOCK_CLASS = 0x4A460001
TYPE_CAP_LOCK_CLASS = 0x4A460002
# TENANT_CAP_LOCK_CLASS (0x4A460003) and RELEASE_GATE_CLASS (0x4A460004; key 0 is the gate
# between finishes and tenant configuration changes: jobfair_release_holds, alembic 0004)
# are named by .sql files too, so they are written in app.db.bounds, imported above.
# Key 0 of this class is held by a migration for its whole transaction (alembic/env.py).
MIGRATION_LOCK_CLASS = 0x4A460005
LEADER_LOCK_KEY = 0x4A46_4C45_4144  # one-bigint space: "JFLEAD"
# Lanes share this many lock buckets, so a 10,000-lane batch takes at most this many locks.
LANE_BUCKETS = 1024


def lane_bucket(job_type: str, tenant_id: str) -> int:
    """The advisory-lock bucket of a lane (stable across processes and restarts)."""
    return zlib.crc32(f"{job_type}\x1f{tenant_id}".encode()) % LANE_BUCKETS


def int4(value: int) -> int:
    """``value`` as the signed 32-bit integer PostgreSQL's two-int4 lock keys take."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def cap_key(name: str) -> int:
    """The cap-lock key of a job type (tenants' keys are hashed in SQL, alembic 0003)."""
    return int4(zlib.crc32(name.encode()))


def buckets_of(lanes: Iterable[tuple[str, str]]) -> list[int]:
    """The lane buckets of (job type, tenant) pairs, in lock order."""
    return sorted({lane_bucket(job_type, tenant) for job_type, tenant in lanes})


def lock_sql(fn: str, klass: int, keys: Sequence[int]) -> str:
    """One statement calling ``fn(class, key)`` per key, in the order given: literal
    integers only, so the SQL is safe, and one simple-protocol round trip."""
    calls = ", ".join(f"{fn}({int4(klass)}, {int(k)})" for k in keys)
    return f"SELECT {calls}"


def share_buckets_sql(buckets: Sequence[int]) -> str:
    """The shared bucket locks a maker of ready jobs takes (``app.db.lanes``)."""
    return lock_sql("pg_advisory_xact_lock_shared", LANE_LOCK_CLASS, buckets)


# Taken first in a migration's transaction (alembic/env.py), so that migrations started
# at once (N replicas' ``jobfair migrate``) run one after the other: the second reads the
# version the first committed and has nothing left to do, instead of creating the same
# tables and failing on them.  Transaction-scoped: a migration that dies releases it.
MIGRATION_LOCK = f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_CLASS}, 0)"
