"""A model-based test of issue 44's controls on real PostgreSQL: FIFO keys (ADR 041),
guaranteed minimums (ADR 042) and the type's per-key cap (ADR 040), under the tenant and
type caps, beside creates, activations, completions, failures with and without back-off,
promotions, lease expiries, cancels (of ready, delayed, FAILED and ACTIVATED jobs) and
operator revives, one caller at a time.

The exact virtual-time model of every lane and key is test_scheduler_model's; this one
keeps what DESIGN §1 and the ADRs say of the new controls, from the jobs alone:

* states and activation counts of every job equal the model's (nothing lost, nothing
  twice);
* work conservation: an activation gets exactly ``min(maxJobs, eligible)`` jobs, where a
  FIFO key is eligible for one job when nothing of it is ACTIVATED and its head (its
  first job, in job-key order, that is CREATED, SCHEDULED or FAILED) is CREATED -- so a
  key held behind a head that was failed, delayed, expired, canceled or revived is never
  stranded once its head is ready;
* FIFO: an activation takes only heads, one per key; no key ever has two ACTIVATED jobs;
  a held key is one with an ACTIVATED job or a head that is not CREATED;
* caps: no tenant, type or key is ever taken over its cap;
* minimums: the tenants asked that are below their minimum get what they lack (within
  what their caps and keys leave them) before anyone else gets anything; when they lack
  more together than the activation takes, only they are served, by weight in running
  jobs (no tenant given a job while another lacking more per weight got none); and the
  jobs given below a minimum are not charged: each lane's virtual time moves by its jobs
  beyond what it lacked, per weight (and the least stride of a pick, 1e-10, for each of
  the others);
* outside FIFO types, no job left ready in a key has a higher priority than one taken.

Weights are powers of two so that virtual times add up exactly in floating point.
"""

from __future__ import annotations

import asyncio
import math
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
from app.config import Settings
from app.db import Database, bulk, finishing, job_rows
from app.domain import utcnow
from app.operators import ConfigService
from app.sweepers import LeaseSweeper, Promoter

TYPE = "controls"
TENANTS = ("a", "b", "c")
WEIGHTS = (1, 2, 4)
CAPS = (None, 0, 1, 2, 4)
MINIMUMS = (None, 0, 1, 2, 3)
TYPE_CAPS = (None, 0, 2, 5)
PER_KEY = (None, 1, 2)
KEYS = ("", "x", "y")
WAITING = ("CREATED", "SCHEDULED", "FAILED")  # the states a FIFO key's head is found in
CHOICE = st.integers(0, 1 << 16)
STEPS = Counter()


def pick(choices, i):
    return choices[i % len(choices)]


@dataclass
class Job:
    tenant: str
    key: str
    priority: int
    retries: int
    state: str = "CREATED"
    count: int = 0


class Model:
    def __init__(self, fifo: bool) -> None:
        self.fifo = fifo
        self.jobs: dict[int, Job] = {}
        self.weight = dict.fromkeys(TENANTS, 1)
        self.cap: dict[str, int | None] = dict.fromkeys(TENANTS)
        self.minimum: dict[str, int | None] = dict.fromkeys(TENANTS)
        self.type_cap: int | None = None
        self.per_key: int | None = None

    def of(self, tenant: str, key: str | None = None, state: str | None = None) -> list[int]:
        return sorted(
            k
            for k, j in self.jobs.items()
            if j.tenant == tenant
            and (key is None or j.key == key)
            and (state is None or j.state == state)
        )

    def active(self, tenant: str | None = None) -> int:
        if tenant is None:
            return sum(j.state == "ACTIVATED" for j in self.jobs.values())
        return len(self.of(tenant, state="ACTIVATED"))

    def head(self, tenant: str, key: str) -> int | None:
        """A FIFO key's head: its first waiting job in job-key order."""
        waiting = [k for k in self.of(tenant, key) if self.jobs[k].state in WAITING]
        return waiting[0] if waiting else None

    def key_room(self, tenant: str, key: str) -> int:
        """Jobs of the key an activation may take now, by its backlog and caps."""
        active = len(self.of(tenant, key, "ACTIVATED"))
        if self.fifo:
            head = self.head(tenant, key)
            return int(not active and head is not None and self.jobs[head].state == "CREATED")
        ready = len(self.of(tenant, key, "CREATED"))
        return ready if self.per_key is None else max(0, min(ready, self.per_key - active))

    def room(self, tenant: str) -> int:
        ready = sum(self.key_room(tenant, k) for k in KEYS)
        cap = self.cap[tenant]
        return ready if cap is None else max(0, min(ready, cap - self.active(tenant)))

    def type_room(self) -> float:
        return float("inf") if self.type_cap is None else max(0, self.type_cap - self.active())

    def eligible(self, tenants: tuple[str, ...]) -> int:
        return int(min(self.type_room(), sum(self.room(t) for t in tenants)))

    def lacking(self, tenants: tuple[str, ...]) -> dict[str, int]:
        """Of ``tenants``, what each below its minimum lacks of it (all of it, whether or
        not it has the jobs)."""
        return {
            t: self.minimum[t] - self.active(t)
            for t in tenants
            if self.minimum[t] is not None and self.active(t) < self.minimum[t]
        }


class ControlsMachine(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop
    store: Database
    fifo: bool  # the type's keys FIFO (keyOrdering "fifo") or by priority

    def __init__(self) -> None:
        super().__init__()
        self.service = Rounds(self.store, Settings())
        self.config = ConfigService(self.store, self.service.resolve_aging)
        self.model = Model(fifo=self.fifo)
        self.run(
            self.store.execute(
                "TRUNCATE jobs, lanes, lane_keys, key_weights, tenants, job_types, job_events"
            ),
        )
        self._put_type()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.service.settle())

    def _put_type(self) -> None:
        m = self.model
        self.run(
            self.config.put_job_type(
                TYPE,
                m.type_cap,
                3_600_000,  # no aging: priority alone orders a key's jobs
                10,
                per_key=m.per_key,
                key_ordering="fifo" if m.fifo else None,
            )
        )

    # -- producing and configuring ------------------------------------------------------

    @rule(
        tenant=st.sampled_from(TENANTS),
        jobs=st.lists(
            st.tuples(
                st.sampled_from((0, 50, 100)), st.sampled_from(KEYS), st.sampled_from((1, 2))
            ),
            min_size=1,
            max_size=5,
        ),
    )
    def create(self, tenant, jobs):
        sent = [
            {
                "type": TYPE,
                "tenantId": tenant,
                "priority": p,
                "retries": r,
                **({"fairnessKey": k} if k else {}),
            }
            for p, k, r in jobs
        ]
        rows = self.run(job_rows.insert(self.store, sent, utcnow()))
        for (p, k, r), inserted in zip(jobs, rows, strict=True):
            self.model.jobs[inserted.job_key] = Job(tenant, k, p, r)

    @rule(
        tenant=st.sampled_from(TENANTS),
        weight=st.sampled_from(WEIGHTS),
        cap=st.sampled_from(CAPS),
        minimum=st.sampled_from(MINIMUMS),
    )
    def configure_tenant(self, tenant, weight, cap, minimum):
        if cap is not None and minimum is not None:
            minimum = min(minimum, cap)  # at most the cap (a 400 otherwise)
        self.run(self.config.put_tenant(tenant, weight, cap, minimum=minimum))
        self.model.weight[tenant], self.model.cap[tenant] = weight, cap
        self.model.minimum[tenant] = minimum

    @rule(cap=st.sampled_from(TYPE_CAPS), per_key=st.sampled_from(PER_KEY))
    def configure_type(self, cap, per_key):
        self.model.type_cap, self.model.per_key = cap, per_key
        self._put_type()

    # -- activating -----------------------------------------------------------------------

    @precondition(lambda self: self._in("CREATED"))  # else it only checks an empty answer
    @rule(
        max_jobs=st.integers(1, 8),
        tenants=st.one_of(st.none(), st.sets(st.sampled_from(TENANTS), min_size=1)),
    )
    def activate(self, max_jobs, tenants):
        m = self.model
        asked = TENANTS if tenants is None else tuple(sorted(tenants))
        expected = min(max_jobs, m.eligible(asked))
        heads = {(t, k): m.head(t, k) for t in asked for k in KEYS} if m.fifo else {}
        ready = {t: m.of(t, state="CREATED") for t in asked}
        active = {t: m.active(t) for t in TENANTS}
        keys_active = Counter((j.tenant, j.key) for j in m.jobs.values() if j.state == "ACTIVATED")
        type_active = m.active()
        room = {t: m.room(t) for t in asked}
        lacking = m.lacking(asked)
        vtimes = self._vtimes()
        req = ActivateRequest(TYPE, max_jobs, 60_000, "w", None if tenants is None else asked)
        rows, _ = self.run(self.service.activate(req))
        self.run(self.service.settle())
        STEPS["activations"] += 1
        STEPS["jobs"] += len(rows)
        assert len(rows) == expected, (len(rows), expected, m.__dict__)
        got = Counter(r.tenant_id for r in rows)
        keys_got = Counter((r.tenant_id, r.fairness_key) for r in rows)
        for r in rows:
            job = m.jobs[r.job_key]
            assert job.state == "CREATED" and r.tenant_id in asked, (r.job_key, job)
            assert r.activation_count == job.count + 1
            job.state, job.count = "ACTIVATED", job.count + 1
        # Caps: never taken over (a cap lowered below what was active holds new work only).
        for t in TENANTS:
            cap = m.cap[t]
            assert cap is None or m.active(t) <= max(cap, active[t]), t
        assert m.type_cap is None or m.active() <= max(m.type_cap, type_active)
        for (t, k), n in keys_got.items():
            cap = 1 if m.fifo else m.per_key
            assert cap is None or keys_active[(t, k)] + n <= max(cap, keys_active[(t, k)])
        if m.fifo:
            # Only heads, one per key.
            for r in rows:
                assert heads[(r.tenant_id, r.fairness_key)] == r.job_key, (r, heads)
            STEPS["fifo jobs"] += len(rows)
        else:
            for t in asked:
                for k in KEYS:
                    taken = [
                        m.jobs[r.job_key].priority
                        for r in rows
                        if (r.tenant_id, r.fairness_key) == (t, k)
                    ]
                    left = [
                        m.jobs[j].priority
                        for j in ready[t]
                        if m.jobs[j].state == "CREATED" and m.jobs[j].key == k
                    ]
                    if taken and left:
                        assert min(taken) >= max(left), (t, k, taken, left)
        self._check_minimums(rows, lacking, room, got, active)
        # Not charged below a minimum: each lane moved by its jobs beyond what it lacked
        # (give or take the least stride a pick advances a lane by, MIN_STRIDE).
        after = self._vtimes()
        for t, n in got.items():
            charged = max(0, n - lacking.get(t, 0)) / m.weight[t]
            before = vtimes.get(t, after[t] - charged)
            assert math.isclose(after[t], before + charged, rel_tol=1e-12, abs_tol=1e-9), (
                t,
                n,
                lacking,
                before,
                after[t],
            )

    def _check_minimums(self, rows, lacking, room, got, active) -> None:
        if not lacking or not rows:
            return
        m = self.model
        # What each tenant below its minimum can be given below it: what it lacks, within
        # what its caps and keys leave it.
        need = {t: min(n, room[t]) for t, n in lacking.items()}
        if sum(need.values()) <= len(rows):
            STEPS["minimums met"] += sum(need.values()) > 0
            for t, n in need.items():
                assert got[t] >= n, (t, got, need, lacking)
            return
        STEPS["minimums shared"] += 1
        # They lack more than the activation took: only they are served, none beyond what
        # it can be given, by weight in running jobs.
        assert set(got) <= set(need), (got, need)
        for t, n in got.items():
            assert n <= need[t], (t, got, need)
        for a, n in got.items():
            for b in need:
                if got[b] < need[b]:
                    assert (active[a] + n - 1) / m.weight[a] <= (active[b] + got[b]) / m.weight[
                        b
                    ], (a, b, got, need, active)

    def _vtimes(self) -> dict[str, float]:
        rows = self.run(
            self.store.fetch("SELECT tenant_id, vtime FROM lanes WHERE job_type = $1", TYPE)
        )
        return {r["tenant_id"]: r["vtime"] for r in rows}

    # -- finishing ------------------------------------------------------------------------

    def _in(self, *states: str) -> list[int]:
        return sorted(k for k, j in self.model.jobs.items() if j.state in states)

    @precondition(lambda self: self._in("ACTIVATED"))
    @rule(i=CHOICE)
    def complete(self, i):
        key = pick(self._in("ACTIVATED"), i)
        job = self.model.jobs[key]
        done = self.run(finishing.complete(self.store, [(key, job.count, None)], utcnow()))
        assert [e.job_key for e in done] == [key]
        job.state = "COMPLETED"

    @precondition(lambda self: self._in("ACTIVATED"))
    @rule(i=CHOICE, back_off=st.booleans())
    def fail(self, i, back_off):
        """A failure: retried at once (CREATED) or after a back-off (SCHEDULED) while
        retries are left, else FAILED -- a FIFO key's head all the same."""
        key = pick(self._in("ACTIVATED"), i)
        job = self.model.jobs[key]
        now = utcnow()
        run_at = now + timedelta(hours=1) if back_off else now
        ended = self.run(
            finishing.fail(
                self.store,
                key,
                job.count,
                retries=None,
                error_message="x",
                run_at=run_at,
                variables=None,
                now=now,
            )
        )
        assert ended is not None
        job.retries -= 1
        job.state = "FAILED" if job.retries == 0 else "SCHEDULED" if back_off else "CREATED"
        assert ended.state.value == job.state

    @precondition(lambda self: self._in("SCHEDULED"))
    @rule()
    def promote(self):
        now = utcnow()
        self.run(
            self.store.execute(
                "UPDATE jobs SET run_at = $1 WHERE state = 'SCHEDULED'", now - timedelta(seconds=1)
            )
        )
        promoted = self.run(Promoter(self.store, 1000).run_once(now))
        assert promoted == len(self._in("SCHEDULED"))
        for k in self._in("SCHEDULED"):
            self.model.jobs[k].state = "CREATED"

    @precondition(lambda self: self._in("ACTIVATED"))
    @rule(i=CHOICE)
    def expire(self, i):
        key = pick(self._in("ACTIVATED"), i)
        now = utcnow()
        self.run(
            self.store.execute(
                "UPDATE jobs SET deadline = $2 WHERE job_key = $1", key, now - timedelta(seconds=1)
            )
        )
        assert self.run(LeaseSweeper(self.store, 1000).run_once(now)) == 1
        self.model.jobs[key].state = "CREATED"

    @precondition(lambda self: self._in("CREATED", "SCHEDULED", "FAILED", "ACTIVATED"))
    @rule(i=CHOICE)
    def cancel(self, i):
        """An operator's cancel: of a ready, delayed, FAILED or ACTIVATED job."""
        key = pick(self._in("CREATED", "SCHEDULED", "FAILED", "ACTIVATED"), i)
        assert self.run(finishing.cancel(self.store, key, utcnow()))
        self.model.jobs[key].state = "CANCELED"

    @precondition(lambda self: self._in("FAILED"))
    @rule(i=CHOICE)
    def revive(self, i):
        """An operator's retry of an incident: CREATED again, with one retry."""
        key = pick(self._in("FAILED"), i)
        job = self.model.jobs[key]
        revived = self.run(bulk.revive(self.store, [(key, TYPE, job.tenant)], 1, utcnow()))
        assert revived == 1
        job.state, job.retries = "CREATED", 1

    # -- after every step -----------------------------------------------------------------

    @invariant()
    def database_matches_the_model(self):
        STEPS["steps"] += 1
        rows = self.run(self.store.fetch("SELECT job_key, state, activation_count FROM jobs"))
        db = {r["job_key"]: (r["state"], r["activation_count"]) for r in rows}
        assert db == {k: (j.state, j.count) for k, j in self.model.jobs.items()}

    @invariant()
    def fifo_keys_run_one_job_at_a_time(self):
        if not self.model.fifo:
            return
        twice = self.run(
            self.store.fetch(
                "SELECT tenant_id, fairness_key FROM jobs WHERE state = 'ACTIVATED'"
                " GROUP BY 1, 2 HAVING count(*) > 1"
            )
        )
        assert not twice, twice

    @invariant()
    def a_key_is_held_only_while_it_cannot_go_on(self):
        """A held key is at a cap: with a FIFO type, it has a job ACTIVATED or a head
        that is not ready; else as many ACTIVATED as its per-key cap."""
        m = self.model
        rows = self.run(
            self.store.fetch(
                "SELECT tenant_id, fairness_key FROM lane_keys WHERE job_type = $1 AND held", TYPE
            )
        )
        STEPS["keys held"] += bool(rows)
        for r in rows:
            t, k = r["tenant_id"], r["fairness_key"]
            active = len(m.of(t, k, "ACTIVATED"))
            if m.fifo:
                head = m.head(t, k)
                assert active or (head is not None and m.jobs[head].state != "CREATED"), (t, k)
            else:
                assert m.per_key is not None and active >= m.per_key, (t, k, m.per_key)


@pytest.mark.parametrize("fifo", [True, False], ids=["fifo", "by-priority"])
def test_controls_match_the_model(db_url, fifo):
    """Thousands of steps on real PostgreSQL, of a FIFO type and of one by priority."""
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(Database.connect(db_url, size=4, min_size=1))
    ControlsMachine.loop, ControlsMachine.store, ControlsMachine.fifo = loop, store, fifo
    STEPS.clear()
    try:
        run_state_machine_as_test(
            ControlsMachine,
            settings=settings(
                max_examples=50,
                stateful_step_count=50,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        loop.run_until_complete(store.close())
        loop.close()
    print(dict(STEPS))
    assert STEPS["steps"] >= 1_000
    # The runs reached what they are about: FIFO activations, keys held, minimums met
    # (how often depends on the seed).
    assert STEPS["fifo jobs"] > 0 or not fifo, STEPS
    assert STEPS["keys held"] > 0 and STEPS["minimums met"] > 0, STEPS
