"""The no-lost-wake-up protocol of ``lanes.active`` (app/db/lanes.py's docstring), on real
PostgreSQL: a lane holding ready jobs is never left parked, whatever the interleaving."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import asyncpg
import pytest

from app.activation import ActivateRequest
from app.activation.charging import CARRIED_LANES
from app.activation.fairness_keys import LANE_SLACK
from app.activation.rounds import Rounds
from app.api.schemas import CreateJob
from app.config import Settings
from app.db import claims, job_rows, lanes, parking
from app.db.lanes import SCANNED_LANES
from app.db.lanes import SQL as LANES
from app.db.locks import lane_bucket
from app.domain import utcnow
from app.scheduler import Charges

NO_PARKED_LANE_WITH_JOBS = """
SELECT l.tenant_id FROM lanes l
WHERE NOT l.active AND EXISTS (
    SELECT 1 FROM jobs j WHERE j.state = 'CREATED' AND j.job_type = l.job_type
      AND j.tenant_id = l.tenant_id)
"""


def _job(tenant: str) -> CreateJob:
    return {"type": "race", "tenantId": tenant}


async def test_parking_waits_a_while_for_a_bucket_a_producer_holds(store):
    """A producer is mid-insert in the lane's bucket (any lane of it): the park does not
    give up at once (under a steady producer it would never park, and the empty lane
    would keep its idle vtime): it waits for the bucket, then parks.  A producer that
    holds the bucket longer than PARK_WAIT_MS leaves the lane active."""
    await job_rows.insert(store, [_job("t")], utcnow())
    await store.execute("UPDATE jobs SET state = 'COMPLETED', completed_at = now()")
    hold = "SELECT pg_advisory_xact_lock_shared($1, $2)"
    async with store.connection() as producer:
        tx = producer.transaction()
        await tx.start()
        await producer.execute(hold, 0x4A460001, lane_bucket("race", "t"))
        assert await parking.park(store, "race", ["t"]) == []  # waited PARK_WAIT_MS in vain
        park = asyncio.create_task(parking.park(store, "race", ["t"]))
        # Until the park waits for the bucket: PostgreSQL's state, which no event here
        # announces.
        while not await store.fetchval(  # noqa: ASYNC110
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
        ):
            await asyncio.sleep(0.01)
        await tx.rollback()
    assert await park == ["t"]


async def test_a_park_that_waited_in_vain_tries_again(store):
    """Found from outside: two producers' 10,000-lane batches overlapped for seconds, so
    parks of emptied lanes waited in vain (1,959 times); a lane left active kept its
    idle vtime, and back from idle its tenant took 300 of the next 300 activations.  A
    background park tries again later, and parks once the producer is done."""
    await job_rows.insert(store, [_job("t")], utcnow())
    await store.execute("UPDATE jobs SET state = 'COMPLETED', completed_at = now()")
    hold = "SELECT pg_advisory_xact_lock_shared($1, $2)"
    waits = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
    async with store.connection() as producer:
        tx = producer.transaction()
        await tx.start()
        await producer.execute(hold, 0x4A460001, lane_bucket("race", "t"))
        park = asyncio.create_task(parking.park(store, "race", ["t"], retries=2))
        # Until the first try waits for the bucket, and then until it gave up: states of
        # PostgreSQL's that no event here announces.
        while not await store.fetchval(waits):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        while await store.fetchval(waits):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await tx.rollback()  # the producer is done
    assert await park == ["t"]
    assert not await store.fetchval("SELECT active FROM lanes WHERE tenant_id = 't'")


async def test_parked_lane_wakes_when_jobs_arrive(store):
    await job_rows.insert(store, [_job("t")], utcnow())
    await store.execute("UPDATE jobs SET state = 'COMPLETED', completed_at = now()")
    assert await parking.park(store, "race", ["t"]) == ["t"]
    await job_rows.insert(store, [_job("t")], utcnow())
    assert await store.fetchval("SELECT active FROM lanes WHERE tenant_id = 't'")


async def test_no_lost_wake_up_under_racing_producers_and_activators(store):
    service = Rounds(store, Settings())
    tenants = [f"t{i}" for i in range(6)]
    produced = 0
    stop = asyncio.Event()
    rng = random.Random(7)

    async def producer() -> None:
        nonlocal produced
        for _ in range(150):
            await job_rows.insert(
                store, [_job(rng.choice(tenants)) for _ in range(rng.randint(1, 3))], utcnow()
            )
            produced += 1
            await asyncio.sleep(0)

    async def activator() -> None:
        while not stop.is_set():
            await service.activate(ActivateRequest("race", rng.randint(1, 8), 60_000))

    activators = [asyncio.create_task(activator()) for _ in range(4)]
    await asyncio.gather(*(producer() for _ in range(4)))
    stop.set()
    await asyncio.gather(*activators)
    await service.settle()
    assert await store.fetch(NO_PARKED_LANE_WITH_JOBS) == []
    # And what is left is still reachable: one more drain takes every ready job.
    left = await store.fetchval("SELECT count(*) FROM jobs WHERE state = 'CREATED'")
    got = 0
    while rows := (await service.activate(ActivateRequest("race", 1000, 60_000)))[0]:
        got += len(rows)
    assert got == left


NO_PARKED_KEY_WITH_JOBS = """
SELECT k.tenant_id, k.fairness_key FROM lane_keys k
WHERE NOT k.active AND EXISTS (
    SELECT 1 FROM jobs j WHERE j.state = 'CREATED' AND j.job_type = k.job_type
      AND j.tenant_id = k.tenant_id AND j.fairness_key = k.fairness_key)
"""


async def test_no_lost_wake_up_of_a_key_under_racing_producers_and_activators(store):
    """The protocol one level down (ADR 027): producers of few lanes and many keys race
    activators that empty keys and park them; no key is left parked with a ready job,
    and every ready job is still reached."""
    service = Rounds(store, Settings())
    rng = random.Random(11)

    def keyed() -> CreateJob:
        return {
            "type": "race",
            "tenantId": rng.choice("ab"),
            "fairnessKey": f"k{rng.randint(0, 9)}",
        }

    stop = asyncio.Event()

    async def producer() -> None:
        for _ in range(150):
            await job_rows.insert(store, [keyed() for _ in range(rng.randint(1, 3))], utcnow())
            await asyncio.sleep(0)

    async def activator() -> None:
        while not stop.is_set():
            await service.activate(ActivateRequest("race", rng.randint(1, 8), 60_000))

    activators = [asyncio.create_task(activator()) for _ in range(4)]
    await asyncio.gather(*(producer() for _ in range(4)))
    stop.set()
    await asyncio.gather(*activators)
    await service.settle()
    assert await store.fetch(NO_PARKED_KEY_WITH_JOBS) == []
    assert await store.fetch(NO_PARKED_LANE_WITH_JOBS) == []
    left = await store.fetchval("SELECT count(*) FROM jobs WHERE state = 'CREATED'")
    got = 0
    while rows := (await service.activate(ActivateRequest("race", 1000, 60_000)))[0]:
        got += len(rows)
    assert got == left


async def test_a_key_its_claim_emptied_is_parked_and_its_lane_is_not(store):
    service = Rounds(store, Settings())
    jobs: list[CreateJob] = [{"type": "race", "tenantId": "t", "fairnessKey": "once"}]
    jobs += [{"type": "race", "tenantId": "t", "fairnessKey": "many"}] * 5
    await job_rows.insert(store, jobs, utcnow())
    rows, _ = await service.activate(ActivateRequest("race", 2, 60_000))
    assert sorted(r.fairness_key for r in rows) == ["many", "once"]
    await service.settle()
    keys = await store.fetch("SELECT fairness_key, active FROM lane_keys ORDER BY fairness_key")
    assert [(r["fairness_key"], r["active"]) for r in keys] == [("many", True), ("once", False)]
    assert await store.fetchval("SELECT active FROM lanes WHERE tenant_id = 't'")
    # Read again, the lane's one ready key takes the whole call, in one round.
    rounds = service.counters.queries
    rows, _ = await service.activate(ActivateRequest("race", 4, 60_000))
    assert [r.fairness_key for r in rows] == ["many"] * 4
    assert service.counters.queries - rounds == 1


async def test_keys_found_empty_are_passed_by_and_parked(store):
    """Keys emptied behind the scheduler's back (still active, at low vtimes) in front of
    the lane's one key with jobs: the call gets its job anyway and parks them."""
    service = Rounds(store, Settings())
    jobs: list[CreateJob] = [
        {"type": "race", "tenantId": "t", "fairnessKey": f"gone{i:02}"} for i in range(30)
    ]
    await job_rows.insert(store, jobs, utcnow())
    await store.execute("UPDATE jobs SET state = 'COMPLETED', completed_at = now()")
    await store.execute("UPDATE lane_keys SET vtime = -1")
    [busy] = await job_rows.insert(
        store, [{"type": "race", "tenantId": "t", "fairnessKey": "zz"}], utcnow()
    )
    rows, dry = await service.activate(ActivateRequest("race", 1, 60_000))
    assert [r.job_key for r in rows] == [busy.job_key] and not dry
    await service.settle()
    active = await store.fetchval("SELECT count(*) FROM lane_keys WHERE active")
    assert active == 0  # the empty keys, and zz once its claim emptied it (its lane too)


async def test_drained_lane_is_parked_and_costs_nothing_later(store):
    service = Rounds(store, Settings())
    await job_rows.insert(store, [_job("gone")], utcnow())
    rows, _ = await service.activate(ActivateRequest("race", 5, 60_000))
    assert len(rows) == 1
    await service.settle()
    assert not await store.fetchval("SELECT active FROM lanes WHERE tenant_id = 'gone'")
    read = await lanes.read(store, "race", 10, [], None)
    assert read.ready == [] and read.empty == []


async def _drained_lanes(store, n: int) -> int:
    """``n`` lanes drained behind the scheduler's back (still active, at low vtimes)
    and one busy lane, last among them; the busy lane's job key."""
    await job_rows.insert(store, [_job(f"drained-{i:02}") for i in range(n)], utcnow())
    await store.execute("UPDATE jobs SET state = 'COMPLETED', completed_at = now()")
    await store.execute("UPDATE lanes SET vtime = -1 WHERE tenant_id LIKE 'drained-%'")
    [job] = await job_rows.insert(store, [_job("z-busy")], utcnow())  # last among ties
    return job.job_key


async def _parked(store) -> int:
    return await store.fetchval(
        "SELECT count(*) FROM lanes WHERE tenant_id LIKE 'drained-%' AND NOT active"
    )


async def test_an_active_lane_without_jobs_costs_no_claim_round(store):
    """Lanes drained a moment ago are still active (nobody parked them yet).  An
    activation asking for one job must not spend a claim round on each of them before
    it reaches the lane that has one: its read probes them and skips them, and the call
    parks them."""
    service = Rounds(store, Settings())
    busy = await _drained_lanes(store, 3)
    rounds = service.counters.queries
    rows, _ = await service.activate(ActivateRequest("race", 1, 60_000))
    assert [r.job_key for r in rows] == [busy]
    assert service.counters.queries - rounds == 1
    await service.settle()
    assert await _parked(store) == 3


async def test_more_empty_lanes_than_a_read_holds_cost_one_round(store):
    """Far more drained lanes than the call asks for lanes (1 job + LANE_SLACK): one read
    skips them all and reaches the busy lane behind them, and the call parks them, so
    the next activation meets none of them."""
    service = Rounds(store, Settings())
    n = 10 * (1 + LANE_SLACK)
    busy = await _drained_lanes(store, n)
    rounds = service.counters.queries
    rows, dry = await service.activate(ActivateRequest("race", 1, 60_000))
    assert [r.job_key for r in rows] == [busy] and not dry
    assert service.counters.queries - rounds == 1
    await service.settle()
    assert await _parked(store) == n
    await job_rows.insert(store, [_job("z-busy")], utcnow())
    read = await lanes.read(store, "race", 1 + LANE_SLACK, [], None)
    assert read.empty == [] and [lane.tenant_id for lane in read.ready] == ["z-busy"]


async def test_a_read_stops_after_scanned_lanes_and_the_call_reads_on(store):
    """More empty lanes than one statement scans (SCANNED_LANES): the read stops there,
    says there may be more, and the activation reads on past them in another round."""
    service = Rounds(store, Settings())
    busy = await _drained_lanes(store, SCANNED_LANES + 5)
    read = await lanes.read(store, "race", 1 + LANE_SLACK, [], None)
    assert read.ready == [] and read.more and len(read.empty) == SCANNED_LANES
    rounds = service.counters.queries
    rows, dry = await service.activate(ActivateRequest("race", 1, 60_000))
    assert [r.job_key for r in rows] == [busy] and not dry
    assert service.counters.queries - rounds == 2


async def test_a_lane_its_claim_emptied_is_parked(store):
    """A claim that takes a lane's last job (exactly what it was allotted: not short)
    leaves it active; the charge that follows finds it empty and parks it, so no later
    read meets it, whatever the history: here 83 single-job tenants drained one job per
    call."""
    service = Rounds(store, Settings())
    n = 83
    await job_rows.insert(store, [_job(f"one-{i:03}") for i in range(n)], utcnow())
    for _ in range(n):
        rows, _ = await service.activate(ActivateRequest("race", 1, 60_000))
        assert len(rows) == 1
        await service.settle()
        active_empty = await store.fetchval(
            """SELECT count(*) FROM lanes l WHERE l.active AND NOT EXISTS (
                   SELECT 1 FROM jobs j WHERE j.state = 'CREATED'
                     AND j.job_type = l.job_type AND j.tenant_id = l.tenant_id)"""
        )
        assert active_empty == 0
    assert await store.fetchval("SELECT count(*) FROM lanes WHERE NOT active") == n


async def test_an_activation_that_read_every_lane_empty_says_the_type_is_dry(store):
    service = Rounds(store, Settings())
    await _drained_lanes(store, 3)
    rows, dry = await service.activate(ActivateRequest("race", 5, 60_000))
    # Its lane came up short: drained, or held by another activator; it cannot tell.
    assert len(rows) == 1 and not dry
    rows, dry = await service.activate(ActivateRequest("race", 5, 60_000))
    assert rows == [] and dry  # read every lane: none has a ready job
    await job_rows.insert(store, [_job("z-busy") for _ in range(5)], utcnow())
    rows, dry = await service.activate(ActivateRequest("race", 5, 60_000))
    assert len(rows) == 5 and not dry  # got all it asked for: there may be more


async def test_jobs_held_by_another_activator_do_not_make_the_type_dry(store):
    service = Rounds(store, Settings())
    await job_rows.insert(store, [_job("held") for _ in range(3)], utcnow())
    async with store.connection() as other:
        tx = other.transaction()
        await tx.start()
        # Another activator's claim holds every job, not yet committed.
        await other.execute("SELECT 1 FROM jobs WHERE tenant_id = 'held' FOR UPDATE")
        rows, dry = await service.activate(ActivateRequest("race", 2, 60_000))
        assert rows == [] and not dry
        await tx.rollback()  # it took none of them after all
    rows, _ = await service.activate(ActivateRequest("race", 2, 60_000))
    assert len(rows) == 2


async def test_a_waiter_gets_the_first_round_that_claims_anything_and_a_caller_a_full_batch(
    store,
):
    """Lane a's jobs are held by another activator: the first round gets b's share only.
    A caller asking now (fill) is made up from b in a second round; a waiter or stream
    (no fill) gets the first round's jobs at once."""
    service = Rounds(store, Settings())
    await job_rows.insert(store, [_job(t) for t in ("a", "b") for _ in range(6)], utcnow())
    async with store.connection() as other:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM jobs WHERE tenant_id = 'a' FOR UPDATE")
        rows, _ = await service.activate_owed(ActivateRequest("race", 4, 60_000))
        assert [r.tenant_id for r in rows] == ["b", "b"]
        rows, _ = await service.activate(ActivateRequest("race", 4, 60_000))
        assert [r.tenant_id for r in rows] == ["b"] * 4
        await tx.rollback()


async def test_charges_made_while_one_is_written_are_all_written_before_the_next_read(store):
    service = Rounds(store, Settings())
    await job_rows.insert(store, [_job(t) for t in ("a", "b") for _ in range(40)], utcnow())
    results = await asyncio.gather(
        *(service.activate(ActivateRequest("race", 2, 60_000)) for _ in range(20))
    )
    claimed = Counter(r.tenant_id for rows, _ in results for r in rows)
    assert sum(claimed.values()) == 40
    await service.charges.written("race")  # what the next read of this job type waits for
    rows = await store.fetch("SELECT tenant_id, activated_total FROM lanes")
    assert {r["tenant_id"]: r["activated_total"] for r in rows} == dict(claimed)


async def _lanes(store) -> dict[str, tuple[float, int]]:
    rows = await store.fetch("SELECT tenant_id, vtime, activated_total FROM lanes")
    return {r["tenant_id"]: (r["vtime"], r["activated_total"]) for r in rows}


async def test_a_lane_read_carries_the_charges_not_yet_written(store, monkeypatch):
    """Under load a round's lane read takes the previous round's charges into its own
    statement: it ranks the lanes by their charged vtimes, no charge statement of their
    own is made, and nothing is charged twice."""
    service = Rounds(store, Settings())
    writes: list[object] = []
    write = lanes.charge

    async def counted(*args):
        writes.append(args)
        return await write(*args)

    monkeypatch.setattr(lanes, "charge", counted)
    await job_rows.insert(store, [_job(t) for t in ("a", "b")], utcnow())
    assert await _lanes(store) == {"a": (0.0, 0), "b": (0.0, 0)}
    service.charges.add("race", Charges(Counter({"a": 3}), {"a": 0.5}, Counter(), {}))
    ready = (await service.charges.read("race", 1, [], None)).ready
    # Room for one lane: "a" led by tenant order, but its charge moved it behind "b".
    assert [(lane.tenant_id, lane.vtime) for lane in ready] == [("b", 0.0)]
    ready = (await service.charges.read("race", 2, [], None)).ready
    assert [(lane.tenant_id, lane.vtime) for lane in ready] == [("b", 0.0), ("a", 1.5)]
    await service.settle()  # the writer task found nothing left to write
    assert writes == []
    assert await _lanes(store) == {"a": (1.5, 3), "b": (0.0, 0)}


async def test_charges_a_failed_lane_read_carried_are_written_after_all(store):
    service = Rounds(store, Settings())
    await job_rows.insert(store, [_job(t) for t in ("a", "b")], utcnow())
    service.charges.add("race", Charges(Counter({"a": 2}), {"a": 1.0}, Counter(), {}))
    with pytest.raises(asyncpg.PostgresError):  # $2 + 1 overflows int4: the statement fails
        await service.charges.read("race", 2**31 - 1, [], None)
    await service.charges.written("race")
    assert await _lanes(store) == {"a": (2.0, 2), "b": (0.0, 0)}


async def test_a_charge_of_many_lanes_is_written_before_the_read(store, monkeypatch):
    """A round's charge of more than CARRIED_LANES lanes is not carried (it would make the
    read scan as many lanes more): the writer writes it and the read waits for it."""
    service = Rounds(store, Settings())
    tenants = [f"t{i:02}" for i in range(CARRIED_LANES + 1)]
    await job_rows.insert(store, [_job(t) for t in tenants], utcnow())
    reads: list[object] = []
    read = service.store.read_lanes

    async def seen(ask):
        reads.append(ask.charges)  # what the read carried
        return await read(ask)

    monkeypatch.setattr(service.store, "read_lanes", seen)
    service.charges.add(
        "race", Charges(Counter(tenants), dict.fromkeys(tenants, 1.0), Counter(), {})
    )
    ready = (await service.charges.read("race", 1, [], None)).ready
    assert reads == [None]
    assert await _lanes(store) == dict.fromkeys(tenants, (1.0, 1))
    assert [(lane.tenant_id, lane.vtime) for lane in ready] == [("t00", 1.0)]


async def test_a_lane_read_waits_for_every_charge_in_flight(store):
    """A read carrying charges and the writer task can both be writing; a later read
    waits for both, not only the write that started last."""
    service = Rounds(store, Settings())
    await job_rows.insert(store, [_job(t) for t in ("a", "b")], utcnow())

    async def read_carrying_a() -> object:
        service.charges.add("race", Charges(Counter({"a": 1}), {"a": 1.0}, Counter(), {}))
        return await service.charges.read("race", 2, [], None)  # takes the charge at once

    async with store.connection() as holder:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM lanes WHERE tenant_id = 'a' FOR UPDATE")
        carrying = asyncio.create_task(read_carrying_a())
        # Until the carrying read waits for the lane's lock: PostgreSQL's state, which
        # no event here announces.
        while not await store.fetchval(  # noqa: ASYNC110
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ):
            await asyncio.sleep(0.01)
        service.charges.add(
            "race", Charges(Counter({"b": 1}), {"b": 1.0}, Counter(), {})
        )  # the writer writes this
        await service.charges._pending["race"].writer
        later = asyncio.create_task(service.charges.read("race", 2, [], None))
        await tx.rollback()
    await carrying
    ready = (await later).ready
    assert {(lane.tenant_id, lane.vtime) for lane in ready} == {("a", 1.0), ("b", 1.0)}


async def test_charges_of_the_same_lanes_in_any_order_lock_them_in_one_order(store):
    """A charge locks its lanes in tenant order whatever order it was given them in, so
    statements charging the same lanes in different orders at once queue behind each
    other instead of deadlocking (the raw statement, without Store.charge_lanes' retry),
    and every charge is applied.  An update that locked the lanes in its plan's order
    deadlocked here (ADR 001, alternatives)."""
    tenants = [f"t{i:02d}" for i in range(40)]
    await store.execute(
        "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active) "
        "SELECT 'order', t, jobfair_shard(t), 0, true FROM unnest($1::text[]) t",
        tenants,
    )
    rounds = 25

    async def charger(i: int) -> None:
        rng = random.Random(i)
        async with store.connection() as conn:
            for _ in range(rounds):
                order = tenants[:]
                rng.shuffle(order)
                if i % 2:
                    order.sort(reverse=True)
                await conn.execute(
                    *LANES["charge_lanes"].bind(
                        job_type="order",
                        tenants=order,
                        counts=[1] * len(order),
                        strides=[1.0] * len(order),
                        floors=[None] * len(order),
                        served=[0.0] * len(order),
                        key_tenants=[],
                        keys=[],
                        key_counts=[],
                        key_strides=[],
                        key_served=[],
                    )
                )

    chargers = 8
    await asyncio.gather(*(charger(i) for i in range(chargers)))
    vtimes = await store.fetch("SELECT vtime FROM lanes WHERE job_type = 'order'")
    assert [r["vtime"] for r in vtimes] == [float(chargers * rounds)] * len(tenants)


async def test_jobs_of_earlier_rounds_go_back_when_a_later_round_fails(store, monkeypatch):
    """Round 1 claims from "a" (one job, allotted more: short) and "b"; round 2's claim
    fails.  The caller gets the error, and the jobs round 1 claimed for it are CREATED
    again at once, not held until their leases end."""
    service = Rounds(store, Settings())
    await job_rows.insert(store, [_job("a"), _job("b"), _job("b"), _job("c"), _job("c")], utcnow())
    claim = claims.claim
    calls = 0

    async def second_fails(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise asyncpg.DataError("refused")
        return await claim(*args, **kwargs)

    monkeypatch.setattr(claims, "claim", second_fails)
    # Lanes a, b, c at vtime 0; with two lanes read (maxJobs 4 reads 12) the picks go
    # a, b, c, a: a holds one job, so round 1 is short and round 2 runs.
    with pytest.raises(asyncpg.DataError):
        await service.activate(ActivateRequest("race", 4, 60_000))
    assert calls == 2
    await service.settle()
    states = await store.fetch("SELECT state FROM jobs")
    assert {r["state"] for r in states} == {"CREATED"}
