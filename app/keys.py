"""API keys: who a request is, and which tenants and job types it may touch.

A key is a role (``admin``, ``producer``, ``worker``) with a tenant scope and a job-type
scope (each a list, or every one).  Its token is ``jf_<keyId>_<secret>``: the id makes the
lookup one indexed read, the secret is 256 random bits, and only the SHA-256 of the whole
token is stored (a fast hash is enough for a random 256-bit secret; ADR 019), compared in
constant time.

``KeyService`` verifies tokens for every server process on the database.  It keeps the
keys it has read for at most ``refresh_s`` before reading them again, so a revocation (or
an expiry, checked on every request) takes effect on every process within that time
without a read per request.  OAuth access tokens (``POST /oauth/token``) are JWTs signed
with a secret stored in the database (``signing_keys``), so any process verifies a token
another issued; they name their key, and are honoured only while that key is.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import jwt

from app.db import Database, job_rows, key_rows
from app.db.rows import JobRow, KeyRow
from app.domain import rfc3339, utcnow

log = logging.getLogger(__name__)
# Key created and revoked, configuration changed: who did it (a key id, never a secret).
audit = logging.getLogger("jobfair.audit")

TOKEN_PREFIX = "jf_"
KEY_ID_HEX = 16  # 64 random bits: ids are not secret, only unique
KEY_ID_RE = re.compile(f"^[0-9a-f]{{{KEY_ID_HEX}}}$")
ACCESS_TOKEN_ISSUER = "jobfair"
MAX_KEY_READS = 4  # per process
# A key's last use is written at most this often per key and process.
TOUCH_EVERY = timedelta(seconds=60)


class Role(StrEnum):
    ADMIN = "admin"
    PRODUCER = "producer"
    WORKER = "worker"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: a key's id, role and scopes (None: every tenant, or type)."""

    key_id: str | None  # None: auth is off
    role: Role
    tenants: frozenset[str] | None
    types: frozenset[str] | None

    @property
    def scoped(self) -> bool:
        """Whether some tenant or job type is out of this key's reach."""
        return self.tenants is not None or self.types is not None

    def sees(self, tenant: str, job_type: str) -> bool:
        return (self.tenants is None or tenant in self.tenants) and (
            self.types is None or job_type in self.types
        )


# The caller when auth is off (loopback only): every right, every tenant.
EVERYONE = Principal(None, Role.ADMIN, None, None)


def new_token() -> tuple[str, str]:
    """A new key's (id, token)."""
    key_id = secrets.token_hex(KEY_ID_HEX // 2)
    return key_id, f"{TOKEN_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def key_id_of(token: str) -> str | None:
    """The key id a token names, or None if it is not one of ours in form."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    key_id, sep, secret = token[len(TOKEN_PREFIX) :].partition("_")
    return key_id if sep and secret and KEY_ID_RE.fullmatch(key_id) else None


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def scope_list(values: Iterable[str] | None) -> list[str] | None:
    return None if values is None else sorted(set(values))


def live(row: KeyRow, now: datetime) -> bool:
    return row.revoked_at is None and (row.expires_at is None or row.expires_at > now)


def principal_of(row: KeyRow) -> Principal:
    return Principal(
        row.key_id,
        Role(row.role),
        None if row.tenants is None else frozenset(row.tenants),
        None if row.job_types is None else frozenset(row.job_types),
    )


@dataclass(slots=True)
class _Read:
    """A key as last read (None: no such key), and when (``time.monotonic``)."""

    row: KeyRow | None
    principal: Principal | None
    at: float


class KeyService:
    def __init__(
        self,
        db: Database,
        *,
        refresh_s: float = 0.5,
        access_token_ttl_s: int = 600,
        max_cached: int = 10_000,
        max_job_scopes: int = 100_000,
    ) -> None:
        self.db = db
        self.refresh_s = refresh_s
        self.access_token_ttl_s = access_token_ttl_s
        self.max_cached = max_cached
        self._reads: dict[str, _Read] = {}
        self._reading: dict[str, asyncio.Future[_Read]] = {}
        # Reads of keys at once: a flood of made-up key ids (each a read: nothing to
        # cache) waits here rather than taking the pool's connections from the jobs.
        self._readers = asyncio.Semaphore(MAX_KEY_READS)
        self._signing: bytes | None = None
        # Job key -> (tenant, type): never change, so kept (bounded, oldest dropped).
        self._job_scopes: dict[int, tuple[str, str]] = {}
        self.max_job_scopes = max_job_scopes
        self.reads = 0  # key reads that reached the database
        self._reading_now = 0
        self.peak_reads = 0  # most key reads at once

    # -- keys ---------------------------------------------------------------------------

    async def create(
        self,
        role: Role,
        tenants: Sequence[str] | None,
        types: Sequence[str] | None,
        name: str | None,
        expires_at: datetime | None,
        created_by: str | None,
    ) -> tuple[KeyRow, str]:
        """A new key and its token (the only time the token exists outside a client)."""
        key_id, token = new_token()
        row = await key_rows.insert(
            self.db,
            key_id,
            digest(token),
            role.value,
            scope_list(tenants),
            scope_list(types),
            name,
            expires_at,
            utcnow(),
            created_by,
        )
        audit.info(
            "key created: %s role=%s tenants=%s types=%s by=%s",
            key_id,
            role.value,
            _scope_text(row.tenants),
            _scope_text(row.job_types),
            created_by or "-",
        )
        return row, token

    async def list(self) -> list[KeyRow]:
        return await key_rows.list_all(self.db)

    async def revoke(self, key_id: str, by: str | None) -> KeyRow | None:
        now = utcnow()
        row = await key_rows.revoke(self.db, key_id, now)
        self._reads.pop(key_id, None)
        if row is not None and row.revoked_at == now:  # not revoked before
            audit.info("key revoked: %s by=%s", key_id, by or "-")
        return row

    # -- verifying ------------------------------------------------------------------------

    async def verify(self, token: str) -> Principal | None:
        """The principal of a key token (``jf_...``) or an access token; None if it is
        neither, or names a key that is unknown, revoked or expired."""
        key_id = key_id_of(token)
        if key_id is None:
            return await self.verify_access_token(token)
        read = self._reads.get(key_id)
        if read is None or time.monotonic() - read.at >= self.refresh_s:
            read = await self._read(key_id)
        row = read.row
        if row is None or not hmac.compare_digest(digest(token), row.secret_sha256):
            return None
        if row.expires_at is None and row.revoked_at is None:
            return read.principal
        return read.principal if live(row, utcnow()) else None

    async def still_live(self, caller: Principal) -> bool:
        """Whether the key ``caller`` was verified with is still live (neither revoked nor
        expired), as of at most ``refresh_s`` ago: asked again by a long poll before it
        answers with jobs, and by a stream before each delivery."""
        if caller.key_id is None:
            return True
        read = self._reads.get(caller.key_id)
        if read is None or time.monotonic() - read.at >= self.refresh_s:
            read = await self._read(caller.key_id)
        return read.row is not None and live(read.row, utcnow())

    async def verify_basic(self, user: str, password: str) -> Principal | None:
        """HTTP Basic: the key id as user name, the token as password."""
        if key_id_of(password) != user:
            return None
        return await self.verify(password)

    async def _read(self, key_id: str) -> _Read:
        """The key as read at most ``refresh_s`` ago; one read in flight per key."""
        read = self._reads.get(key_id)
        if read is not None and time.monotonic() - read.at < self.refresh_s:
            return read
        pending = self._reading.get(key_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_Read] = asyncio.get_running_loop().create_future()
        self._reading[key_id] = future
        try:
            async with self._readers:
                now = utcnow()
                self.reads += 1
                self._reading_now += 1
                self.peak_reads = max(self.peak_reads, self._reading_now)
                try:
                    row = await key_rows.in_use(self.db, key_id, now, now - TOUCH_EVERY)
                finally:
                    self._reading_now -= 1
            read = _Read(row, None if row is None else principal_of(row), time.monotonic())
            if row is not None:  # made-up ids are not kept: they must not evict real keys
                if len(self._reads) >= self.max_cached:
                    self._reads.pop(next(iter(self._reads)))
                self._reads[key_id] = read
            future.set_result(read)
            return read
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters (if any) get it from their await
            raise
        finally:
            del self._reading[key_id]

    # -- OAuth 2.0 client credentials -------------------------------------------------------

    async def issue_access_token(self, client_id: str, client_secret: str) -> str | None:
        """A signed access token for the key (``client_id``, ``client_secret`` = its id and
        token), or None if they do not name a live key."""
        principal = await self.verify_basic(client_id, client_secret)
        if principal is None:
            return None
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ACCESS_TOKEN_ISSUER,
            "sub": client_id,
            "iat": now,
            "exp": now + self.access_token_ttl_s,
            "role": principal.role.value,
            "tenants": scope_list(principal.tenants),
            "types": scope_list(principal.types),
        }
        return jwt.encode(claims, await self._signing_secret(), algorithm="HS256")

    async def verify_access_token(self, token: str) -> Principal | None:
        """The principal of an access token this database's servers signed, while its key
        is live (a revoked key's tokens stop with it)."""
        if token.count(".") != 2 or len(token) > 4096:
            return None
        try:
            claims = jwt.decode(
                token,
                await self._signing_secret(),
                algorithms=["HS256"],
                issuer=ACCESS_TOKEN_ISSUER,
                options={"verify_aud": False, "require": ["exp", "sub", "iss"]},
            )
        except jwt.PyJWTError:
            return None
        key_id = claims["sub"]
        if not isinstance(key_id, str) or not KEY_ID_RE.fullmatch(key_id):
            return None
        read = await self._read(key_id)
        if read.row is None or not live(read.row, utcnow()):
            return None
        return read.principal

    async def _signing_secret(self) -> bytes:
        if self._signing is None:
            self._signing = await key_rows.signing_secret(self.db, utcnow())
        return self._signing

    # -- the tenants and types of jobs, for scoped keys ------------------------------------

    def remember(self, rows: Iterable[JobRow]) -> None:
        """Keep the scope of jobs this process handed out (their finish needs no read)."""
        scopes = self._job_scopes
        for r in rows:
            scopes[r.job_key] = (r.tenant_id, r.job_type)
        while len(scopes) > self.max_job_scopes:
            scopes.pop(next(iter(scopes)))

    def known_scope(self, job_key: int) -> tuple[str, str] | None:
        """The (tenant, type) of a job this process has seen, without a read."""
        return self._job_scopes.get(job_key)

    async def job_scopes(self, job_keys: Sequence[int]) -> dict[int, tuple[str, str]]:
        """(tenant, type) of each of ``job_keys`` that exists."""
        known = self._job_scopes
        found = {k: known[k] for k in job_keys if k in known}
        missing = [k for k in job_keys if k not in found]
        if missing:
            read = await job_rows.scopes(self.db, missing)
            found.update(read)
        return found


def _scope_text(values: Sequence[str] | None) -> str:
    return "*" if values is None else ",".join(values)


def key_record(row: KeyRow) -> dict[str, Any]:
    """A key as the API answers it (never its secret, nor its hash)."""
    return {
        "keyId": row.key_id,
        "role": row.role,
        "tenants": "*" if row.tenants is None else row.tenants,
        "types": "*" if row.job_types is None else row.job_types,
        "name": row.name,
        "expiresAt": rfc3339(row.expires_at),
        "createdAt": rfc3339(row.created_at),
        "createdBy": row.created_by,
        "lastUsedAt": rfc3339(row.last_used_at),
        "revokedAt": rfc3339(row.revoked_at),
    }
