"""The one door into activation: ``Activation``.

Three ways in, by how the caller waits: ``activate`` (now, no waiting), ``long_poll``
(up to a timeout, for at least one job) and ``stream`` (an SSE subscription with credit).
Behind them, in this package: the waiters and their dispatchers (``waiting``), the
streams (``streaming``), the coalescing of callers and the rounds (``rounds``), the
charges written behind them (``charging``); the decisions are the scheduler's
(``app.scheduler``, pure).  The caller comes in through the ``Caller`` port
(``ports``): its liveness, its key's waiter places, the worker sightings.  The producer's
side meets activation at one more door, ``hand_off``: a new job given straight to a
waiting worker (ADR 012).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.activation.ports import ActivateRequest, Caller
from app.activation.rounds import Rounds
from app.activation.streaming import Stream, StreamRegistry
from app.activation.waiting import Waiter, WaiterHub
from app.config import Settings
from app.db import Database
from app.db.base import refused_input
from app.db.rows import Inserted, JobRow
from app.db.store import InsertAsk
from app.domain import tenant_of, utcnow
from app.errors import BAD_KEY, ResourceExhausted, Unauthenticated
from app.metrics.events import Metrics
from app.scheduler import Aging


@dataclass(frozen=True, slots=True)
class Activated:
    """A call's jobs, and the aging their records are rendered with (the type's, as the
    activation read it)."""

    rows: list[JobRow]
    aging: Aging


class Anonymous:
    """A caller with no key, never gone, seen by nobody (tests, benchmarks, the demo)."""

    def place(self) -> AbstractContextManager[None]:
        return nullcontext()

    def waits(self) -> None:
        pass

    async def gone(self) -> None:
        await asyncio.Event().wait()

    async def is_gone(self) -> bool:
        return False

    async def still_live(self) -> bool:
        return True

    def seen(self, job_type: str, worker: str | None, activated: bool) -> None:
        pass

    def received(self, rows: Sequence[JobRow]) -> None:
        pass


class Activation:
    """Activation in one process: its rounds, its waiters, its streams."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: Metrics | None = None,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.settings = settings
        # ``clock``: the instant leases run from (a model test moves its own).
        self.rounds = Rounds(db, settings, metrics, clock=clock)
        self.metrics = self.rounds.metrics
        self.waiters = WaiterHub(
            self.rounds,
            self.rounds.release,
            max_waiters=settings.max_waiters,
            backup_poll_ms=settings.backup_poll_ms,
        )
        self.streams = StreamRegistry()

    # -- the three ways in ---------------------------------------------------------------

    async def activate(self, req: ActivateRequest, caller: Caller) -> Activated:
        """Activate now, without waiting (nothing, if other callers of the type wait:
        they are owed what there is)."""
        return await self.long_poll(req, caller, -1)

    async def long_poll(
        self, req: ActivateRequest, caller: Caller, request_timeout_ms: int | None
    ) -> Activated:
        """Activate, waiting up to ``request_timeout_ms`` (0 or None: the server default,
        capped; negative: no wait) for at least one job.  Jobs activated for a caller
        gone by then are given back at once rather than left to their lease timeout; a
        caller whose key was revoked while it waited gets 401, and its jobs, if it got
        any, go back."""
        settings = self.settings
        wait_ms = min(
            request_timeout_ms or settings.default_request_timeout_ms, settings.long_poll_cap_ms
        )
        gone = asyncio.Event()
        wait_s = max(0, wait_ms) / 1000
        # A call that will not wait holds none of its key's waiter places: they bound the
        # long polls and streams a key holds open, and it holds none open.
        with caller.place() if wait_s > 0 else nullcontext():
            watcher = asyncio.create_task(_watch(caller, gone))
            try:
                rows = await self.waiters.long_poll(req, wait_s, gone, on_wait=caller.waits)
            finally:
                watcher.cancel()
        caller.seen(req.job_type, req.worker, bool(rows))
        if gone.is_set():
            if rows:
                await self.waiters.release(rows)
            rows = []
        elif not await caller.still_live():
            # Revoked (or expired) while it waited: 401, with jobs or without; what it got
            # goes back at once.
            if rows:
                await self.waiters.release(rows)
            raise Unauthenticated(BAD_KEY)
        caller.received(rows)
        return Activated(rows, await self.rounds.recent_aging(req.job_type))

    def stream(
        self,
        req: ActivateRequest,
        caller: Caller,
        fetch_variables: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[dict[str, Any]]]:
        """An SSE stream's writes, each the events of one claim's jobs (``event: job`` per
        job, at most ``maxJobs`` unfinished at once).  Refused now, before any event, when
        the server is shutting down or every waiter place is taken (503), or the key has no
        place left (429)."""
        if self.streams.shutdown.is_set():
            raise ResourceExhausted("the server is shutting down", retry_after_s=1)
        self.waiters.admit()  # every waiter place taken: 503 now, not an error after the 200
        held = caller.place()
        held.__enter__()  # left when the stream ends
        try:
            caller.waits()  # a waiter from now on, not work in flight
            caller.seen(req.job_type, req.worker, False)
            s = self.open_stream(req, caller, fetch_variables)
        except BaseException:
            held.__exit__(None, None, None)
            raise
        return _holding(s.events(), held)

    def open_stream(
        self,
        req: ActivateRequest,
        caller: Caller | None = None,
        fetch_variables: Sequence[str] | None = None,
        *,
        check_ms: int | None = None,
    ) -> Stream:
        """A stream for ``req`` (``stream`` opens one after its checks; tests, one of their
        own, with its check interval)."""
        return Stream(
            req,
            self.waiters,
            self.streams,
            self.rounds.store,
            self.rounds,
            caller if caller is not None else Anonymous(),
            check_ms=self.settings.backup_poll_ms if check_ms is None else check_ms,
            fetch_variables=fetch_variables,
        )

    # -- the producer's door -------------------------------------------------------------

    async def charged(self, job_types: Iterable[str]) -> None:
        """Until this process's lane charges of ``job_types`` made so far are written, as
        a hand-off waits for them: a lane that a new job wakes re-enters at the smallest
        virtual time of its type's backlogged lanes, which a charge not yet written leaves
        a round behind.  On Citus (a charge there is a statement per Citus shard, written
        after the activation answered) a tenant back from idle that created its jobs right
        after a round took 133 of 300 activations instead of its third (make citus,
        test_tenant_back_from_idle_gets_no_burst).  Nothing owed: no wait.  Nor while the
        job table is degraded (ADR 036): charges are written every CHARGE_EVERY_S then,
        and a create waiting for them would wait that long; a lane woken meanwhile
        re-enters at a floor missing at most that much of this process's charges."""
        if self.rounds.store.degraded:
            return
        for job_type in set(job_types):
            await self.rounds.charges.written(job_type)

    async def hand_off(self, job: Mapping[str, Any], now: datetime) -> Inserted | None:
        """Create ``job`` (one, ready at once) and claim for the long poll or stream at the
        head of its type's queue in one transaction (ADR 012): the job reaches a waiting
        worker as its producer is answered, with no NOTIFY round between them.  None: no
        caller waits for it (the producer inserts it as usual).

        If the database refuses a value of that transaction, it is the job's or the
        waiter's: the job is then created on its own.  If that succeeds the waiter's
        values were refused, and it alone is failed; if not, the producer gets the
        error and the waiter waits on."""
        if self.rounds.store.degraded:  # the one-pick claim reads lanes as written (ADR 036)
            return None
        waiter = self.waiters.take_head(job["type"], tenant_of(job))
        return None if waiter is None else await self._hand_to(waiter, job, now)

    async def _hand_to(self, waiter: Waiter, job: Mapping[str, Any], now: datetime) -> Inserted:
        rows: list[JobRow] = []
        try:
            key, got = await self.rounds.create_and_claim_lead(job, now, waiter.req)
            self.metrics.count_one(self.metrics.created, job["type"], tenant_of(job))
            if got is not None:
                rows.append(got)
        except Exception as exc:
            if not refused_input(exc):
                raise
            [inserted] = await self.rounds.store.insert(InsertAsk([job], now))
            self.metrics.count_one(self.metrics.created, job["type"], tenant_of(job))
            self.waiters.fail(waiter, exc)
            return inserted
        finally:
            if waiter.reserved:  # not failed above
                await self.waiters.handed(waiter, rows)
        return Inserted(key, True)

    # -- the rest of the process's life --------------------------------------------------

    def resolve_aging(self, interval_ms: int | None, step: int | None) -> Aging:
        return self.rounds.resolve_aging(interval_ms, step)

    async def recent_aging(self, job_type: str) -> Aging:
        return await self.rounds.recent_aging(job_type)

    async def release(self, rows: Sequence[JobRow]) -> int:
        return await self.rounds.release(rows)

    async def close(self) -> None:
        """Answer waiting long polls now and end streams (releasing what they have not
        delivered)."""
        self.streams.shutdown.set()
        await self.waiters.close()

    async def settle(self) -> None:
        """Wait for the follow-up work (charges, parking) of finished activations."""
        await self.rounds.settle()


async def _watch(caller: Caller, gone: asyncio.Event) -> None:
    await caller.gone()
    gone.set()


async def _holding(
    events: AsyncGenerator[list[dict[str, Any]]], held: AbstractContextManager[None]
) -> AsyncGenerator[list[dict[str, Any]]]:
    """``events``, with the key's waiter place ``held`` given back when they end (and
    ``events`` closed then, not when the collector finds them)."""
    try:
        async for event in events:
            yield event
    finally:
        try:
            await events.aclose()
        finally:
            held.__exit__(None, None, None)
