"""Lane charges, written behind the claims they account for.

A claim's jobs go out before their lanes are charged the virtual time they cost: the
charge is a write of its own, and making the response wait for it would cost every
activation a commit.  ``LaneCharges`` keeps each job type's charges not yet written.
The next lane read of the type in this process carries them in its own statement (so
under load a round pays no statement for them, and does not wait for one); charges that
no read takes are written by a writer task, and charges arriving while a write runs go
into the next one, as GroupCommit does for completions.

A later read of a type's lanes in this process sees every charge made before it, so one
activator calling in sequence always sees its own charges; activators in other
processes may read a lane a moment before its charge, as they may read it while a claim
is in flight.  A charge that fails is logged and dropped: its lanes got a few jobs for
free, and nothing is lost.

While the job table is degraded (a held xmin horizon, ADR 036) every write of a lane row
is a version that later probes of it visit, so a type's charges are written at most
every CHARGE_EVERY_S, the reads in between counting them without writing them; and the
lanes and keys found empty are parked together at most every PARK_EVERY_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from app.db.rows import Ended, LaneRead
from app.db.store import ChargeAsk, LaneAsk, ParkAsk, SettleAsk, Store
from app.scheduler import Charges, LaneKey, Owed, OwedSettlements

log = logging.getLogger(__name__)

# A lane read carries the charges not yet written when they are of at most this many
# lanes; larger ones are left to the writer task, and the read waits for them: carried,
# a round's worth of charges made the read scan as many lanes more (ADR 014).  Their keys
# ride along, however many: a key charge moves no lane (ADR 027).
CARRIED_LANES = 16
# While the job table is degraded (ClaimHints, ADR 036: a held xmin horizon keeps every
# dead row version), a type's charges are written at most this often: each write is a
# new version of every lane and key it charges, which every later probe of the row then
# visits.  The reads in between count the charges not written (read_lanes_counted) and
# the key reads add them (KeysAsk.owed).
CHARGE_EVERY_S = 0.5
# While degraded, lanes and keys found empty are parked at most this often per type, in
# one statement: parking proves a lane empty with a probe of jobs_ready_idx that crosses
# every dead entry of it, under its bucket's exclusive lock, which producers of the
# lane then wait for; a lane refilled meanwhile is not parked (and not woken) at all.
PARK_EVERY_S = 1.0
# A park off the response path whose producer held the lanes' buckets for longer than
# the park waits tries again this many times (0.5 s, 1 s, ... apart; parking.park).
PARK_RETRIES = 5

Spawn = Callable[[Awaitable[Any], str], object]


class _Pending:
    """One job type's charges not yet written (scheduler.Owed: how they add up), and the
    writes of them in flight."""

    def __init__(self) -> None:
        self.owed = Owed()
        self.writer: asyncio.Task[Any] | None = None
        self.written_at = -math.inf  # when a write of them last ended (monotonic)
        self.flush = asyncio.Event()  # set: write what is owed now, degraded or not
        self._next: asyncio.Future[None] | None = None  # done when `owed` is written
        # Done when each write in flight is: the writer's and a lane read's may overlap.
        self._writing: set[asyncio.Future[None]] = set()
        # Done when each read counting ``owed`` without writing it is (degraded, ADR
        # 036): no write of them may commit while one is in flight (it would see them
        # twice), nor may one start while a write is in flight (it would miss them).
        self._counting: set[asyncio.Future[None]] = set()
        self._to_write = 0  # writes waiting for the counting reads: none may start
        self._countable = asyncio.Event()  # set while no write waits (_to_write == 0)
        self._countable.set()

    @property
    def lanes(self) -> int:
        """How many lanes are owed a charge (0: nothing is owed)."""
        return len(self.owed.claimed)

    def add(self, charges: Charges) -> None:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        self.owed.add(charges)

    def take(self) -> tuple[Charges, asyncio.Future[None]]:
        """The charges to write now, and the future to resolve once they are written (or
        have failed): a write in flight until then."""
        assert self._next is not None
        taken = (self.owed.as_charges(), self._next)
        self._writing = {f for f in self._writing if not f.done()} | {self._next}
        self.owed, self._next = Owed(), None
        return taken

    async def none_in_flight(self) -> None:
        """Until no write is in flight (one may start while another is awaited)."""
        while waits := [f for f in self._writing if not f.done()]:
            await asyncio.wait(waits)

    def may_count(self) -> bool:
        """Whether a read may count ``owed`` now (no write waits to take it)."""
        return self._to_write == 0

    def counting_in_flight(self) -> bool:
        return any(not f.done() for f in self._counting)

    async def countable(self) -> None:
        """Until no write waits for the counting reads (may_count)."""
        await self._countable.wait()

    async def none_counting(self) -> None:
        """Until no read counting ``owed`` is in flight; none starts meanwhile."""
        self._to_write += 1
        self._countable.clear()
        try:
            while waits := [f for f in self._counting if not f.done()]:
                await asyncio.wait(waits)
        finally:
            self._to_write -= 1
            if self._to_write == 0:
                self._countable.set()

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """A read counting ``owed`` in flight while in the block (entered with no write in
        flight: after none_in_flight, with no await between)."""
        done = asyncio.get_running_loop().create_future()
        self._counting = {f for f in self._counting if not f.done()} | {done}
        try:
            yield
        finally:
            done.set_result(None)

    async def written(self) -> None:
        """Until every charge added so far has been written (or has failed)."""
        waits = [f for f in (*self._writing, self._next) if f is not None and not f.done()]
        if waits:
            await asyncio.wait(waits)


class LaneCharges:
    """The lane charges of one process, per job type.  ``spawn`` runs the writer tasks
    and the parks they start (the activation service's, so that ``settle`` waits for
    them)."""

    def __init__(self, store: Store, spawn: Spawn) -> None:
        self.store = store
        self._spawn = spawn
        self._pending: defaultdict[str, _Pending] = defaultdict(_Pending)
        self.clock = time.monotonic
        # While degraded: lanes and keys to park per type, and the task that will.
        self._to_park: dict[str, tuple[set[str], set[LaneKey]]] = {}
        self._parker: dict[str, asyncio.Event] = {}

    def add(self, job_type: str, charges: Charges) -> None:
        """Charge lanes of ``job_type`` the jobs claimed x each tenant's stride, and their
        keys the jobs claimed x each key's stride."""
        pending = self._pending[job_type]
        pending.add(charges)
        if pending.writer is None:
            pending.writer = asyncio.ensure_future(self._write(job_type, pending))
            self._spawn(pending.writer, "charging")

    async def _write(self, job_type: str, pending: _Pending) -> None:
        try:
            while pending.lanes:
                wait = pending.written_at + CHARGE_EVERY_S - self.clock()
                if wait > 0 and self.store.degraded and not pending.flush.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(pending.flush.wait(), wait)
                    continue  # a read may have written them meanwhile
                if pending.counting_in_flight():
                    await pending.none_counting()
                    continue
                pending.flush.clear()
                taken, done = pending.take()
                drained: list[str] = []
                keys: list[LaneKey] = []
                try:
                    drained, keys = await self.store.charge(ChargeAsk(job_type, taken))
                except Exception as exc:  # uncharged lanes got a few jobs free; that is all
                    log.warning("charging lanes failed: %r", exc)
                finally:
                    pending.written_at = self.clock()
                    done.set_result(None)
                if drained or keys:
                    # Lanes and keys their claims emptied, parked now: an empty lane left
                    # active would keep the vtime it had when it went idle, and both its
                    # own re-entry and every other lane's (the smallest active vtime)
                    # would start from there (ADR 014); so would a key in its lane.
                    self.park(job_type, drained, keys)
        finally:
            pending.writer = None

    async def written(self, job_type: str) -> None:
        """Until every charge of ``job_type`` made so far has been written."""
        pending = self._pending.get(job_type)
        if pending is not None:
            if pending.lanes:
                pending.flush.set()  # written now, not CHARGE_EVERY_S after the last write
            await pending.written()

    def flush(self) -> None:
        """Have every type's charges and parks held back (degraded, ADR 036) written now."""
        for pending in self._pending.values():
            if pending.lanes:
                pending.flush.set()
        for now in self._parker.values():
            now.set()

    def park(self, job_type: str, tenant_ids: Sequence[str], keys: Sequence[LaneKey]) -> None:
        """Park these lanes and keys of ``job_type`` (found empty) off the response path:
        now, or while degraded together with the type's others at most every
        PARK_EVERY_S (the park proves each empty again when it runs)."""
        if not self.store.degraded:
            self._spawn(
                self.store.park(ParkAsk(job_type, tenant_ids, keys, PARK_RETRIES)),
                "parking lanes",
            )
            return
        lanes, lane_keys = self._to_park.setdefault(job_type, (set(), set()))
        lanes.update(tenant_ids)
        lane_keys.update(keys)
        if job_type not in self._parker:
            self._parker[job_type] = asyncio.Event()
            self._spawn(self._park_later(job_type), "parking lanes")

    async def _park_later(self, job_type: str) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._parker[job_type].wait(), PARK_EVERY_S)
        finally:
            del self._parker[job_type]
            lanes, keys = self._to_park.pop(job_type)
        await self.store.park(ParkAsk(job_type, sorted(lanes), sorted(keys), PARK_RETRIES))

    @contextlib.asynccontextmanager
    async def owed_keys(
        self, job_type: str
    ) -> AsyncIterator[dict[LaneKey, tuple[int, float]] | None]:
        """For a key read in the block: the key charges of ``job_type`` not yet written
        (jobs, stride per job), while the job table is degraded; None otherwise (ADR 036).
        The read sees every write of them that began before it, and none commits while it
        runs (it would count them twice)."""
        pending = self._pending.get(job_type)
        if pending is None or not self.store.degraded:
            yield None
            return
        while True:
            await pending.none_in_flight()
            if pending.may_count():
                break
            await pending.countable()  # a write waits to start: after it took them
        owed = pending.owed
        with pending.counting():
            yield {k: (n, owed.key_owed[k] / n) for k, n in owed.keys.items() if n > 0} or None

    async def read(
        self, job_type: str, limit: int, exclude: Sequence[str], tenant_ids: Sequence[str] | None
    ) -> LaneRead:
        """``lanes.read``, after every charge of this type made so far: those not yet
        written ride in the read's statement (at most CARRIED_LANES lanes of them), after
        any write already in flight."""
        pending = self._pending.get(job_type)
        while pending is not None:
            await pending.none_in_flight()
            if (
                0 < pending.lanes <= CARRIED_LANES
                and self.store.degraded
                and self.clock() - pending.written_at < CHARGE_EVERY_S
                and pending.may_count()
            ):  # written lately: counted, not written (ADR 036)
                charges = pending.owed.as_charges()
                with pending.counting():
                    ask = LaneAsk(job_type, limit, exclude, tenant_ids, charges, True)
                    return await self.store.read_lanes(ask)
            if not pending.may_count():
                await pending.countable()  # a write waits to start: after it took them
                continue
            if not pending.counting_in_flight():
                break  # no write, no counting read in flight, and no await until take()
            await pending.none_counting()
        if pending is None or not 0 < pending.lanes <= CARRIED_LANES:
            await self.written(job_type)
            return await self.store.read_lanes(LaneAsk(job_type, limit, exclude, tenant_ids))
        taken, done = pending.take()
        try:
            return await self.store.read_lanes(LaneAsk(job_type, limit, exclude, tenant_ids, taken))
        except Exception:
            # The statement was rolled back: nothing was charged.  The writer owes them.
            self.add(job_type, taken)
            raise
        finally:
            pending.written_at = self.clock()
            done.set_result(None)


class Settlements:
    """Worker-time settlements (ADR 029), written behind the finishes they account for,
    as charges are: a finish of a job whose activation was charged an estimate
    (``Ended.charged``) owes its lane and key the lease's held seconds less that estimate
    (scheduler.OwedSettlements), and the lane's estimate an observation.  Each job type's
    owed settlements are written by one writer task, one statement per batch
    (settle_lanes): a finish never writes its lane in its own transaction (the hot row
    ADR 001 avoids).  A settlement that fails is logged and dropped: its lane keeps the
    estimate it was charged, and nothing is lost."""

    def __init__(self, store: Store, spawn: Spawn) -> None:
        self.store = store
        self._spawn = spawn
        self._owed = OwedSettlements()
        self._writers: dict[str, asyncio.Task[Any]] = {}

    def add(self, ended: Iterable[Ended], now: datetime, *, seen: bool = True) -> None:
        """Owe the settlements of ``ended`` activations, ended at ``now`` (``seen`` false:
        given back before their caller got them)."""
        for job_type in self._owed.add(ended, now, seen=seen):
            if job_type not in self._writers:
                writer = asyncio.ensure_future(self._write(job_type))
                self._writers[job_type] = writer
                self._spawn(writer, "settling lanes")

    async def _write(self, job_type: str) -> None:
        try:
            while (owed := self._owed.take(job_type)) is not None:
                try:
                    await self.store.settle(SettleAsk(job_type, *owed))
                except Exception as exc:  # the lanes keep their estimates; that is all
                    log.warning("settling lanes failed: %r", exc)
        finally:
            del self._writers[job_type]

    async def written(self) -> None:
        """Until every settlement owed so far has been written (or has failed)."""
        while self._writers:
            await asyncio.gather(*list(self._writers.values()), return_exceptions=True)
