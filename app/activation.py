"""Activation: turns one ``activate`` call into stride picks and claims.

The decisions are the scheduler's (pure); this service only gathers lane states, asks the
store to claim, and repeats for lanes that came up short.  Cost per call: a few rounds of
O(maxJobs + lanes read) -- never proportional to the backlog.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from app.coalescing import Coalescer
from app.config import Settings
from app.domain import utcnow
from app.scheduler import Aging, Lane, allocate
from app.store import Charges, LaneRead, LaneRow, LeadAsk, Share, Store, refused_input

log = logging.getLogger(__name__)

# A call reads lanes again, excluding the lanes that came up short (drained, or all heads
# locked by a concurrent activator) or at their cap, until it has its jobs or has seen
# every active lane.  Each round excludes at least one lane more, so the rounds end; this
# bound only guards against a bug looping on the database (ADR 014).
MAX_ROUNDS = 256
# Lanes read beyond maxJobs, to cover lanes that turn out empty or capped.
LANE_SLACK = 8
# A round that found lanes short or at their caps reads twice as many lanes in the next,
# up to this many: a call meeting 2,400 tenants newly at their caps (each then held out of
# later reads, ADR 016) gets past them in ~25 rounds, not 270.  Bounded because a capped
# round takes one cap lock per capped tenant read.
WIDEST_READ = 128
# A lane read carries the charges not yet written when they are of at most this many
# lanes.  Larger ones are written by the writer task as before, and the read waits for
# them: carried, a round's 100 charges made the read scan 100 lanes more and cost 14 % of
# the drain with 10,000 tenants (8 workers x maxJobs 100; 4 alternating pairs).
CARRIED_LANES = 16
# A park off the response path whose producer held the lanes' buckets for longer than
# the park waits tries again this many times (0.5 s, 1 s, ... apart; store.park_lanes).
PARK_RETRIES = 5
# Callers activated together ask for at most this many jobs in all (one caller alone may
# ask for up to 1,000, the most maxJobs allows).
MAX_TOGETHER = 1000


@dataclass(frozen=True, slots=True)
class ActivateRequest:
    job_type: str
    max_jobs: int
    lease_ms: int
    worker: str | None = None
    tenant_ids: Sequence[str] | None = None
    via_stream: bool = False

    @property
    def tenant_filter(self) -> TenantFilter:
        """The tenants asked for, as a key: None for all, else sorted and hashable."""
        return None if self.tenant_ids is None else tuple(sorted(self.tenant_ids))


TenantFilter = tuple[str, ...] | None


class _Charges:
    """One job type's lane charges not yet written.  The next lane read of the type in
    this process carries them in its own statement (read_lanes); charges that no read
    takes are written by a writer task.  Charges that arrive while a write runs go into
    the next one, as GroupCommit does for completions: under load one statement carries
    the charges of many activations."""

    def __init__(self) -> None:
        self.claimed: Counter[str] = Counter()
        self.strides: dict[str, float] = {}
        self.writer: asyncio.Task[Any] | None = None
        self._next: asyncio.Future[None] | None = None  # done when `claimed` is written
        # Done when each write in flight is: the writer's and a lane read's may overlap.
        self._writing: set[asyncio.Future[None]] = set()

    def add(self, claimed: Counter[str], strides: Mapping[str, float]) -> None:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        self.claimed.update(claimed)
        self.strides.update(strides)

    def take(self) -> tuple[Charges, asyncio.Future[None]]:
        """The charges to write now, and the future to resolve once they are written (or
        have failed): a write in flight until then."""
        assert self._next is not None
        taken = ((self.claimed, self.strides), self._next)
        self._writing = {f for f in self._writing if not f.done()} | {self._next}
        self.claimed, self.strides, self._next = Counter(), {}, None
        return taken

    async def none_in_flight(self) -> None:
        """Until no write is in flight (one may start while another is awaited)."""
        while waits := [f for f in self._writing if not f.done()]:
            await asyncio.wait(waits)

    async def written(self) -> None:
        """Until every charge added so far has been written (or has failed)."""
        waits = [f for f in (*self._writing, self._next) if f is not None and not f.done()]
        if waits:
            await asyncio.wait(waits)


class ActivationService:
    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.queries = 0  # activation rounds that reached the database (for /metrics)
        self.lead_claims = 0  # of those, one-pick claims that got their job (_claim_lead)
        self.hand_offs = 0  # of those, a new job claimed as it was created (ADR 012)
        # The aging configuration each job type had at its latest activation, so that job
        # records can be rendered without another round trip.
        self.aging_seen: dict[str, Aging] = {}
        self._pending: set[asyncio.Task[Any]] = set()
        # Lane charges not yet written, per job type (see _charge).
        self._charges: defaultdict[str, _Charges] = defaultdict(_Charges)
        # Callers asking now, per type, tenant filter and via_stream, activated together.
        self._together: dict[_GroupKey, Coalescer[ActivateRequest, _Answer]] = {}

    def _spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(lambda t: self._done(t, what))
        return task

    def _done(self, task: asyncio.Task[Any], what: str) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A lane left active costs the next call one probe; an uncharged lane got a
            # few jobs for free.  Nothing is lost either way.
            log.warning("%s failed: %r", what, task.exception())

    def _charge(self, job_type: str, claimed: Counter[str], strides: Mapping[str, float]) -> None:
        """Charge the lanes after the claim, off the response path: the jobs go out while
        the charge commits.  Under load the next round of this type takes the charges
        into its lane read (_read_lanes) before the writer task first runs, so a round
        costs no statement of its own for them and does not wait for one (charges of
        more than CARRIED_LANES lanes are left to the writer).  A later read of this
        type's lanes in this process sees every charge made before it, so one activator
        calling in sequence always sees its own charges; activators in other processes
        may read a lane a moment before its charge, as they may read it while a claim is
        in flight."""
        charges = self._charges[job_type]
        charges.add(claimed, strides)
        if charges.writer is None:
            charges.writer = self._spawn(self._write_charges(job_type, charges), "charging")

    async def _write_charges(self, job_type: str, charges: _Charges) -> None:
        try:
            while charges.claimed:
                taken, done = charges.take()
                drained: list[str] = []
                try:
                    drained = await self.store.charge_lanes(job_type, taken)
                except Exception as exc:  # uncharged lanes got a few jobs free; that is all
                    log.warning("charging lanes failed: %r", exc)
                finally:
                    done.set_result(None)
                if drained:
                    # Lanes their claims emptied, parked now: an empty lane left active
                    # would keep the vtime it had when it went idle, and both its own
                    # re-entry and every other lane's (the smallest active vtime) would
                    # start from there (ADR 014).
                    self._spawn(
                        self.store.park_lanes(job_type, drained, retries=PARK_RETRIES),
                        "parking lanes",
                    )
        finally:
            charges.writer = None

    async def _charged(self, job_type: str) -> None:
        charges = self._charges.get(job_type)
        if charges is not None:
            await charges.written()

    async def _read_lanes(
        self, job_type: str, limit: int, exclude: Sequence[str], tenant_ids: Sequence[str] | None
    ) -> LaneRead:
        """store.read_lanes, after every charge of this type made so far: those not yet
        written ride in the read's statement (at most CARRIED_LANES lanes of them), after
        any write already in flight."""
        charges = self._charges.get(job_type)
        if charges is not None:
            await charges.none_in_flight()
        if charges is None or not 0 < len(charges.claimed) <= CARRIED_LANES:
            await self._charged(job_type)
            return await self.store.read_lanes(job_type, limit, exclude, tenant_ids)
        taken, done = charges.take()
        try:
            return await self.store.read_lanes(job_type, limit, exclude, tenant_ids, taken)
        except Exception:
            # The statement was rolled back: nothing was charged.  The writer owes them.
            self._charge(job_type, *taken)
            raise
        finally:
            done.set_result(None)

    async def settle(self) -> None:
        """Wait for follow-up work (lane charges and parking) of finished activations."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def aging_for(self, job_type: str) -> Aging:
        cfg = await self.store.type_config(job_type)
        return self.resolve_aging(cfg.aging_interval_ms, cfg.aging_step)

    async def recent_aging(self, job_type: str) -> Aging:
        """The aging configuration read by the latest activation of this type."""
        seen = self.aging_seen.get(job_type)
        return seen if seen is not None else await self.aging_for(job_type)

    def resolve_aging(self, interval_ms: int | None, step: int | None) -> Aging:
        """A job type's aging, the server's defaults filling what it leaves unset."""
        return Aging(
            interval_ms=interval_ms or self.settings.aging_interval_ms,
            step=self.settings.aging_step if step is None else step,
        )

    async def activate(
        self, req: ActivateRequest, *, fill: bool = True, lead: bool = False
    ) -> tuple[list[asyncpg.Record], bool]:
        """The jobs activated, and whether the call ended knowing that the type had no
        ready job left for the request's tenants (every active lane was read and none
        had one), as opposed to stopping with all it asked for, at a cap, or after
        lanes that came up short because another activator held their heads.

        Lanes that come up short are made up from other lanes in further rounds.
        ``fill`` runs them until ``maxJobs`` is reached, for a caller that asked now
        and is answered once (a fuller batch saves it a request).  Without ``fill`` the
        call ends after its first round that claimed anything: a waiter or a stream is
        owed those jobs now, and each further round (charge, read, claim) held them back
        ~5 ms at 200 jobs/s while jobs arriving meanwhile kept the rounds going.

        Callers that ask now (``fill``) for the same type and tenants while such an
        activation runs are activated together in the next one (ADR 009).

        ``lead`` (without ``fill``): the first round would be one stride pick (a waiter
        asking for one job, or woken by one new job of an idle type); try the one-pick
        claim first, which reads and claims in one round trip, and run the rounds only
        if it got nothing without finding the type dry."""
        if not fill:
            if lead:
                row, dry = await self._claim_lead(req)
                if row is not None or dry:
                    return ([] if row is None else [row]), dry
            [rows], dry = await self._activate([req], fill=False)
            return rows, dry
        key = (req.job_type, req.tenant_filter, req.via_stream)
        together = self._together.get(key)
        if together is None:
            together = self._together[key] = Coalescer(
                self._activate_together,
                _take_together,
                unwanted=self._release,
                spawn=lambda runner: self._spawn(runner, "activating"),
                # A caller's worker name or lease the claim refuses fails that caller
                # alone: the others are activated without it.
                split=refused_input,
            )
        try:
            return await together.submit(req)
        finally:
            if together.idle and self._together.get(key) is together:
                del self._together[key]  # no caller left: keys of one-off filters go

    async def _claim_lead(self, req: ActivateRequest) -> tuple[asyncpg.Record | None, bool]:
        """The first stride pick of the type's lanes, read and claimed in one statement
        (store.claim_lead), then charged as a round's picks are."""
        self.queries += 1
        await self._charged(req.job_type)
        row, dry = await self.store.claim_lead(req.job_type, self._lead_ask(req), utcnow())
        if row is not None:
            self._lead_claimed(req, row)
        return row, dry

    async def create_and_claim_lead(
        self, job: Mapping[str, Any], now: datetime, req: ActivateRequest
    ) -> tuple[int, asyncpg.Record | None]:
        """Create ``job`` (one, ready at once, of ``req``'s type) and claim the type's
        first stride pick for ``req`` in the same transaction: a hand-off to a waiter
        (store.insert_and_claim_lead, ADR 012).  The new job's key, and what ``req`` got."""
        self.queries += 1
        await self._charged(req.job_type)
        key, row = await self.store.insert_and_claim_lead(job, now, self._lead_ask(req))
        if row is not None:
            if row["job_key"] == key:
                self.hand_offs += 1
            self._lead_claimed(req, row)
        return key, row

    def _lead_ask(self, req: ActivateRequest) -> LeadAsk:
        return LeadAsk(
            req.tenant_ids,
            Share(req.worker, req.lease_ms, 1),
            req.via_stream,
            self.settings.aging_step,
            self.settings.aging_interval_ms,
        )

    def _lead_claimed(self, req: ActivateRequest, row: asyncpg.Record) -> None:
        """A lead claim got ``row``: charge its lane as a round's picks are charged."""
        self.lead_claims += 1
        tenant = row["tenant_id"]
        self._charge(req.job_type, Counter({tenant: 1}), {tenant: 1.0 / row["lane_weight"]})
        self.aging_seen[req.job_type] = Aging(
            interval_ms=row["lane_aging_interval_ms"], step=row["lane_aging_step"]
        )

    async def _activate_together(self, reqs: list[ActivateRequest]) -> list[_Answer]:
        claimed, dry = await self._activate(reqs, fill=True)
        return [(rows, dry) for rows in claimed]

    def _release(self, unwanted: list[_Answer]) -> None:
        """Give back at once what was activated for callers that went away meanwhile."""
        rows = [row for theirs, _ in unwanted for row in theirs]
        if rows:
            self._spawn(self.store.release_jobs(rows), "releasing")

    async def _activate(
        self, reqs: Sequence[ActivateRequest], *, fill: bool
    ) -> tuple[list[list[asyncpg.Record]], bool]:
        """Activate for ``reqs`` (one type and tenant filter) in shared rounds: each
        claim's jobs are shared out in request order, each taking up to what it still
        lacks.  The jobs per request, and whether the type was found dry (as above)."""
        first = reqs[0]
        job_type = first.job_type
        aging: Aging | None = None
        dry = held_back = False
        claimed: list[list[asyncpg.Record]] = [[] for _ in reqs]
        picks: list[str] = []
        exclude: set[str] = set()
        short: set[str] = set()
        lacking = [req.max_jobs for req in reqs]
        widen = 1
        try:
            rounds = 0
            while True:
                rounds += 1
                if rounds > MAX_ROUNDS:  # cannot happen (see ADR 014); never loop on a bug
                    log.error("activation of %r stopped after %d rounds", job_type, MAX_ROUNDS)
                    break
                self.queries += 1
                remaining = sum(lacking)
                width = max(remaining + LANE_SLACK, min(WIDEST_READ, widen * LANE_SLACK))
                read = await self._read_lanes(job_type, width, sorted(exclude), first.tenant_ids)
                cfg, rows = read.config, read.ready
                aging = self.resolve_aging(cfg.aging_interval_ms, cfg.aging_step)
                # Lanes met without a ready job are parked after the call, and not read
                # again in it.
                short.update(read.empty)
                exclude.update(read.empty)
                if not rows:
                    if read.more:
                        continue  # the scan stopped among empty lanes: read on past them
                    # Every active lane not excluded was read and none has a ready job; the
                    # type is dry unless a lane was excluded that may still have some.
                    dry = not held_back
                    break
                plan = _Plan(rows, remaining, cfg.max_active_jobs)
                sharing = [i for i, n in enumerate(lacking) if n > 0]
                got = await self.store.claim(
                    job_type,
                    plan.preliminary(),
                    now=utcnow(),
                    shares=[Share(reqs[i].worker, reqs[i].lease_ms, lacking[i]) for i in sharing],
                    via_stream=first.via_stream,
                    aging_step=aging.step,
                    aging_interval_ms=aging.interval_ms,
                    type_cap=cfg.max_active_jobs,
                    tenant_caps=plan.tenant_caps(),
                    headroom=plan.with_headroom,
                )
                for row in got:
                    i = sharing[row["share"] - 1]
                    claimed[i].append(row)
                    lacking[i] -= 1
                picks.extend(plan.final.picks)
                per_lane = Counter(r["tenant_id"] for r in got)
                if got:
                    self._charge(job_type, per_lane, plan.strides)
                round_short = {t for t, k in plan.final.counts.items() if per_lane[t] < k}
                short |= round_short
                exclude |= round_short | plan.capped_out
                # Short because drained, or because another activator held the heads; at cap.
                held_back = held_back or bool(round_short or plan.capped_out)
                # At the type's cap once this round's claims used its headroom: a round whose
                # allocation the cap trimmed but whose claims came up short leaves room.
                type_full = plan.type_headroom is not None and len(got) >= plan.type_headroom
                if remaining <= len(got) or type_full or (got and not fill):
                    break
                if not round_short and not plan.capped_out:
                    break
                widen *= 2
        except Exception:
            # A later round failed (the database refused a claim, or went away): the
            # jobs earlier rounds claimed for these callers go back at once rather than
            # wait out their leases.
            taken = [row for theirs in claimed for row in theirs]
            if taken:
                self._spawn(self.store.release_jobs(taken), "releasing")
            raise
        if short:
            # Parked, later reads need not probe them; that need not delay this answer.
            self._spawn(
                self.store.park_lanes(job_type, sorted(short), retries=PARK_RETRIES),
                "parking lanes",
            )
        if aging is None:  # defensive: maxJobs >= 1 always runs a round
            aging = await self.aging_for(job_type)
        self.aging_seen[job_type] = aging
        return [_in_pick_order(theirs, picks) for theirs in claimed], dry


# Callers activated together share a job type, a tenant filter and whether the jobs go
# to a stream (one claim writes one via_stream).
_GroupKey = tuple[str, TenantFilter, bool]
# What one caller gets: its jobs, and whether the type was found dry.
_Answer = tuple[list[asyncpg.Record], bool]


def _take_together(reqs: Sequence[ActivateRequest]) -> list[bool]:
    """The callers waiting, in arrival order, while their asks total at most
    MAX_TOGETHER jobs (the first always)."""
    chosen: list[bool] = []
    asked = 0
    for req in reqs:
        asked += req.max_jobs
        chosen.append(not chosen or (chosen[-1] and asked <= MAX_TOGETHER))
    return chosen


class _Plan:
    """One round's allocation, first without caps, then trimmed by counted headroom."""

    def __init__(self, rows: list[LaneRow], n: int, type_cap: int | None) -> None:
        self.rows = rows
        self.n = n
        self.type_cap = type_cap
        self.strides = {r.tenant_id: 1.0 / r.weight for r in rows}
        self.final = allocate(self._lanes({}), n)
        self.capped_out: set[str] = set()
        # The type's cap minus its active jobs, as counted for this round (None: no cap).
        self.type_headroom: int | None = None

    def _lanes(self, room: dict[str, int]) -> list[Lane]:
        """The lanes read, each with its tenant's room (cap - active) where it has a cap."""
        return [Lane(r.tenant_id, r.vtime, r.weight, room.get(r.tenant_id)) for r in self.rows]

    def preliminary(self) -> dict[str, int]:
        return dict(self.final.counts)

    def tenant_caps(self) -> dict[str, int]:
        """Caps of the tenants this round may touch: every lane read, since trimming one
        lane's share moves picks to the next lanes."""
        return {r.tenant_id: r.max_active_jobs for r in self.rows if r.max_active_jobs is not None}

    def with_headroom(self, type_active: int | None, room: dict[str, int]) -> dict[str, int]:
        """The allocation trimmed by the type's active jobs and the capped tenants' room,
        both counted under their cap locks (room as the caps are now, not as read)."""
        type_headroom = None
        if self.type_cap is not None and type_active is not None:
            type_headroom = max(0, self.type_cap - type_active)
        self.type_headroom = type_headroom
        lanes = self._lanes(room)
        self.capped_out = {
            lane.tenant_id for lane in lanes if lane.headroom is not None and lane.headroom <= 0
        }
        self.final = allocate(lanes, self.n, type_headroom)
        # Lanes that used up their headroom in this allocation are at cap too.
        for lane in lanes:
            if (
                lane.headroom is not None
                and self.final.counts.get(lane.tenant_id, 0) >= lane.headroom
            ):
                self.capped_out.add(lane.tenant_id)
        return dict(self.final.counts)


def _in_pick_order(claimed: list[asyncpg.Record], picks: list[str]) -> list[asyncpg.Record]:
    """Order the response as the stride picks were made: each pick takes its lane's next
    best job (the store returns them unordered)."""
    by_lane: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for row in claimed:
        by_lane[row["tenant_id"]].append(row)
    for rows in by_lane.values():
        rows.sort(key=lambda r: (-r["priority"], r["queued_at"], r["job_key"]), reverse=True)
    out: list[asyncpg.Record] = []
    for tenant in picks:
        lane = by_lane.get(tenant)
        if lane:
            out.append(lane.pop())
    for rows in by_lane.values():
        out.extend(reversed(rows))
    return out
