"""API keys and the OAuth signing secret: the statements behind ``app.keys``.

None is on a job's path: a server reads a key when it first sees it and again at most
every ``KeyService.refresh_s`` (``app.keys``), not per request.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.db import sql
from app.db.base import Queries
from app.db.rows import KeyRow

SQL = sql.load("keys")  # app/db/sql/keys.sql


def _row(r: Any) -> KeyRow:
    """A key from a record whose first columns are a key's (app/db/sql/keys.sql)."""
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
        *SQL["insert_key"].bind(
            key_id=key_id,
            secret_sha256=secret_sha256,
            role=role,
            tenants=None if tenants is None else list(tenants),
            job_types=None if job_types is None else list(job_types),
            name=name,
            expires_at=expires_at,
            now=now,
            created_by=created_by,
        )
    )
    return _row(row)


async def in_use(db: Queries, key_id: str, now: datetime, touch_before: datetime) -> KeyRow | None:
    row = await db.fetchrow(
        *SQL["key_in_use"].bind(key_id=key_id, now=now, touch_before=touch_before)
    )
    return None if row is None else _row(row)


async def list_all(db: Queries) -> list[KeyRow]:
    return [_row(r) for r in await db.fetch(*SQL["list_keys"].bind())]


async def revoke(db: Queries, key_id: str, now: datetime) -> KeyRow | None:
    row = await db.fetchrow(*SQL["revoke_key"].bind(key_id=key_id, now=now))
    return None if row is None else _row(row)


async def signing_secret(db: Queries, now: datetime) -> bytes:
    made = SQL["signing_secret"].bind(secret=secrets.token_bytes(32), now=now)
    secret: bytes = await db.fetchval(*made)
    return secret
