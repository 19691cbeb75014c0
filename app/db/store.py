"""What activation asks of the store, one method per statement and a params dataclass
for each that takes more than one value (one value is its own params); ``begin()``
answers the same interface inside a transaction (the capped claim's: its locks, counts,
claim and tokens commit together).
``app.activation`` reaches the database through this alone (``ports.Store``), and its
tests can hold it to that."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db import claims, finishing, job_rows, lanes, operating, parking, settling
from app.db.base import Queries, Sessions
from app.db.claims import Counted, LeadAsk, Share
from app.db.rows import (
    Claimed,
    Ended,
    Inserted,
    JobFence,
    JobRow,
    KeyRead,
    LaneRead,
    LeadClaim,
    TypeConfig,
)
from app.scheduler import Buckets, Charges, LaneKey, Settled

__all__ = [
    "ChargeAsk",
    "ClaimAsk",
    "CountAsk",
    "Counted",
    "HandOffAsk",
    "InsertAsk",
    "KeysAsk",
    "LaneAsk",
    "LeadAsk",
    "LeadClaimAsk",
    "ParkAsk",
    "SettleAsk",
    "Share",
    "Store",
    "TokensAsk",
]


@dataclass(frozen=True, slots=True)
class LaneAsk:
    """A lane read (read_lanes): the type's first ``limit`` lanes with a ready job, not
    ``exclude``d, of ``tenant_ids`` (None: all), after writing ``charges`` owed."""

    job_type: str
    limit: int
    exclude: Sequence[str]
    tenant_ids: Sequence[str] | None
    charges: Charges | None = None
    # The charges only counted in the read, not written (ADR 036).
    counted: bool = False


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """A claim: ``counts`` jobs per (tenant, key), shared out among ``shares`` in their
    order, leased from ``now``; ``hold``: the capped tenants' room (a capped claim)."""

    job_type: str
    counts: Mapping[LaneKey, int]
    now: datetime
    shares: Sequence[Share]
    via_stream: bool
    aging_step: int
    aging_interval_ms: int
    by_worker_time: bool = False
    hold: Mapping[str, int] | None = None
    fifo: bool = False  # each key's head alone (the type's keys are FIFO, ADR 041)


@dataclass(frozen=True, slots=True)
class CountAsk:
    """A capped claim's locks and counts (lock_and_count)."""

    job_type: str
    lock_type: bool
    lock_tenants: Sequence[str]
    type_cap: int | None
    capped: Sequence[str]
    type_limited: bool
    limited: Sequence[str]


@dataclass(frozen=True, slots=True)
class KeyCountAsk:
    """A claim's key caps (lock_and_count_keys, ADR 040): the keys read that have a cap,
    and the type's per-key cap."""

    job_type: str
    keys: Sequence[LaneKey]
    per_key: int | None


@dataclass(frozen=True, slots=True)
class KeysAsk:
    """A key read (read_keys): the first ``wants[tenant]`` active keys of each lane, not
    ``exclude``d."""

    job_type: str
    wants: Mapping[str, int]
    exclude: Sequence[LaneKey]
    # Key charges counted and not yet written (ADR 036): jobs and stride per job, added
    # to the keys' vtimes as read.
    owed: Mapping[LaneKey, tuple[int, float]] | None = None


@dataclass(frozen=True, slots=True)
class ChargeAsk:
    """Lanes and keys charged their claimed jobs (charge_lanes)."""

    job_type: str
    charges: Charges


@dataclass(frozen=True, slots=True)
class ParkAsk:
    """Lanes (and keys) found empty, to park (park_lanes), tried ``retries`` more times."""

    job_type: str
    tenant_ids: Sequence[str]
    keys: Sequence[LaneKey] = ()
    retries: int = 0


@dataclass(frozen=True, slots=True)
class SettleAsk:
    """Worker-time settlements of ended activations, per lane and per key (settle_lanes)."""

    job_type: str
    lanes: Mapping[str, Settled]
    keys: Mapping[LaneKey, Settled]


@dataclass(frozen=True, slots=True)
class LeadClaimAsk:
    """One stride pick read and claimed at once (claim_lead), at ``now``."""

    job_type: str
    lead: LeadAsk
    now: datetime


@dataclass(frozen=True, slots=True)
class HandOffAsk:
    """A hand-off: ``job`` inserted and its type's lead pick claimed in one transaction."""

    job: Mapping[str, Any]
    now: datetime
    lead: LeadAsk


@dataclass(frozen=True, slots=True)
class TokensAsk:
    """What a rate-limited claim that took ``taken`` jobs per tenant (``total`` in all)
    left in the buckets it ``read`` (take_tokens)."""

    job_type: str
    read: Buckets
    taken: Mapping[str, int]
    total: int


@dataclass(frozen=True, slots=True)
class InsertAsk:
    """Jobs to insert (insert_jobs), as the API spells them, at ``now``."""

    jobs: Sequence[Mapping[str, Any]]
    now: datetime


class Store:
    """The store as activation sees it, on the pool or (``begin``) in a transaction."""

    def __init__(self, db: Any) -> None:
        # The Database (each statement autocommits), or a connection in a transaction.
        self._db = db

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[Store]:
        async with self._db.transaction() as tx:
            yield Store(tx)

    # -- lanes and keys -----------------------------------------------------------------

    async def type_config(self, job_type: str) -> TypeConfig:
        return await operating.type_config(self._queries, job_type)

    async def read_lanes(self, ask: LaneAsk) -> LaneRead:
        return await lanes.read(
            self._queries,
            ask.job_type,
            ask.limit,
            ask.exclude,
            ask.tenant_ids,
            ask.charges,
            counted=ask.counted,
        )

    async def read_keys(self, ask: KeysAsk) -> KeyRead:
        return await lanes.read_keys(self._queries, ask.job_type, ask.wants, ask.exclude, ask.owed)

    async def charge(self, ask: ChargeAsk) -> tuple[list[str], list[LaneKey]]:
        return await lanes.charge(self._queries, ask.job_type, ask.charges)

    async def park(self, ask: ParkAsk) -> list[str]:
        return await parking.park(
            self._sessions, ask.job_type, ask.tenant_ids, keys=ask.keys, retries=ask.retries
        )

    async def settle(self, ask: SettleAsk) -> int:
        return await settling.settle(self._queries, ask.job_type, ask.lanes, ask.keys)

    @property
    def degraded(self) -> bool:
        """Whether the job table holds many dead row versions (ClaimHints, ADR 036): lane
        charges are then written at most every LaneCharges.CHARGE_EVERY_S."""
        hints = getattr(self._db, "claim_hints", None)
        return hints is not None and hints.degraded

    # -- claims -------------------------------------------------------------------------

    async def claim(self, ask: ClaimAsk) -> list[Claimed]:
        return await claims.claim(
            self._queries,
            ask.job_type,
            ask.counts,
            now=ask.now,
            shares=ask.shares,
            via_stream=ask.via_stream,
            aging_step=ask.aging_step,
            aging_interval_ms=ask.aging_interval_ms,
            by_worker_time=ask.by_worker_time,
            hold=ask.hold,
            fifo=ask.fifo,
        )

    async def claim_lead(self, ask: LeadClaimAsk) -> LeadClaim:
        return await claims.claim_lead(self._queries, ask.job_type, ask.lead, ask.now)

    async def insert_and_claim_lead(self, ask: HandOffAsk) -> tuple[int, LeadClaim]:
        return await claims.insert_and_claim_lead(self._sessions, ask.job, ask.now, ask.lead)

    async def count_minimums(self, tenants: Sequence[str]) -> dict[str, tuple[int, int]]:
        return await claims.count_minimums(self._queries, tenants)

    async def lock_and_count(self, ask: CountAsk) -> Counted:
        return await claims.lock_and_count(
            self._queries,
            ask.job_type,
            lock_type=ask.lock_type,
            lock_tenants=ask.lock_tenants,
            type_cap=ask.type_cap,
            capped=ask.capped,
            type_limited=ask.type_limited,
            limited=ask.limited,
        )

    async def lock_and_count_keys(self, ask: KeyCountAsk) -> dict[LaneKey, int]:
        return await claims.lock_and_count_keys(self._queries, ask.job_type, ask.keys, ask.per_key)

    async def hold_keys(self, job_type: str, keys: Sequence[LaneKey]) -> None:
        await claims.hold_keys(self._queries, job_type, keys)

    async def take_tokens(self, ask: TokensAsk) -> None:
        await claims.take_tokens(self._queries, ask.job_type, ask.read, ask.taken, ask.total)

    # -- jobs ---------------------------------------------------------------------------

    async def release(self, rows: Sequence[JobRow]) -> list[Ended]:
        return await finishing.release(self._sessions, rows)

    async def fences(self, job_keys: Sequence[int]) -> dict[int, JobFence]:
        return await job_rows.fences(self._queries, job_keys)

    async def insert(self, ask: InsertAsk) -> list[Inserted]:
        return await job_rows.insert(self._sessions, ask.jobs, ask.now)

    @property
    def _queries(self) -> Queries:
        q: Queries = self._db
        return q

    @property
    def _sessions(self) -> Sessions:
        s: Sessions = self._db
        return s
