"""What a job browser asks of the server: jobs listed page by page, a job's attempt
history, and the operators' bulk retry and cancel."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db import Database, bulk, history, listing, operating
from app.domain import FailedFilter, JobFilter, job_record, rfc3339, utcnow
from app.errors import InvalidArgument, NotFound
from app.scheduler import Aging

# Rows per transaction of a bulk operation: locks and dead tuples stay those of a batch.
BULK_BATCH = 1000
# A cursor's MAC key.  Not a secret: a cursor is checked so that a changed or garbled one
# is a 400, not a page of something else; any key's scope is applied to every page.
_CURSOR_KEY = b"jobfair list cursor v1"
_CURSOR_VERSION = "1"
INT64_MAX = (1 << 63) - 1
_CURSOR_CHARS = re.compile(r"[A-Za-z0-9_-]{1,200}")


@dataclass(frozen=True, slots=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


def _fingerprint(f: JobFilter) -> str:
    """What a cursor is bound to: the filters (not the limit, nor the key's scope)."""
    states = ",".join(sorted(s.value for s in f.states)) if f.states is not None else "*"
    parts = [
        f.job_type or "",
        f.tenant_id or "",
        states,
        rfc3339(f.created_after) or "",
        rfc3339(f.created_before) or "",
    ]
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=6).hexdigest()


def _mac(payload: str) -> str:
    return hmac.new(_CURSOR_KEY, payload.encode(), hashlib.blake2b).hexdigest()[:16]


def encode_cursor(f: JobFilter, last_key: int) -> str:
    """An opaque cursor: the page's last key, bound to its filters, with a MAC."""
    payload = f"{_CURSOR_VERSION}:{last_key}:{_fingerprint(f)}"
    raw = f"{payload}:{_mac(payload)}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(f: JobFilter, cursor: str) -> int:
    """The key a cursor of these filters continues below; 400 for anything else."""
    refused = InvalidArgument(
        "cursor is not one this listing answered for these filters (it was changed, or "
        "made for other filters); start again without it"
    )
    if not _CURSOR_CHARS.fullmatch(cursor):  # b64decode would drop other characters
        raise refused
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        raise refused from None
    version, key, fingerprint, mac = (raw.split(":") + ["", "", "", ""])[:4]
    payload = f"{version}:{key}:{fingerprint}"
    if raw != f"{payload}:{mac}" or not hmac.compare_digest(mac, _mac(payload)):
        raise refused
    if version != _CURSOR_VERSION or fingerprint != _fingerprint(f):
        raise refused
    if not (key.isascii() and key.isdigit() and len(key) <= 19 and int(key) <= INT64_MAX):
        raise refused
    return int(key)


class BrowserService:
    def __init__(self, db: Database, resolve_aging: Callable[[int | None, int | None], Aging]):
        self.db = db
        self.resolve_aging = resolve_aging

    async def list_jobs(self, f: JobFilter, cursor: str | None, limit: int) -> Page:
        """A page of jobs matching ``f``, newest first, and the cursor of the next one
        (None: this is the last).  One more row is read than answered, to know."""
        before = None if cursor is None else decode_cursor(f, cursor)
        if _empty_scope(f):
            return Page([], None)
        rows = await listing.list_jobs(self.db, f, before, limit + 1)
        now = utcnow()
        items = [
            job_record(row, now, self.resolve_aging(cfg.aging_interval_ms, cfg.aging_step))
            for row, cfg in rows[:limit]
        ]
        more = len(rows) > limit
        return Page(items, encode_cursor(f, rows[limit - 1][0].job_key) if more else None)

    async def history(self, job_key: int) -> history.History:
        found = await history.read(self.db, job_key)
        if found is None:
            raise NotFound(f"job {job_key} does not exist")
        return found

    async def retry_failed(self, f: FailedFilter, retries: int, limit: int) -> tuple[int, bool]:
        """Revive up to ``limit`` FAILED jobs matching ``f``, oldest key first, a batch
        per transaction; how many, and whether more match."""
        total, after = 0, 0
        while total < limit:
            ask = min(BULK_BATCH, limit - total)
            batch = await bulk.failed_batch(self.db, f, after, ask)
            if batch:
                total += await bulk.revive(self.db, batch, retries, utcnow())
                after = batch[-1][0]
            if len(batch) < ask:
                return total, False
        return total, bool(await bulk.failed_batch(self.db, f, after, 1))

    async def count_failed(self, f: FailedFilter, limit: int) -> tuple[int, bool]:
        """How many FAILED jobs match ``f``, counted up to ``limit`` (as retry_failed
        reads them, changing nothing), and whether more do."""
        total, after = 0, 0
        while total < limit:
            ask = min(BULK_BATCH, limit - total)
            batch = await bulk.failed_batch(self.db, f, after, ask)
            total += len(batch)
            if len(batch) < ask:
                return total, False
            after = batch[-1][0]
        return total, bool(await bulk.failed_batch(self.db, f, after, 1))

    async def cancel_created(
        self, tenant_id: str, job_type: str | None, limit: int
    ) -> tuple[int, bool]:
        """Cancel up to ``limit`` CREATED jobs of a tenant (delayed ones too), lane by
        lane from the head of each queue, then the delayed ones, a batch per
        transaction; how many, and whether more remain.  Lanes and keys emptied are
        parked."""
        total = 0
        types = [job_type] if job_type is not None else await bulk.tenant_lanes(self.db, tenant_id)
        for t in types:
            canceled = 0
            keys: set[str] = set()
            while total < limit:
                ask = min(BULK_BATCH, limit - total)
                n, of_keys = await bulk.cancel_ready(self.db, t, tenant_id, ask, utcnow())
                total += n
                canceled += n
                keys.update(of_keys)
                if n < ask:
                    break
            if canceled:
                await bulk.park(self.db, t, tenant_id, sorted(keys))
        while total < limit:
            ask = min(BULK_BATCH, limit - total)
            n = await bulk.cancel_delayed(self.db, tenant_id, job_type, ask, utcnow())
            total += n
            if n < ask:
                break
        if total:
            # A FIFO key held behind a head canceled here goes on (ADR 041): the held keys
            # with room are let go, as the leader's sweep would within its interval.
            await operating.release_held_keys(self.db)
        more = total >= limit and await bulk.any_created(self.db, tenant_id, job_type)
        return total, more


def _empty_scope(f: JobFilter) -> bool:
    """A filter naming a tenant or type outside the caller's scope matches nothing."""
    return (
        f.tenant_id is not None and f.tenant_scope is not None and f.tenant_id not in f.tenant_scope
    ) or (f.job_type is not None and f.type_scope is not None and f.job_type not in f.type_scope)


def history_record(h: history.History) -> dict[str, Any]:
    """``GET /v2/jobs/{jobKey}/history``'s answer."""
    return {
        "items": [
            {
                "at": rfc3339(e.at),
                "event": e.event,
                "activationCount": e.activation_count,
                "worker": e.worker,
                "deadline": rfc3339(e.deadline),
                "errorCode": e.error_code,
                "errorMessage": e.error_message,
                "retries": e.retries,
            }
            for e in h.entries
        ],
        "truncated": h.truncated,
    }


def parse_instant(value: str | None) -> datetime | None:
    """An instant the request models validated (schemas.instant: UTC isoformat)."""
    return None if value is None else datetime.fromisoformat(value)
