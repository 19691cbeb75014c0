"""A model-based test of activation on real PostgreSQL (issue 19 §1).

Hypothesis drives the real store and activation service with random tenants, weights,
caps, priorities, tenant filters, creates, activations, completions (current and stale),
failures, lease expiries and cancels (of ready and of activated jobs), one caller at a
time, and after every step compares the database with a reference model written here
from DESIGN §1 alone:

* states and activation counts of every job equal the model's (nothing lost, nothing
  finished twice, a stale fence changes nothing, every ACTIVATED job has a deadline);
* work conservation: an activation gets exactly ``min(maxJobs, eligible)`` jobs, where
  eligible counts the ready jobs of the asked tenants that their caps and the type's cap
  leave room for -- however the lanes' history left them;
* caps: no tenant or type is ever over its cap;
* stride: the tenants an activation serves are those that stride picks over the lanes'
  virtual times (min vtime first, ties by tenant, a capped or empty lane skipped) give;
  the model keeps the virtual times itself (charged ``jobs / weight``, re-entry of an
  idle lane at the system's virtual time, no banked credit) and they must equal the
  database's after every step;
* two levels (ADR 027): inside each lane, the fairness keys an activation serves are
  those that stride picks over the keys' virtual times give (by key weight, an empty key
  skipped), the model keeping the keys' virtual times too (re-entry of an idle key at
  its lane's key virtual time);
* inside a key, no job left ready has a higher priority than one activated;
* a lane or a key with a ready job is never parked;
* key caps (issue 44, ADR 040): a key's own cap and the type's per-key cap are never
  exceeded, an activation's keys are those stride picks give among the keys with room
  (a key at its cap skipped, its lane's turn going to its other keys, a lane without
  such a key skipped), and a key is held only while it is at a cap; a released key
  re-enters at its lane's key virtual time if it fell behind it;
* a lane is held out of the reads (ADR 016) only while its tenant is at its cap; being
  held banks no credit: a lane released re-enters at the system's virtual time if it
  fell behind it, as an idle lane does;
* liveness (issue 39): a long poll waits beside the other steps, woken by nothing but
  its backup poll (no NOTIFY reaches this harness), and no job that its tenants, caps and
  the type's cap leave eligible for it waits longer than a backup poll and a round while
  it waits; what it gets is checked as an activation's is (stride, caps, priority).

Weights are powers of two so that virtual times add up exactly in floating point.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.activation.waiting import WaiterHub
from app.config import Settings
from app.db import Database, finishing, job_rows, lanes
from app.domain import utcnow
from app.operators import ConfigService
from app.sweepers import LeaseSweeper

TYPE = "model"
TENANTS = ("a", "b", "c", "d")
WEIGHTS = (1, 2, 4)
CAPS = (None, 0, 1, 2, 5)
TYPE_CAPS = (None, 0, 1, 3, 8)
KEYS = ("", "x", "y")  # '': the tenant's default key
KEY_CAPS = (None, 0, 1, 2)  # a key's own maxActiveJobs (ADR 040)
PER_KEY = (None, 1, 2)  # the type's maxActivePerKey
STEPS = {"n": 0, "held": 0, "waited": 0, "key held": 0}
# The long poll's backup poll, and how long a job eligible for it may wait: a backup poll
# (jittered up to 1.25 times) and a round, generously (the machine is shared).
BACKUP_POLL_MS = 50
ROUND_S = 2.0

# Rules draw a number, not from a list: how many jobs a long poll served by its dispatcher
# got decides what the model's lists hold, and hypothesis needs each run to draw alike
# whatever that was (drawing from the list, a run under load failed with
# FlakyStrategyDefinition: a list of 281 jobs one time, 282 the next).
CHOICE = st.integers(0, 1 << 16)


def pick(choices, i):
    """The i-th of ``choices``, cyclically."""
    return choices[i % len(choices)]


@dataclass
class Job:
    tenant: str
    priority: int
    key: str = ""
    state: str = "CREATED"
    count: int = 0
    retries: int = 3


class Model:
    """What DESIGN §1 says the system holds, kept without looking at the database."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.weight: dict[str, int] = dict.fromkeys(TENANTS, 1)
        self.cap: dict[str, int | None] = dict.fromkeys(TENANTS)
        self.type_cap: int | None = None
        self.small = 0  # single-job tenants created so far: s0, s1, ...
        # Each lane's virtual time, kept by DESIGN §1.1's rules: charged 1/weight per job
        # activated; a lane that becomes backlogged re-enters at the system's virtual
        # time (the smallest of the backlogged lanes, else the largest of all, else 0)
        # if it is behind it, so that no lane banks credit while it is idle.
        self.vtime: dict[str, float] = {}
        # The lanes held at their tenant's cap.  Which lanes an activation holds depends
        # on the lanes it read, so the model takes the set from the database after each
        # activation, and checks it (held_lanes_are_at_their_caps); what a release does
        # to a held lane's virtual time, it predicts.
        self.held: set[str] = set()
        # The second level: each (tenant, key)'s virtual time inside its lane, and the
        # keys' weights.
        self.kvtime: dict[tuple[str, str], float] = {}
        self.kweight: dict[tuple[str, str], int] = {}
        # Key caps: each key's own, the type's per key, and the keys held at one (taken
        # from the database after each activation, as the held lanes are).
        self.kcap: dict[tuple[str, str], int | None] = {}
        self.per_key: int | None = None
        self.kheld: set[tuple[str, str]] = set()

    @property
    def tenants(self) -> tuple[str, ...]:
        return TENANTS + tuple(f"s{i}" for i in range(self.small))

    def idle_lanes(self) -> tuple[set[str], float, dict[str, tuple[set[str], float]]]:
        """Before jobs may become ready: the tenants without a ready job, and the
        virtual time at which those of them that get one re-enter; per tenant, the same
        for its keys."""
        idle = {t for t in self.tenants if not self.ready(t)}
        keys = {}
        for t in self.tenants:
            mine = [k for (u, k) in self.kvtime if u == t]
            busy = [self.kvtime[(t, k)] for k in mine if self.ready_key(t, k)]
            now = min(busy) if busy else max((self.kvtime[(t, k)] for k in mine), default=0.0)
            keys[t] = ({k for k in KEYS if not self.ready_key(t, k)}, now)
        return idle, self.system_vtime(), keys

    def system_vtime(self, but: str | None = None) -> float:
        """The smallest virtual time of the backlogged lanes not held (but ``but``), else
        the largest of all, else 0."""
        backlogged = [
            self.vtime[t] for t in self.tenants if t != but and t not in self.held and self.ready(t)
        ]
        return min(backlogged) if backlogged else max(self.vtime.values(), default=0.0)

    def release(self, tenant: str) -> None:
        """Capacity of ``tenant`` freed, or its configuration changed: its lane is
        released if held, re-entering at the system's virtual time if behind it."""
        if tenant in self.held:
            self.held.discard(tenant)
            self.vtime[tenant] = max(self.vtime[tenant], self.system_vtime(but=tenant))

    def key_release(self, *keys: tuple[str, str]) -> None:
        """A job of each key ended, or their caps changed: the held ones released in one
        statement, each re-entering at its lane's key virtual time (the least of its
        lane's backlogged keys not held before the release, else the greatest of them
        all) if it is behind it."""
        held = [tk for tk in keys if tk in self.kheld]
        moved = {}
        for tenant, key in held:
            mine = [k for (u, k) in self.kvtime if u == tenant]
            busy = [
                self.kvtime[(tenant, k)]
                for k in mine
                if (tenant, k) not in self.kheld and self.ready_key(tenant, k)
            ]
            now = min(busy) if busy else max(self.kvtime[(tenant, k)] for k in mine)
            moved[(tenant, key)] = max(self.kvtime[(tenant, key)], now)
        self.kvtime.update(moved)
        self.kheld -= set(held)

    def key_active(self, tenant: str, key: str) -> int:
        return sum(
            1
            for j in self.jobs.values()
            if j.state == "ACTIVATED" and j.tenant == tenant and j.key == key
        )

    def key_cap(self, tenant: str, key: str) -> int | None:
        caps = [c for c in (self.kcap.get((tenant, key)), self.per_key) if c is not None]
        return min(caps) if caps else None

    def key_room(self, tenant: str, key: str) -> float:
        """Jobs of the key an activation may take now, by its caps alone."""
        cap = self.key_cap(tenant, key)
        return float("inf") if cap is None else max(0, cap - self.key_active(tenant, key))

    def reenter(self, before: tuple[set[str], float, dict[str, tuple[set[str], float]]]) -> None:
        """After jobs became ready: the idle lanes that got one re-enter, and the idle
        keys inside their lanes."""
        idle, now, keys = before
        for t in idle:
            if self.ready(t):
                self.vtime[t] = max(self.vtime.get(t, now), now)
        for t, (idle_keys, key_now) in keys.items():
            for k in idle_keys:
                if self.ready_key(t, k):
                    self.kvtime[(t, k)] = max(self.kvtime.get((t, k), key_now), key_now)

    def ready(self, tenant: str) -> list[int]:
        return [k for k, j in self.jobs.items() if j.tenant == tenant and j.state == "CREATED"]

    def ready_key(self, tenant: str, key: str) -> list[int]:
        return [
            k
            for k, j in self.jobs.items()
            if j.tenant == tenant and j.key == key and j.state == "CREATED"
        ]

    def active(self, tenant: str | None = None) -> int:
        return sum(
            1
            for j in self.jobs.values()
            if j.state == "ACTIVATED" and (tenant is None or j.tenant == tenant)
        )

    def room(self, tenant: str) -> int:
        """Jobs of ``tenant`` an activation may take now, by its backlog, its keys' caps
        and its cap."""
        cap = self.cap.get(tenant)
        ready = int(
            sum(min(len(self.ready_key(tenant, k)), self.key_room(tenant, k)) for k in KEYS)
        )
        return ready if cap is None else max(0, min(ready, cap - self.active(tenant)))

    def type_room(self) -> float:
        return float("inf") if self.type_cap is None else max(0, self.type_cap - self.active())

    def eligible(self, tenants: tuple[str, ...]) -> int:
        return int(min(self.type_room(), sum(self.room(t) for t in tenants)))

    def stride_picks(
        self, tenants: tuple[str, ...], n: int, vtimes: dict[str, float]
    ) -> Counter[tuple[str, str]]:
        """n stride picks over the lanes with room, from their virtual times, each then
        given to the lane's key with the least virtual time among those with ready jobs
        left and room under their caps (one pick at a time: the rounds, their short
        claims and the keys they exclude add up to this)."""
        n = int(min(n, self.type_room()))
        heap = [(vtimes[t], t, self.room(t)) for t in tenants if self.room(t) > 0]
        heapq.heapify(heap)
        kv = dict(self.kvtime)
        left = {
            (t, k): min(len(self.ready_key(t, k)), self.key_room(t, k))
            for t in tenants
            for k in KEYS
        }
        got: Counter[tuple[str, str]] = Counter()
        while heap and sum(got.values()) < n:
            v, t, room = heapq.heappop(heap)
            key = min((k for k in KEYS if left[(t, k)] > 0), key=lambda k: (kv[(t, k)], k))
            got[(t, key)] += 1
            left[(t, key)] -= 1
            kv[(t, key)] += 1 / self.kweight.get((t, key), 1)
            if room > 1:
                heapq.heappush(heap, (v + 1 / self.weight.get(t, 1), t, room - 1))
        return got


class ActivationMachine(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop
    store: Database

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.service = Rounds(self.store, Settings())
        self.config = ConfigService(self.store, self.service.resolve_aging)
        self.run(
            self.store.execute(
                "TRUNCATE jobs, lanes, lane_keys, key_weights, tenants, job_types, job_events"
            ),
        )
        # No aging during a run: priority alone orders a tenant's jobs.
        self.run(self.config.put_job_type(TYPE, None, 3_600_000, 10))
        self.hub = WaiterHub(
            self.service, self.service.release, max_waiters=10, backup_poll_ms=BACKUP_POLL_MS
        )
        # The long poll waiting, if any: its task and the tenants it asked for.
        self.waiting: tuple[asyncio.Task, ActivateRequest, tuple[str, ...]] | None = None

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.hub.close())
        if self.waiting is not None:
            self.run(asyncio.gather(self.waiting[0], return_exceptions=True))
        self.run(self.service.settle())

    # -- producing and configuring ------------------------------------------------------

    @rule(
        tenant=st.sampled_from(TENANTS),
        jobs=st.lists(
            st.tuples(st.sampled_from((0, 50, 100)), st.sampled_from(KEYS)), min_size=1, max_size=6
        ),
    )
    def create(self, tenant, jobs):
        sent = [
            {"type": TYPE, "tenantId": tenant, "priority": p, **({"fairnessKey": k} if k else {})}
            for p, k in jobs
        ]
        before = self.model.idle_lanes()
        for (p, k), inserted in zip(
            jobs, self.run(job_rows.insert(self.store, sent, utcnow())), strict=True
        ):
            self.model.jobs[inserted.job_key] = Job(tenant, p, k)
        self.model.reenter(before)

    @precondition(lambda self: self.model.small < 400)
    @rule(n=st.integers(1, 100))
    def create_single_job_tenants(self, n):
        """Many tenants of one job each: once drained, their lanes crowd the lane reads."""
        first = self.model.small
        self.model.small += n
        before = self.model.idle_lanes()
        tenants = [f"s{i}" for i in range(first, first + n)]
        jobs = [{"type": TYPE, "tenantId": t} for t in tenants]
        for t, inserted in zip(
            tenants, self.run(job_rows.insert(self.store, jobs, utcnow())), strict=True
        ):
            self.model.jobs[inserted.job_key] = Job(t, 50)
        self.model.reenter(before)

    @rule(
        tenant=st.sampled_from(TENANTS), weight=st.sampled_from(WEIGHTS), cap=st.sampled_from(CAPS)
    )
    def configure_tenant(self, tenant, weight, cap):
        self.run(self.config.put_tenant(tenant, weight, cap))
        self.model.release(tenant)
        self.model.weight[tenant] = weight
        self.model.cap[tenant] = cap

    @rule(
        tenant=st.sampled_from(TENANTS), key=st.sampled_from(KEYS), weight=st.sampled_from(WEIGHTS)
    )
    def configure_key(self, tenant, key, weight):
        cap = self.model.kcap.get((tenant, key))
        self.run(self.config.put_key(tenant, key or "<default>", weight, cap))
        self.model.kweight[(tenant, key)] = weight
        self.model.key_release((tenant, key))

    @rule(tenant=st.sampled_from(TENANTS), key=st.sampled_from(KEYS), cap=st.sampled_from(KEY_CAPS))
    def configure_key_cap(self, tenant, key, cap):
        weight = self.model.kweight.get((tenant, key), 1)
        self.run(self.config.put_key(tenant, key or "<default>", weight, cap))
        self.model.kweight[(tenant, key)] = weight
        self.model.kcap[(tenant, key)] = cap
        self.model.key_release((tenant, key))

    @rule(cap=st.sampled_from(TYPE_CAPS))
    def configure_type(self, cap):
        self.run(self.config.put_job_type(TYPE, cap, 3_600_000, 10, per_key=self.model.per_key))
        self.model.type_cap = cap
        self.model.key_release(*sorted(self.model.kheld))

    @rule(per_key=st.sampled_from(PER_KEY))
    def configure_per_key(self, per_key):
        cap = self.model.type_cap
        self.run(self.config.put_job_type(TYPE, cap, 3_600_000, 10, per_key=per_key))
        self.model.per_key = per_key
        self.model.key_release(*sorted(self.model.kheld))

    # -- activating -----------------------------------------------------------------------

    @rule(
        max_jobs=st.integers(1, 20),
        tenants=st.one_of(st.none(), st.sets(st.sampled_from(TENANTS), min_size=1)),
    )
    def activate(self, max_jobs, tenants):
        asked = self.model.tenants if tenants is None else tuple(sorted(tenants))
        vtimes = {t: self.model.vtime.get(t, 0.0) for t in self.model.tenants}
        expected = min(max_jobs, self.model.eligible(asked))
        picks = self.model.stride_picks(asked, max_jobs, vtimes)
        ready_before = {t: self.model.ready(t) for t in asked}
        active_before = {t: self.model.active(t) for t in self.model.tenants}
        type_active_before = self.model.active()
        req = ActivateRequest(TYPE, max_jobs, 60_000, "w", None if tenants is None else asked)
        rows, _ = self.run(self.service.activate(req))
        self.run(self.service.settle())
        assert len(rows) == expected, (len(rows), expected, self.model.__dict__)
        self._took(rows, asked, picks, ready_before, active_before, type_active_before)

    @precondition(lambda self: self.waiting is None)
    @rule(tenants=st.one_of(st.none(), st.sets(st.sampled_from(TENANTS), min_size=1)))
    def long_poll(self, tenants, max_jobs=1):
        """A worker's long poll, left waiting beside the steps that follow until it is
        served (an hour at most: it is never timed out here).  For one job: how many of
        several a waiter's first round gets depends on when its backup poll fires, and
        later steps draw from the jobs activated, which hypothesis must see the same on
        every replay (a CI run failed with FlakyStrategyDefinition at up to 5)."""
        asked = self.model.tenants if tenants is None else tuple(sorted(tenants))
        req = ActivateRequest(TYPE, max_jobs, 60_000, "poller", None if tenants is None else asked)
        task = self.loop.create_task(self.hub.long_poll(req, 3600, asyncio.Event()))
        self.waiting = (task, req, asked)

    def _serve_waiter(self) -> None:
        """Before every check: the long poll waiting, if a job is eligible for it, is
        served within a backup poll and a round (else a job is stranded); what it got
        is checked and recorded."""
        if self.waiting is None:
            return
        task, req, asked = self.waiting
        # Tenants created since it began asked for all of them.
        asked = self.model.tenants if req.tenant_ids is None else asked
        eligible = self.model.eligible(asked)
        if not task.done() and eligible:
            bound = BACKUP_POLL_MS / 1000 * 1.25 + ROUND_S
            self.run(asyncio.wait([task], timeout=bound))
            assert task.done(), (
                f"stranded: {eligible} jobs eligible for a long poll of {asked} waited "
                f"more than {bound} s (a backup poll and a round)"
            )
        if not task.done():
            # Its dispatcher's backup polls activate beside the steps, and a capped round
            # that found nothing still holds the lanes it left at their caps (only those:
            # held_lanes_are_at_their_caps checks it).
            held = self._held()
            assert self.model.held <= held, (self.model.held, held)
            self.model.held = held
            kheld = self._held_keys()
            assert self.model.kheld <= kheld, (self.model.kheld, kheld)
            self.model.kheld = kheld
            return
        self.waiting = None
        rows = task.result()
        self.run(self.service.settle())
        STEPS["waited"] += 1
        assert 1 <= len(rows) <= min(req.max_jobs, eligible), (len(rows), req, eligible)
        vtimes = {t: self.model.vtime.get(t, 0.0) for t in self.model.tenants}
        picks = self.model.stride_picks(asked, len(rows), vtimes)
        ready_before = {t: self.model.ready(t) for t in asked}
        active_before = {t: self.model.active(t) for t in self.model.tenants}
        self._took(rows, asked, picks, ready_before, active_before, self.model.active())

    def _took(self, rows, asked, picks, ready_before, active_before, type_active_before):
        """An activation's ``rows``, checked against the model and recorded in it: the
        stride ``picks``, the caps, priority inside each key."""
        got = Counter((r.tenant_id, r.fairness_key) for r in rows)
        assert got == picks, (got, picks, self.model.vtime, self.model.kvtime)
        lanes = Counter(r.tenant_id for r in rows)
        for t, n in lanes.items():
            self.model.vtime[t] += n / self.model.weight.get(t, 1)
        for tk, n in got.items():
            self.model.kvtime[tk] += n / self.model.kweight.get(tk, 1)
        for r in rows:
            job = self.model.jobs[r.job_key]
            assert job.state == "CREATED", (r.job_key, job)
            assert r.activation_count == job.count + 1
            job.state, job.count = "ACTIVATED", job.count + 1
        held = self._held()
        assert self.model.held <= held, (self.model.held, held)  # activations only hold
        self.model.held = held
        kheld = self._held_keys()
        assert self.model.kheld <= kheld, (self.model.kheld, kheld)
        self.model.kheld = kheld
        # Key caps: an activation never takes a key over its caps.
        for (t, k), n in got.items():
            cap = self.model.key_cap(t, k)
            before = self.model.key_active(t, k) - n
            assert cap is None or self.model.key_active(t, k) <= max(cap, before), (t, k)
        # Caps: an activation never takes a tenant or the type over its cap (a cap lowered
        # below what is active already holds back new activations only).
        for t in self.model.tenants:
            cap = self.model.cap.get(t)
            assert cap is None or self.model.active(t) <= max(cap, active_before[t])
        cap = self.model.type_cap
        assert cap is None or self.model.active() <= max(cap, type_active_before)
        for t in asked:
            for key in KEYS:
                taken = [
                    self.model.jobs[r.job_key].priority
                    for r in rows
                    if r.tenant_id == t and r.fairness_key == key
                ]
                left = [
                    self.model.jobs[k].priority
                    for k in ready_before[t]
                    if self.model.jobs[k].state == "CREATED" and self.model.jobs[k].key == key
                ]
                if taken and left:
                    assert min(taken) >= max(left), (t, key, taken, left)

    # -- finishing ------------------------------------------------------------------------

    def _active(self) -> list[int]:
        return sorted(k for k, j in self.model.jobs.items() if j.state == "ACTIVATED")

    @precondition(lambda self: self._active())
    @rule(i=CHOICE)
    def complete(self, i):
        key = pick(self._active(), i)
        job = self.model.jobs[key]
        done = self.run(finishing.complete(self.store, [(key, job.count, None)], utcnow()))
        assert [e.job_key for e in done] == [key]
        self.model.release(job.tenant)
        self.model.key_release((job.tenant, job.key))
        job.state = "COMPLETED"

    @precondition(lambda self: self.model.jobs)
    @rule(i=CHOICE, off=st.sampled_from((-1, 1)))
    def complete_stale(self, i, off):
        """A finish with any activation count but the current one of an ACTIVATED job."""
        key = pick(sorted(self.model.jobs), i)
        job = self.model.jobs[key]
        count = job.count + (off if job.state == "ACTIVATED" else 0)
        if count < 0:
            count = job.count + 1
        assert self.run(finishing.complete(self.store, [(key, count, None)], utcnow())) == []

    @precondition(lambda self: self._active())
    @rule(i=CHOICE)
    def fail(self, i):
        key = pick(self._active(), i)
        job = self.model.jobs[key]
        now = utcnow()
        row = self.run(
            finishing.fail(
                self.store,
                key,
                job.count,
                retries=None,
                error_message="x",
                run_at=now,
                variables=None,
                now=now,
            )
        )
        assert row is not None
        self.model.release(job.tenant)
        self.model.key_release((job.tenant, job.key))
        before = self.model.idle_lanes()
        job.retries = max(0, job.retries - 1)
        job.state = "FAILED" if job.retries == 0 else "CREATED"
        self.model.reenter(before)

    @precondition(lambda self: self._active())
    @rule(i=CHOICE)
    def expire(self, i):
        key = pick(self._active(), i)
        now = utcnow()
        self.run(
            self.store.execute(
                "UPDATE jobs SET deadline = $2 WHERE job_key = $1", key, now - timedelta(seconds=1)
            )
        )
        assert self.run(LeaseSweeper(self.store, 1000).run_once(now)) == 1
        job = self.model.jobs[key]
        self.model.release(job.tenant)
        self.model.key_release((job.tenant, job.key))
        before = self.model.idle_lanes()
        self.model.jobs[key].state = "CREATED"
        self.model.reenter(before)

    @precondition(lambda self: any(j.state == "CREATED" for j in self.model.jobs.values()))
    @rule(i=CHOICE)
    def cancel(self, i):
        ready = sorted(k for k, j in self.model.jobs.items() if j.state == "CREATED")
        key = pick(ready, i)
        assert self.run(finishing.cancel(self.store, key, utcnow()))
        # A cancel releases its tenant's held lanes whatever the job's state was: the
        # statement cannot tell a job activated a moment before it from one that was not.
        self.model.release(self.model.jobs[key].tenant)
        self.model.key_release((self.model.jobs[key].tenant, self.model.jobs[key].key))
        self.model.jobs[key].state = "CANCELED"

    @precondition(lambda self: self._active())
    @rule(i=CHOICE)
    def cancel_activated(self, i):
        """An ACTIVATED job canceled: its capacity freed, as a finish frees it."""
        key = pick(self._active(), i)
        assert self.run(finishing.cancel(self.store, key, utcnow()))
        self.model.release(self.model.jobs[key].tenant)
        self.model.key_release((self.model.jobs[key].tenant, self.model.jobs[key].key))
        self.model.jobs[key].state = "CANCELED"

    # -- after every step -----------------------------------------------------------------

    def _held(self) -> set[str]:
        rows = self.run(
            self.store.fetch("SELECT tenant_id FROM lanes WHERE job_type = $1 AND held", TYPE)
        )
        return {r["tenant_id"] for r in rows}

    def _held_keys(self) -> set[tuple[str, str]]:
        rows = self.run(
            self.store.fetch(
                "SELECT tenant_id, fairness_key FROM lane_keys WHERE job_type = $1 AND held",
                TYPE,
            )
        )
        return {(r["tenant_id"], r["fairness_key"]) for r in rows}

    @invariant()
    def held_keys_are_at_their_caps(self):
        """No key is held while it has room under its caps: whatever freed it, or changed
        its caps, released it."""
        self._serve_waiter()
        held = self._held_keys()
        if self.waiting is not None:
            assert self.model.kheld <= held, (held, self.model.kheld)
            self.model.kheld = held
        assert held == self.model.kheld, (held, self.model.kheld)
        STEPS["key held"] += bool(held)
        for t, k in held:
            cap = self.model.key_cap(t, k)
            assert cap is not None and self.model.key_active(t, k) >= cap, (t, k, cap)

    @invariant()
    def held_lanes_are_at_their_caps(self):
        """No lane is held while its tenant has room: whatever freed it released it."""
        self._serve_waiter()
        held = self._held()
        if self.waiting is not None:
            # A waiting long poll's backup poll may hold a lane at its cap at any moment,
            # this check's own reads included (the loop below checks it is at its cap).
            assert self.model.held <= held, (held, self.model.held)
            self.model.held = held
        assert held == self.model.held, (held, self.model.held)
        STEPS["held"] += bool(held)
        for t in held:
            cap = self.model.cap.get(t)
            assert cap is not None and self.model.active(t) >= cap, (t, cap, self.model.active(t))

    @invariant()
    def database_matches_the_model(self):
        self._serve_waiter()
        STEPS["n"] += 1
        rows = self.run(
            self.store.fetch("SELECT job_key, state, activation_count, deadline FROM jobs")
        )
        db = {r["job_key"]: (r["state"], r["activation_count"]) for r in rows}
        assert db == {k: (j.state, j.count) for k, j in self.model.jobs.items()}
        for r in rows:
            assert (r["deadline"] is not None) == (r["state"] == "ACTIVATED"), r

    @invariant()
    def virtual_times_match_the_model(self):
        self._serve_waiter()
        rows = self.run(
            self.store.fetch("SELECT tenant_id, vtime FROM lanes WHERE job_type = $1", TYPE)
        )
        assert {r["tenant_id"]: r["vtime"] for r in rows} == self.model.vtime

    @invariant()
    def key_virtual_times_match_the_model(self):
        self._serve_waiter()
        rows = self.run(
            self.store.fetch(
                "SELECT tenant_id, fairness_key, vtime FROM lane_keys WHERE job_type = $1", TYPE
            )
        )
        assert {(r["tenant_id"], r["fairness_key"]): r["vtime"] for r in rows} == (
            self.model.kvtime
        )

    @invariant()
    def a_key_with_a_ready_job_is_active(self):
        self._serve_waiter()
        rows = self.run(
            self.store.fetch(
                "SELECT tenant_id, fairness_key FROM lane_keys WHERE job_type = $1 AND active",
                TYPE,
            )
        )
        active = {(r["tenant_id"], r["fairness_key"]) for r in rows}
        for t in self.model.tenants:
            for k in KEYS:
                if self.model.ready_key(t, k):
                    assert (t, k) in active, (t, k)

    @invariant()
    def a_lane_with_a_ready_job_is_active(self):
        self._serve_waiter()
        rows = self.run(
            self.store.fetch("SELECT tenant_id FROM lanes WHERE job_type = $1 AND active", TYPE)
        )
        active = {r["tenant_id"] for r in rows}
        for t in self.model.tenants:
            if self.model.ready(t):
                assert t in active, t


@pytest.mark.parametrize("degraded", [False, True], ids=["", "degraded"])
def test_activation_matches_the_model(db_url, monkeypatch, degraded):
    """Thousands of steps (60 runs of up to 60 steps) on real PostgreSQL.  ``degraded``:
    as while the job table holds many dead versions (ADR 036), charges written only when
    settled (each step settles; CHARGE_EVERY_S an hour) and counted by the reads in
    between, the key reads adding them, no one-pick claims and no hand-offs -- and the
    model unchanged (the claims' hints given a slack that skips nothing: their own test
    is test_claim_hints)."""
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(Database.connect(db_url, size=4, min_size=1))
    counted = Counter()
    if degraded:
        monkeypatch.setattr("app.activation.charging.CHARGE_EVERY_S", 3600)
        read = lanes.read

        async def counting(*args, **kwargs):
            counted[kwargs.get("counted", False)] += 1
            return await read(*args, **kwargs)

        monkeypatch.setattr(lanes, "read", counting)
        hints = store.claim_hints
        hints.observe(hints.DEGRADED_AT)
        hints.SLACK_S = 1e9
    ActivationMachine.loop, ActivationMachine.store = loop, store
    STEPS["n"] = STEPS["held"] = STEPS["waited"] = STEPS["key held"] = 0
    try:
        run_state_machine_as_test(
            ActivationMachine,
            settings=settings(
                max_examples=20 if degraded else 60,
                stateful_step_count=60,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        loop.run_until_complete(store.close())
        loop.close()
    print(
        f"model steps checked: {STEPS['n']}, with a lane held: {STEPS['held']}, "
        f"long polls served: {STEPS['waited']}, with a key held: {STEPS['key held']}"
    )
    assert STEPS["n"] >= (600 if degraded else 2_000)
    # The runs reached caps and held lanes were checked (how often depends on the seed:
    # 5 to 365 steps were seen).
    assert STEPS["held"] > 0 or degraded  # (20 runs may not reach one)
    # Degraded, the reads went through the degraded store (how many counted charges
    # they did not write depends on the runs: 0 to 21 of about 300 were seen; the
    # counted reads have their own tests in test_charges_deferred).
    assert sum(counted.values()) > 0 or not degraded, counted
    # Long polls waited and were served (by their backup poll, or at once).
    assert STEPS["waited"] > 0
    # Keys reached their caps and were held (ADR 040).
    assert STEPS["key held"] > 0 or degraded
