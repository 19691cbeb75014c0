"""Activation: turns one ``activate`` call into stride picks and claims.

The decisions are the scheduler's (pure); this service gathers lane states, claims what
the scheduler allotted, and repeats for lanes that came up short.  Where caps are
involved it opens the transaction itself and runs lock, count, decide, claim and hold in
that order.  Cost per call: a few rounds of O(maxJobs + lanes read) -- never
proportional to the backlog.

Three entry points, by what the caller is owed: ``activate`` (a request answered once:
as many jobs as it asked for, callers asking together activated together),
``activate_owed`` (a waiter or stream owed jobs now: the first round that claims
anything) and ``activate_one_pick`` (the same, trying the one-statement stride pick
first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app import logs
from app.activation.charging import LaneCharges, Settlements
from app.activation.fairness_keys import LANE_SLACK, WIDEST_READ, KeysRead
from app.activation.ports import ActivateRequest, TenantFilter, take_together
from app.coalescing import Coalescer
from app.config import Settings
from app.db import Database
from app.db.base import refused_input, retry_deadlock
from app.db.rows import Claimed, JobRow, LaneRow, LeadClaim, TypeConfig
from app.db.store import (
    ClaimAsk,
    CountAsk,
    HandOffAsk,
    LeadAsk,
    LeadClaimAsk,
    Share,
    Store,
    TokensAsk,
)
from app.domain import utcnow
from app.metrics.events import Metrics
from app.scheduler import (
    Aging,
    Allocation,
    FairnessBy,
    Lane,
    Rests,
    RoundPlan,
    allocate,
    as_claimed,
    in_pick_order,
    lane_unit,
    round_charges,
    trim_to_caps,
)

log = logging.getLogger(__name__)

# A call reads lanes again, excluding the lanes that came up short (drained, or all heads
# locked by a concurrent activator) or at their cap, until it has its jobs or has seen
# every active lane.  Each round excludes at least one lane more, so the rounds end; this
# bound only guards against a bug looping on the database (ADR 014).
MAX_ROUNDS = 256


@dataclass
class ActivationCounters:
    """What ``/metrics`` reports of activation in this process."""

    queries: int = 0  # activation rounds that reached the database
    lead_claims: int = 0  # of those, one-pick claims that got their job
    hand_offs: int = 0  # of those, a new job claimed as it was created (ADR 012)


class Rounds:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: Metrics | None = None,
        *,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        # Every statement activation runs, through one narrow interface (app.db.store).
        self.store = Store(db)
        self.clock, self.monotonic = clock, monotonic
        # The instants leases run from (``clock``) and rate limits rest by (``monotonic``):
        # read here, passed to the decisions (the fencing model moves its own clock).
        self.settings = settings
        self.counters = ActivationCounters()
        # Jobs activated and released are counted here (the app's metrics, shared with
        # the services built on this one).
        self.metrics = metrics if metrics is not None else Metrics(settings.metrics_top_tenants)
        # The aging configuration each job type had at its latest activation, so that job
        # records can be rendered without another round trip.
        self.aging_seen: dict[str, Aging] = {}
        # What each job type was last seen fair by (lane reads, lead claims): a lead
        # claim then records the estimate's virtual times only where it is by worker
        # time (claims.LeadAsk; a type not seen yet is taken to be).
        self.fair_by_seen: dict[str, FairnessBy] = {}
        self._pending: set[asyncio.Task[Any]] = set()
        self.charges = LaneCharges(self.store, self._spawn)
        # Worker-time charges settled when their leases end (ADR 029): by the finishes of
        # this process, and by its releases.
        self.settlements = Settlements(self.store, self._spawn)
        # The buckets found used up, and when waiters are owed a look (ADR 028).
        self.rests = Rests()
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

    async def settle(self) -> None:
        """Wait for follow-up work (lane charges and parking) of finished activations;
        charges held back while the job table is degraded are written now (ADR 036)."""
        while self._pending:
            self.charges.flush()
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

    # -- the entry points --------------------------------------------------------------

    async def activate(self, req: ActivateRequest) -> tuple[list[JobRow], bool]:
        """For a caller answered once: rounds until ``maxJobs`` is reached or every
        active lane was read (a fuller batch saves it a request).  The jobs activated,
        and whether the call ended knowing that the type had no ready job left for the
        request's tenants (every active lane was read and none had one), as opposed to
        stopping with all it asked for, at a cap, or after lanes that came up short
        because another activator held their heads.

        Callers asking for the same type and tenants while such an activation runs are
        activated together in the next one (ADR 009)."""
        key = (req.job_type, req.tenant_filter, req.via_stream)
        together = self._together.get(key)
        if together is None:
            together = self._together[key] = Coalescer(
                self._activate_together,
                take_together,
                unwanted=self._release,
                spawn=lambda runner: self._spawn(logs.unattributed(runner), "activating"),
                # A caller's worker name or lease the claim refuses fails that caller
                # alone: the others are activated without it.
                split=refused_input,
            )
        try:
            return await together.submit(req)
        finally:
            if together.idle and self._together.get(key) is together:
                del self._together[key]  # no caller left: keys of one-off filters go

    async def activate_owed(self, req: ActivateRequest) -> tuple[list[JobRow], bool]:
        """For a waiter or a stream owed jobs now: ends after its first round that
        claimed anything (each further round -- charge, read, claim -- would hold those
        jobs back while jobs arriving meanwhile kept the rounds going).  Answers as
        ``activate``."""
        [rows], dry = await self._activate([req], fill=False)
        return rows, dry

    async def activate_owed_together(
        self, reqs: Sequence[ActivateRequest]
    ) -> tuple[list[list[JobRow]], bool]:
        """As ``activate_owed`` for several waiters of one type, tenant filter and
        via_stream at once (a dispatcher's batch): one claim for all of them, shared out
        in their order.  A capped type's claims each wait for its cap lock, so one claim
        for the batch is one wait, not one per waiter."""
        return await self._activate(reqs, fill=False)

    async def activate_one_pick(self, req: ActivateRequest) -> tuple[list[JobRow], bool]:
        """As ``activate_owed``, when its first round would be one stride pick (a waiter
        asking for one job, or woken by one new job of an idle type): tries the one-pick
        claim first, which reads and claims in one round trip, and runs the rounds only
        if it got nothing without finding the type dry.  While the job table is
        degraded (ADR 036) the rounds alone: the one-pick claim reads the lanes as written,
        and this process's charges are written only every CHARGE_EVERY_S then."""
        if self.store.degraded:
            return await self.activate_owed(req)
        self.counters.queries += 1
        await self.charges.written(req.job_type)
        got = await self.store.claim_lead(
            LeadClaimAsk(req.job_type, self._lead_ask(req), self.clock())
        )
        if got.job is not None:
            self._lead_claimed(req, got)
            return [got.job], False
        if got.dry:
            return [], True
        return await self.activate_owed(req)

    async def create_and_claim_lead(
        self, job: Mapping[str, Any], now: datetime, req: ActivateRequest
    ) -> tuple[int, JobRow | None]:
        """Create ``job`` (one, ready at once, of ``req``'s type) and claim the type's
        first stride pick for ``req`` in the same transaction: a hand-off to a waiter
        (claims.insert_and_claim_lead, ADR 012).  The new job's key, and what ``req`` got."""
        self.counters.queries += 1
        await self.charges.written(req.job_type)
        key, got = await self.store.insert_and_claim_lead(HandOffAsk(job, now, self._lead_ask(req)))
        if got.job is not None:
            if got.job.job_key == key:
                self.counters.hand_offs += 1
            self._lead_claimed(req, got)
        return key, got.job

    # -- the rounds --------------------------------------------------------------------

    def _lead_ask(self, req: ActivateRequest) -> LeadAsk:
        return LeadAsk(
            req.tenant_ids,
            Share(req.worker, req.lease_ms, 1),
            req.via_stream,
            self.settings.aging_step,
            self.settings.aging_interval_ms,
            self.fair_by_seen.get(req.job_type, FairnessBy.WORKER_TIME) is FairnessBy.WORKER_TIME,
        )

    def _lead_claimed(self, req: ActivateRequest, got: LeadClaim) -> None:
        """A lead claim got its job: charge its lane and its key as a round's picks are
        charged."""
        assert got.job is not None and got.lane_weight is not None
        assert got.key_weight is not None
        assert got.aging_interval_ms is not None and got.aging_step is not None
        self.counters.lead_claims += 1
        self.metrics.jobs_activated(req.job_type, [got.job])
        tenant, key = got.job.tenant_id, (got.job.tenant_id, got.job.fairness_key)
        self.charges.add(
            req.job_type,
            round_charges(
                [got.job],
                got.fairness_by,
                {tenant: got.lane_weight},
                {key: got.key_weight},
                {},
            ),
        )
        self.aging_seen[req.job_type] = Aging(
            interval_ms=got.aging_interval_ms, step=got.aging_step
        )
        self.fair_by_seen[req.job_type] = got.fairness_by

    async def _activate_together(self, reqs: list[ActivateRequest]) -> list[_Answer]:
        claimed, dry = await self._activate(reqs, fill=True)
        return [(rows, dry) for rows in claimed]

    def _release(self, unwanted: list[_Answer]) -> None:
        """Give back at once what was activated for callers that went away meanwhile."""
        rows = [row for theirs, _ in unwanted for row in theirs]
        if rows:
            self._spawn(self.release(rows), "releasing")

    async def release(self, rows: Sequence[JobRow]) -> int:
        """Give back activations whose caller never received them (finishing.release);
        how many went back."""
        released = await self.store.release(rows)
        self.settlements.add(released, self.clock(), seen=False)
        self.metrics.count(self.metrics.released, ((e.job_type, e.tenant_id) for e in released))
        return len(released)

    async def _claim(
        self,
        job_type: str,
        rows: Sequence[LaneRow],
        n: int,
        cfg: TypeConfig,
        claim_args: dict[str, Any],
        keys_read: KeysRead,
    ) -> tuple[RoundPlan, list[Claimed]]:
        """One round's decision and claim over the lanes read: the lanes' picks, then
        each lane's divided among its keys (``keys_read``: which to skip, and what was
        found).  Without caps or rate limits the claim is one autocommit statement.

        The claim reads the clock again, just before it runs: its leases run from it.  The
        round read lanes and keys since it began, and a capped claim may have waited
        seconds for its cap locks behind other claims of its type; leases counted from the
        round's start were shorter than asked by that much (issue 39: on a slow database
        some ran out before their jobs reached the worker)."""
        picks = [
            Lane(r.tenant_id, r.vtime, r.weight, unit=lane_unit(cfg.fairness_by, r.unit_est))
            for r in rows
        ]
        at = self.monotonic()
        if cfg.rate_limited and self.rests.type_rests_until(job_type, at) is not None:
            # The type's bucket was found used up and no token is due yet: nothing to
            # claim, and no lock or read to prove it.  Waiters are owed a look then.
            everyone = frozenset(r.tenant_id for r in rows)
            return RoundPlan(Allocation({}, ()), 0, rate_out=everyone), []
        # Limited tenants whose buckets were found used up, with no token due yet: given
        # nothing (and lifted) without their locks, as if their buckets were read empty.
        resting = self.rests.resting_tenants(
            job_type, (r.tenant_id for r in rows if r.rate_limited), at
        )
        capped = [r.tenant_id for r in rows if r.max_active_jobs is not None]
        limited = [r.tenant_id for r in rows if r.rate_limited and r.tenant_id not in resting]
        # Found below their minimum: counted under their cap locks, served first (ADR 042).
        below = [r.tenant_id for r in rows if r.min_active_jobs is not None]
        limits = (capped, limited, resting, below)
        uncapped = cfg.max_active_jobs is None and not cfg.rate_limited
        # A call whose key reads met a capped key counts keys in every later round, rather
        # than read the keys once here and again in the transaction.
        keyed = cfg.max_active_per_key is not None or bool(keys_read.caps)
        if uncapped and not keyed and not capped and not limited and not below:
            plan = (
                trim_to_caps(picks, n, None, None, {}, tokens=dict.fromkeys(resting, 0))
                if resting
                else RoundPlan(allocate(picks, n))
            )
            lane_counts = {t: k for t, k in plan.allocation.counts.items() if k > 0}
            async with self.charges.owed_keys(job_type) as owed:
                ready = await keys_read.read(self.store, job_type, lane_counts, owed)
            if keys_read.capped(ready, None):
                # A key read has a cap of its own: counted and claimed under its cap lock,
                # in a transaction (the keys read again there, ADR 040).
                return await self._claim_capped(
                    job_type, picks, n, cfg, limits, claim_args, keys_read
                )
            counts = keys_read.split(lane_counts, ready)
            got = await self.store.claim(
                ClaimAsk(
                    job_type,
                    counts,
                    **claim_args,
                    now=self.clock(),  # leases run from the claim: see _claim's docstring
                    by_worker_time=cfg.fairness_by is FairnessBy.WORKER_TIME,
                )
            )
            return plan, got
        return await self._claim_capped(job_type, picks, n, cfg, limits, claim_args, keys_read)

    @retry_deadlock
    async def _claim_capped(
        self,
        job_type: str,
        picks: Sequence[Lane],
        n: int,
        cfg: TypeConfig,
        tenants: tuple[Sequence[str], Sequence[str], set[str], Sequence[str]],
        claim_args: dict[str, Any],
        keys_read: KeysRead,
    ) -> tuple[RoundPlan, list[Claimed]]:
        """A round that may meet a cap, a rate limit or a minimum (``tenants``: the capped
        tenants, the rate-limited ones, the rate-limited ones known to be out of tokens,
        and the ones found below their minimum, of the lanes read): in one transaction,
        the cap locks (type, then tenants by key: one global order, so no deadlock); the
        active jobs counted and the token buckets read *in later statements*, so that
        they see every activation that committed before the locks were ours; the
        allocation trimmed to that headroom and those tokens, the tenants below their
        minimum served first (ADR 042; every lane read may be touched, since trimming one
        lane's share moves picks to the next) and divided among the lanes' keys; the
        claim; the tokens it took written back (ADR 028); and the lanes it leaves at
        their caps held out of later reads (ADR 016) -- all committed before the locks
        go."""
        type_cap = cfg.max_active_jobs
        capped, limited, resting, below = tenants
        locked = sorted({*capped, *limited, *below})
        read_lanes = [p.tenant_id for p in picks]
        async with self.store.begin() as tx:
            if type_cap is None and not cfg.rate_limited and not locked:
                # Only keys have caps: their locks and counts come after the key read.
                type_active, room, buckets, minimums = None, {}, None, {}
            else:
                # One round trip: every statement made with the type's cap lock held is
                # one that every other claim of the type waits out (alembic 0014).
                counted = await tx.lock_and_count(
                    CountAsk(
                        job_type,
                        lock_type=type_cap is not None or cfg.rate_limited,
                        lock_tenants=locked,
                        type_cap=type_cap,
                        capped=capped,
                        type_limited=cfg.rate_limited,
                        limited=limited,
                    )
                )
                type_active, room, buckets = counted.type_active, counted.room, counted.buckets
                minimums = await tx.count_minimums(below) if below else {}
            tokens = dict.fromkeys(resting, 0)
            if buckets is not None:
                tokens.update(buckets.tenant_tokens())
            plan = trim_to_caps(
                picks,
                n,
                type_cap,
                type_active,
                room,
                type_tokens=None if buckets is None else buckets.type_tokens(),
                tokens=tokens,
                minimums=minimums,
            )
            lane_counts = {t: k for t, k in plan.allocation.counts.items() if k > 0}
            async with self.charges.owed_keys(job_type) as owed:
                counts = await keys_read.split_counted(
                    tx, job_type, lane_counts, owed, cfg.max_active_per_key, read_lanes
                )
            # The claim holds the lanes it leaves at their caps in its own statement.
            got = await tx.claim(
                ClaimAsk(
                    job_type,
                    counts,
                    **claim_args,
                    now=self.clock(),  # leases run from the claim: see _claim's docstring
                    by_worker_time=cfg.fairness_by is FairnessBy.WORKER_TIME,
                    hold=room,
                    fifo=cfg.key_fifo,
                )
            )
            taken = Counter(c.job.tenant_id for c in got)
            await keys_read.hold_full(
                tx, job_type, Counter((c.job.tenant_id, c.job.fairness_key) for c in got)
            )
            plan = as_claimed(plan, room, tokens, taken)
            if buckets is not None:
                await tx.take_tokens(TokensAsk(job_type, buckets, taken, len(got)))
                self.rests.used_up(
                    job_type, buckets, plan.rate_out, taken, len(got), self.monotonic()
                )
            return plan, got

    def token_due(self, job_type: str) -> float | None:
        """Seconds until the earliest bucket an activation of ``job_type`` in this
        process found used up gives its next token (None: none was); 0 once it is due.
        A waiter left without jobs by rate limits alone waits this long for them, not a
        backup poll (app.activation.waiting)."""
        return self.rests.token_due(job_type, self.monotonic())

    async def _activate(
        self, reqs: Sequence[ActivateRequest], *, fill: bool
    ) -> tuple[list[list[JobRow]], bool]:
        """Activate for ``reqs`` (one type and tenant filter) in shared rounds: each
        claim's jobs are shared out in request order, each taking up to what it still
        lacks.  The jobs per request, and whether the type was found dry (as above).
        Lanes that come up short are made up from other lanes in further rounds;
        ``fill`` runs them until every request has what it asked for."""
        first = reqs[0]
        job_type = first.job_type
        aging: Aging | None = None
        dry = held_back = False
        claimed: list[list[JobRow]] = [[] for _ in reqs]
        picks: list[str] = []
        exclude: set[str] = set()
        short: set[str] = set()
        keys_read = KeysRead()
        lacking = [req.max_jobs for req in reqs]
        widen = 1
        try:
            rounds = 0
            while True:
                rounds += 1
                if rounds > MAX_ROUNDS:  # cannot happen (see ADR 014); never loop on a bug
                    log.error("activation of %r stopped after %d rounds", job_type, MAX_ROUNDS)
                    break
                self.counters.queries += 1
                remaining = sum(lacking)
                width = max(remaining + LANE_SLACK, min(WIDEST_READ, widen * LANE_SLACK))
                read = await self.charges.read(job_type, width, sorted(exclude), first.tenant_ids)
                cfg, rows = read.config, read.ready
                self.fair_by_seen[job_type] = cfg.fairness_by
                aging = self.resolve_aging(cfg.aging_interval_ms, cfg.aging_step)
                if read.paused:
                    # Nothing to give until it is resumed, which notifies the type: the
                    # callers wait as for a dry type.
                    dry = True
                    break
                # Lanes met without a ready job are parked after the call, and not read
                # again in it.
                short.update(read.empty)
                exclude.update(read.empty)
                keys_read.emptied(read.emptied_keys)
                if not rows:
                    if read.more:
                        continue  # the scan stopped among empty lanes: read on past them
                    # Every active lane not excluded was read and none has a ready job; the
                    # type is dry unless a lane was excluded that may still have some.
                    dry = not held_back
                    break
                sharing = [i for i, n in enumerate(lacking) if n > 0]
                plan, got = await self._claim(
                    job_type,
                    rows,
                    remaining,
                    cfg,
                    {
                        "shares": [
                            Share(reqs[i].worker, reqs[i].lease_ms, lacking[i]) for i in sharing
                        ],
                        "via_stream": first.via_stream,
                        "aging_step": aging.step,
                        "aging_interval_ms": aging.interval_ms,
                    },
                    keys_read,
                )
                self.metrics.jobs_activated(job_type, [c.job for c in got])
                for c in got:
                    i = sharing[c.share - 1]
                    claimed[i].append(c.job)
                    lacking[i] -= 1
                picks.extend(plan.allocation.picks)
                per_lane = Counter(c.job.tenant_id for c in got)
                per_key = Counter((c.job.tenant_id, c.job.fairness_key) for c in got)
                if got or plan.lifted:
                    self.charges.add(
                        job_type,
                        round_charges(
                            [c.job for c in got],
                            cfg.fairness_by,
                            {r.tenant_id: r.weight for r in rows},
                            keys_read.weights,
                            plan.lifted,
                            plan.exempt,  # as many as were claimed: round_charges' min
                        ),
                    )
                round_short = {t for t, k in plan.allocation.counts.items() if per_lane[t] < k}
                # A lane short only because keys of it came up short (drained, or heads
                # held) is read again, without those keys; one whose key read found no
                # ready key, having seen them all, is excluded as an empty lane is.
                keys_read.claimed(per_key)
                out_of_keys = keys_read.exhausted & round_short
                short |= out_of_keys
                # Lanes probed and found with no key free (all held at their caps) are
                # out of the call too, not parked: they have ready jobs (ADR 040).
                exclude |= keys_read.exhausted | plan.capped_out | plan.rate_out
                # Short because drained, or because another activator held the heads; at
                # cap; out of tokens.
                held_back = held_back or bool(
                    round_short or plan.capped_out or plan.rate_out or keys_read.exhausted
                )
                # At the type's cap once this round's claims used its headroom: a round whose
                # allocation the cap trimmed but whose claims came up short leaves room.
                type_full = plan.type_headroom is not None and len(got) >= plan.type_headroom
                if remaining <= len(got) or type_full or (got and not fill):
                    break
                if not round_short and not plan.capped_out and not plan.rate_out:
                    break
                widen *= 2
        except Exception:
            # A later round failed (the database refused a claim, or went away): the
            # jobs earlier rounds claimed for these callers go back at once rather than
            # wait out their leases.
            taken = [row for theirs in claimed for row in theirs]
            if taken:
                self._spawn(self.release(taken), "releasing")
            raise
        if short or keys_read.short:
            # Parked, later reads need not probe them; that need not delay this answer.
            self.charges.park(job_type, sorted(short), sorted(keys_read.short))
        if aging is None:  # defensive: maxJobs >= 1 always runs a round
            aging = await self.aging_for(job_type)
        self.aging_seen[job_type] = aging
        return [in_pick_order(theirs, picks) for theirs in claimed], dry


# Callers activated together share a job type, a tenant filter and whether the jobs go
# to a stream (one claim writes one via_stream).
_GroupKey = tuple[str, TenantFilter, bool]
# What one caller gets: its jobs, and whether the type was found dry.
_Answer = tuple[list[JobRow], bool]
