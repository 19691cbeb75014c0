"""API keys and the OAuth signing secret: the statements behind ``app.keys``.

None is on a job's path: a server reads a key when it first sees it and again at most
every ``KeyService.refresh_s`` (``app.keys``), not per request.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.db.base import Queries
from app.db.rows import KeyRow

KEY_COLUMNS = """key_id, secret_sha256, role, tenants, job_types, name, expires_at,
    created_at, created_by, last_used_at, revoked_at"""

# -- name: insert_key
# A new key.  Index: api_keys pkey.
INSERT_KEY = f"""
INSERT INTO api_keys (key_id, secret_sha256, role, tenants, job_types, name, expires_at,
                      created_at, created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING {KEY_COLUMNS}
"""

# -- name: key_in_use
# A key, read to verify a request, and its last use recorded when the one on record is
# older than $3 (so a busy key is written about once a minute, not per request).
# Index: api_keys pkey.  The CTE's row lock is taken only when it writes.
KEY_IN_USE = f"""
WITH touched AS (
    UPDATE api_keys SET last_used_at = $2
    WHERE key_id = $1 AND (last_used_at IS NULL OR last_used_at < $3)
    RETURNING key_id
)
SELECT {KEY_COLUMNS}, (SELECT count(*) FROM touched) AS _touched
FROM api_keys WHERE key_id = $1
"""

# -- name: list_keys
# Every key, newest first (revoked ones too: the audit trail).
LIST_KEYS = f"SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at DESC, key_id"

# -- name: revoke_key
# Revoke a key (again: no change, the first revocation's time stays).  Index: pkey.
REVOKE_KEY = f"""
UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE key_id = $1
RETURNING {KEY_COLUMNS}
"""

# -- name: signing_secret
# The secret OAuth access tokens are signed with: made by the first caller ($1, random),
# the same for every later one and every process.
SIGNING_SECRET = """
WITH made AS (
    INSERT INTO signing_keys (id, secret, created_at) VALUES (1, $1, $2)
    ON CONFLICT (id) DO NOTHING
    RETURNING secret
)
SELECT secret FROM made UNION ALL SELECT secret FROM signing_keys WHERE id = 1 LIMIT 1
"""


def _row(r: Any) -> KeyRow:
    """A key from a record whose first columns are KEY_COLUMNS."""
    return KeyRow(*tuple(r)[: len(KeyRow._fields)])


async def insert(
    db: Queries,
    key_id: str,
    secret_sha256: bytes,
    role: str,
    tenants: Sequence[str] | None,
    job_types: Sequence[str] | None,
    name: str | None,
    expires_at: datetime | None,
    now: datetime,
    created_by: str | None,
) -> KeyRow:
    row = await db.fetchrow(
        INSERT_KEY,
        key_id,
        secret_sha256,
        role,
        None if tenants is None else list(tenants),
        None if job_types is None else list(job_types),
        name,
        expires_at,
        now,
        created_by,
    )
    return _row(row)


async def in_use(db: Queries, key_id: str, now: datetime, touch_before: datetime) -> KeyRow | None:
    row = await db.fetchrow(KEY_IN_USE, key_id, now, touch_before)
    return None if row is None else _row(row)


async def list_all(db: Queries) -> list[KeyRow]:
    return [_row(r) for r in await db.fetch(LIST_KEYS)]


async def revoke(db: Queries, key_id: str, now: datetime) -> KeyRow | None:
    row = await db.fetchrow(REVOKE_KEY, key_id, now)
    return None if row is None else _row(row)


async def signing_secret(db: Queries, now: datetime) -> bytes:
    secret: bytes = await db.fetchval(SIGNING_SECRET, secrets.token_bytes(32), now)
    return secret
