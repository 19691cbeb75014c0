"""A model-based test of fencing and leases on real PostgreSQL (issue 27 §1).

``test_scheduler_model`` checks *which* jobs an activation gets; this one checks what
happens to them afterwards, when workers race, stall, die and come back.  Hypothesis
drives the real store and services with named workers on two replicas (two activation
services, as two ``jobfair serve`` processes would have), short leases, and a clock the
test moves by hand (the activation service and the sweeper take ``now``), through:

* activations by one worker, and by two workers on two replicas at once;
* complete / fail / throw-error by the current holder, and by stale holders (a zombie:
  its lease ran out, the sweeper gave the job back, another worker has it now);
* two finishes of the same job at once on two connections (a holder's retried request,
  or a holder and a zombie);
* heartbeats (PATCH timeout, fenced) by the holder and by zombies;
* the clock moving on, the lease sweeper, and crashes (a worker forgets its jobs: only
  their leases' end gives them back).

After every step, against a reference model written from docs/invariants.md alone:

* a job is held by at most one live activation: every ACTIVATED row's worker and
  activation count are the model's holder, and no other worker holds it at that count;
* a finish is accepted at most once, and only for the current activation: a ledger of
  accepted finishes has at most one per (job, activation) and at most one terminal one
  per job, and every call was accepted exactly when the model said it would be;
* a refused call changed nothing: the job's row is equal before and after;
* every ACTIVATED row has a deadline (and only those), equal to the model's;
* a job's activation count goes up by one at each activation and never down.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from app.activation import ActivateRequest, Activation
from app.activation.rounds import Rounds
from app.config import Settings
from app.db import Database, finishing, job_rows, maintenance
from app.domain import MAX_LEASE_MS, utcnow
from app.errors import InvalidState, StaleActivation
from app.jobs import JobChanges, JobService

TYPE = "fencing"
WORKERS = ("w1", "w2", "w3", "w4")
LEASES_MS = (1_000, 2_000, 5_000)
FINISHES = ("complete", "fail", "error")
CHOICE = st.integers(0, 1 << 16)
STEPS = Counter[str]()
# The clock the activation service reads (passed to it): the model moves it, so that
# leases end when a rule says so, not when the machine is slow.
CLOCK: list[datetime] = [utcnow()]


def pick(choices, i):
    """The i-th of ``choices``, cyclically.  Rules draw a number, not from the list: which
    worker won a race decides what the lists hold, and hypothesis needs each run to draw
    the same way whatever the races decided."""
    return choices[i % len(choices)]


async def together(*calls):
    """The calls at once, each on its own pool connection."""
    return await asyncio.gather(*calls)


@dataclass
class Job:
    retries: int
    state: str = "CREATED"
    count: int = 0
    holder: str | None = None  # the worker of the current activation, while ACTIVATED
    deadline: datetime | None = None


@dataclass
class Model:
    jobs: dict[int, Job] = field(default_factory=dict)
    # What each worker believes it holds: job -> the activation count it was given.  A
    # worker keeps a job until it finished it (or was told 409); a crash forgets them all.
    hands: dict[str, dict[int, int]] = field(default_factory=lambda: {w: {} for w in WORKERS})
    # Accepted finishes per (job, activation), and terminal ones per job.
    accepted: Counter[tuple[int, int]] = field(default_factory=Counter)
    terminal: Counter[int] = field(default_factory=Counter)

    def ready(self) -> list[int]:
        return sorted(k for k, j in self.jobs.items() if j.state == "CREATED")

    def held(self) -> list[tuple[str, int, int]]:
        """Every (worker, job, count) some worker believes it holds, current or stale."""
        return sorted((w, k, c) for w, hand in self.hands.items() for k, c in hand.items())

    def current(self, key: int, count: int) -> bool:
        """Whether a finish fenced by ``count`` is for the job's live activation."""
        job = self.jobs[key]
        return job.state == "ACTIVATED" and job.count == count

    def finish(self, key: int, count: int, kind: str) -> None:
        """Apply an accepted finish, and write it in the ledger."""
        job = self.jobs[key]
        self.accepted[(key, count)] += 1
        if kind == "complete":
            job.state = "COMPLETED"
        elif kind == "error":
            job.state = "ERROR_THROWN"
        else:
            job.retries = max(0, job.retries - 1)
            job.state = "FAILED" if job.retries == 0 else "CREATED"
        if job.state != "CREATED":
            self.terminal[key] += 1
        job.holder = job.deadline = None


class FencingMachine(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop
    store: Database

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        CLOCK[0] = utcnow().replace(microsecond=0)
        # Two replicas: activations through different services are not coalesced, so
        # their claims race in PostgreSQL.
        # The activation service reads the model's clock: the model moves it.
        activations = [Activation(self.store, Settings(), clock=lambda: CLOCK[0]) for _ in "ab"]
        self.replicas = [a.rounds for a in activations]
        self.service = JobService(self.store, activations[0])
        self.run(self.store.execute("TRUNCATE jobs, lanes, tenants, job_types"))

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def settle(self) -> None:
        for replica in self.replicas:
            self.run(replica.settle())

    def teardown(self) -> None:
        self.settle()

    @property
    def now(self) -> datetime:
        return CLOCK[0]

    def row(self, key: int) -> dict:
        return dict(self.run(self.store.fetchrow("SELECT * FROM jobs WHERE job_key = $1", key)))

    def replica_of(self, worker: str) -> Rounds:
        return self.replicas[WORKERS.index(worker) % 2]

    # -- producing, activating ------------------------------------------------------------

    @initialize(retries=st.lists(st.sampled_from((1, 2, 3)), min_size=4, max_size=12))
    def create_a_backlog(self, retries):
        self.create(retries)

    @rule(retries=st.lists(st.sampled_from((1, 2, 3)), min_size=1, max_size=4))
    def create(self, retries):
        jobs = [{"type": TYPE, "retries": r} for r in retries]
        inserted = self.run(job_rows.insert(self.store, jobs, self.now))
        for r, job in zip(retries, inserted, strict=True):
            self.model.jobs[job.job_key] = Job(r)

    def _took(self, worker: str, lease_ms: int, rows) -> None:
        """Check and record the jobs an activation gave ``worker``."""
        for r in rows:
            job = self.model.jobs[r.job_key]
            assert job.state == "CREATED", (r.job_key, job)
            assert r.activation_count == job.count + 1, (r, job)  # strictly up, by one
            assert r.worker == worker and r.deadline == self.now + timedelta(milliseconds=lease_ms)
            job.state, job.count, job.holder, job.deadline = (
                "ACTIVATED",
                r.activation_count,
                worker,
                r.deadline,
            )
            self.model.hands[worker][r.job_key] = r.activation_count

    @rule(
        worker=st.sampled_from(WORKERS),
        max_jobs=st.integers(1, 4),
        lease_ms=st.sampled_from(LEASES_MS),
    )
    def activate(self, worker, max_jobs, lease_ms):
        ready = len(self.model.ready())
        req = ActivateRequest(TYPE, max_jobs, lease_ms, worker)
        rows, _ = self.run(self.replica_of(worker).activate(req))
        self.settle()
        assert len(rows) == min(max_jobs, ready), (len(rows), max_jobs, ready)
        self._took(worker, lease_ms, rows)
        STEPS["activated"] += len(rows)

    @rule(
        workers=st.lists(st.sampled_from(WORKERS), min_size=2, max_size=2, unique=True),
        max_jobs=st.tuples(st.integers(1, 4), st.integers(1, 4)),
        lease_ms=st.sampled_from(LEASES_MS),
    )
    def activate_on_two_replicas_at_once(self, workers, max_jobs, lease_ms):
        ready = len(self.model.ready())
        answers = self.run(
            together(
                *(
                    self.replicas[i].activate(ActivateRequest(TYPE, n, lease_ms, w))
                    for i, (w, n) in enumerate(zip(workers, max_jobs, strict=True))
                )
            )
        )
        self.settle()
        (first, _), (second, _) = answers
        assert not {r.job_key for r in first} & {r.job_key for r in second}
        assert len(first) <= max_jobs[0] and len(second) <= max_jobs[1]
        assert len(first) + len(second) <= ready
        self._took(workers[0], lease_ms, first)
        self._took(workers[1], lease_ms, second)
        STEPS["activated"] += len(first) + len(second)

    # -- finishing, by holders and zombies ------------------------------------------------

    async def _finish_by_service(self, kind: str, key: int, count: int) -> None:
        if kind == "complete":
            await self.service.complete(key, count, None)
        elif kind == "fail":
            await self.service.fail(
                key,
                count,
                retries=None,
                error_message="boom",
                retry_backoff_ms=0,
                variables=None,
                now=self.now,
            )
        else:
            await self.service.throw_error(key, count, "E", None, None, self.now)

    @rule(i=CHOICE, kind=st.sampled_from(FINISHES))
    def finish(self, i, kind):
        """A worker finishes a job it believes it holds (current, or a zombie's)."""
        if self.model.held():
            self._finish(*pick(self.model.held(), i), kind)

    @rule(i=CHOICE, kind=st.sampled_from(FINISHES))
    def a_zombie_finishes(self, i, kind):
        """A worker finishes a job another activation has had since its own."""
        stale = [h for h in self.model.held() if self.model.jobs[h[1]].count > h[2]]
        if stale:
            self._finish(*pick(stale, i), kind)

    def _finish(self, worker: str, key: int, count: int, kind: str) -> None:
        expected = self.model.current(key, count)
        before = self.row(key)
        try:
            self.run(self._finish_by_service(kind, key, count))
            accepted = True
        except StaleActivation:
            accepted = False
        assert accepted == expected, (worker, key, count, kind, before)
        del self.model.hands[worker][key]  # finished, or dropped on its 409
        if accepted:
            self.model.finish(key, count, kind)
            STEPS["accepted"] += 1
        else:
            assert self.row(key) == before, "a refused finish changed the job"
            STEPS["refused"] += 1
            STEPS["zombie"] += self.model.jobs[key].count > count

    async def _finish_in_store(self, kind: str, key: int, count: int) -> bool:
        if kind == "complete":
            return bool(await finishing.complete(self.store, [(key, count, None)], self.now))
        if kind == "fail":
            row = await finishing.fail(
                self.store,
                key,
                count,
                retries=None,
                error_message="boom",
                run_at=self.now,
                variables=None,
                now=self.now,
            )
            return row is not None
        return (
            await finishing.throw_error(self.store, key, count, "E", None, None, self.now)
            is not None
        )

    @rule(i=CHOICE, j=CHOICE, kinds=st.tuples(st.sampled_from(FINISHES), st.sampled_from(FINISHES)))
    def finish_twice_at_once(self, i, j, kinds):
        """Two finishes of one job on two connections at once: a holder's request and its
        retry, or a holder and a zombie of the same job."""
        if not self.model.held():
            return
        first = pick(self.model.held(), i)
        _, key, _ = first
        others = [h for h in self.model.held() if h[1] == key]
        second = pick(others, j)  # may be ``first`` again: a retry
        contenders = [first, second]
        current = [self.model.current(key, c) for _, _, c in contenders]
        before = self.row(key)
        verdicts = self.run(
            together(
                *(
                    self._finish_in_store(kind, key, c)
                    for kind, (_, _, c) in zip(kinds, contenders, strict=True)
                )
            )
        )
        for worker, _, _ in contenders:
            self.model.hands[worker].pop(key, None)
        STEPS["zombie"] += sum(self.model.jobs[key].count > c for _, _, c in contenders)
        # Only a finish for the live activation may win, and then exactly one does.
        assert all(c for c, ok in zip(current, verdicts, strict=True) if ok), (contenders, verdicts)
        assert sum(verdicts) == (1 if any(current) else 0), (contenders, current, verdicts)
        if not any(verdicts):
            assert self.row(key) == before, "refused finishes changed the job"
            STEPS["refused"] += 2
            return
        winner = verdicts.index(True)
        self.model.finish(key, contenders[winner][2], kinds[winner])
        STEPS["accepted"] += 1
        STEPS["refused"] += 1
        STEPS["raced"] += 1

    @rule(i=CHOICE, timeout_ms=st.sampled_from(LEASES_MS))
    def heartbeat(self, i, timeout_ms):
        """A fenced PATCH of the lease: extends the holder's, refuses anyone else's."""
        if not self.model.held():
            return
        worker, key, count = pick(self.model.held(), i)
        job = self.model.jobs[key]
        before = self.row(key)
        try:
            self.run(self.service.update(key, JobChanges(timeout_ms=timeout_ms), count, self.now))
            refused = None
        except (StaleActivation, InvalidState) as e:
            refused = type(e)
        if job.state in ("COMPLETED", "ERROR_THROWN"):
            assert refused is InvalidState, (worker, key, count, job)
        elif job.count != count:
            assert refused is StaleActivation, (worker, key, count, job)
        elif job.state != "ACTIVATED":  # its lease ran out and nobody took it since
            assert refused is InvalidState, (worker, key, count, job)
        else:
            assert refused is None, (worker, key, count, job, refused)
            job.deadline = self.now + timedelta(milliseconds=min(timeout_ms, MAX_LEASE_MS))
            STEPS["extended"] += 1
            return
        assert self.row(key) == before, "a refused heartbeat changed the job"
        del self.model.hands[worker][key]
        STEPS["refused"] += 1

    @rule(i=CHOICE, timeout_ms=st.sampled_from(LEASES_MS))
    def unfenced_heartbeat(self, i, timeout_ms):
        """A PATCH of the lease without a count (Camunda's clients without a lease token):
        whoever sends it, a zombie too, it may extend the live lease, never shorten it."""
        if not self.model.held():
            return
        worker, key, _ = pick(self.model.held(), i)
        job = self.model.jobs[key]
        before = self.row(key)
        try:
            self.run(self.service.update(key, JobChanges(timeout_ms=timeout_ms), None, self.now))
            refused = False
        except InvalidState:
            refused = True
        assert refused == (job.state != "ACTIVATED"), (worker, key, job)
        if refused:
            assert self.row(key) == before, "a refused heartbeat changed the job"
            return
        asked = self.now + timedelta(milliseconds=timeout_ms)
        assert job.deadline is not None
        job.deadline = max(job.deadline, asked)
        STEPS["extended"] += 1

    # -- time, the sweeper, crashes -------------------------------------------------------

    @rule(ms=st.sampled_from((250, 1_000, 1_500, 3_000, 6_000)))
    def clock_moves_on(self, ms):
        CLOCK[0] = self.now + timedelta(milliseconds=ms)

    @rule()
    def sweep_leases(self):
        expected = {
            k
            for k, j in self.model.jobs.items()
            if j.state == "ACTIVATED" and j.deadline is not None and j.deadline < self.now
        }
        released = self.run(maintenance.release_expired(self.store, self.now, 1000))
        assert {e.job_key for e in released} == expected, (released, expected)
        for e in released:
            job = self.model.jobs[e.job_key]
            assert (e.worker, e.activation_count) == (job.holder, job.count)
            # Back to CREATED at the same count: the next activation fences the holder out.
            job.state, job.holder, job.deadline = "CREATED", None, None
        STEPS["expired"] += len(released)

    @rule(i=CHOICE)
    def a_lease_runs_out(self, i):
        """The clock passes an ACTIVATED job's deadline and the sweeper runs: its holder,
        if still alive, becomes a zombie once another worker takes the job."""
        leased = sorted(k for k, j in self.model.jobs.items() if j.state == "ACTIVATED")
        if not leased:
            return
        deadline = self.model.jobs[pick(leased, i)].deadline
        assert deadline is not None
        CLOCK[0] = max(self.now, deadline + timedelta(milliseconds=1))
        self.sweep_leases()

    @rule(i=CHOICE)
    def crash(self, i):
        """A worker holding jobs dies: it finishes nothing more; its jobs wait for their
        leases to run out (a worker of the same name may start again, knowing none)."""
        holding = [w for w in WORKERS if self.model.hands[w]]
        if holding:
            self.model.hands[pick(holding, i)].clear()
            STEPS["crashed"] += 1

    # -- after every step -----------------------------------------------------------------

    @invariant()
    def database_matches_the_model(self):
        STEPS["checked"] += 1
        rows = self.run(
            self.store.fetch("SELECT job_key, state, activation_count, worker, deadline FROM jobs")
        )
        db = {r["job_key"]: r for r in rows}
        assert db.keys() == self.model.jobs.keys()
        for key, job in self.model.jobs.items():
            r = db[key]
            assert (r["state"], r["activation_count"]) == (job.state, job.count), (r, job)
            # Every ACTIVATED row has a deadline; no other row has one.
            assert (r["deadline"] is not None) == (r["state"] == "ACTIVATED"), r
            if job.state == "ACTIVATED":
                # The live activation is the model's: its holder and its lease.
                assert (r["worker"], r["deadline"]) == (job.holder, job.deadline), (r, job)

    @invariant()
    def a_job_is_held_by_at_most_one_live_activation(self):
        for key, job in self.model.jobs.items():
            live = [w for w, hand in self.model.hands.items() if hand.get(key) == job.count]
            if job.state == "ACTIVATED":
                assert set(live) <= {job.holder}, (key, job, live)

    @invariant()
    def a_finish_is_accepted_at_most_once(self):
        assert all(n == 1 for n in self.model.accepted.values()), self.model.accepted
        assert all(n == 1 for n in self.model.terminal.values()), self.model.terminal


def test_fencing_and_leases_match_the_model(db_url):
    """Thousands of steps on real PostgreSQL: races of claims, finishes, heartbeats,
    lease expiries and crashes, every one checked against the model."""
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(Database.connect(db_url, size=4, min_size=2))
    FencingMachine.loop, FencingMachine.store = loop, store
    STEPS.clear()
    try:
        run_state_machine_as_test(
            FencingMachine,
            settings=settings(
                max_examples=50,
                stateful_step_count=100,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        loop.run_until_complete(store.close())
        loop.close()
    print(f"fencing model: {dict(STEPS)}")
    assert STEPS["checked"] >= 4_000
    # The runs reached the races the model is about.
    for what in ("accepted", "refused", "zombie", "raced", "expired", "extended", "crashed"):
        assert STEPS[what] > 0, (what, STEPS)


async def test_the_database_refuses_an_activated_job_without_a_deadline(store):
    """jobs_deadline_check: whatever a statement does, an ACTIVATED row has a deadline and
    no other row has one (a job without one would never be swept back)."""
    [job] = await job_rows.insert(store, [{"type": TYPE}], utcnow())
    for sql in (
        "UPDATE jobs SET state = 'ACTIVATED' WHERE job_key = $1",
        "UPDATE jobs SET deadline = now() WHERE job_key = $1",
    ):
        with pytest.raises(asyncpg.CheckViolationError, match="jobs_deadline_check"):
            await store.execute(sql, job.job_key)
    row = await store.fetchrow("SELECT state, deadline FROM jobs WHERE job_key = $1", job.job_key)
    assert (row["state"], row["deadline"]) == ("CREATED", None)
