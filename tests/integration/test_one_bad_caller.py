"""One bad caller never fails another (issue 19 §2): wherever callers share something -- a
group-commit statement, a coalesced activation, the waiter queue and the hand-off of a new
job, lane charges -- a value the database refuses fails the caller it came from, and
every other caller is served as if it had been alone.

The bad values are injected below the API (its validation refuses them at the boundary),
so these tests hold the shared paths to it on their own."""

from __future__ import annotations

import asyncio
from collections import Counter

import asyncpg
import pytest

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.config import Settings
from app.db import job_rows
from app.domain import utcnow
from app.scheduler import Charges
from tests.acceptance.test_long_polling import until_waiting
from tests.fixtures import quiet_settings
from tests.helpers import activate

NUL_VARIABLES = '{"note": "\\u0000"}'  # JSON text PostgreSQL's jsonb refuses
INT4_OVERFLOW = 2**31  # an activationCount the int4 column cannot hold
EVIL_WORKER = "evil\x00"  # a worker name PostgreSQL's text refuses


@pytest.fixture
def settings() -> Settings:
    # No backup poll: a dispatcher woken by its timer would take the job the NOTIFY way,
    # and the hand-off these tests poison would not happen.
    return quiet_settings(backup_poll_ms=3_600_000)


def _poll(job_type: str, worker: str, wait_ms: int = 10_000) -> dict[str, object]:
    return {
        "type": job_type,
        "maxJobs": 1,
        "timeout": 60_000,
        "worker": worker,
        "requestTimeout": wait_ms,
    }


async def _activated(store, job_type: str, n: int) -> list[asyncpg.Record]:
    await job_rows.insert(store, [{"type": job_type} for _ in range(n)], utcnow())
    rows = await store.fetch(
        "UPDATE jobs SET state = 'ACTIVATED', activation_count = 1, worker = 'w',"
        " deadline = now() + interval '1 hour' WHERE job_type = $1"
        " RETURNING job_key, activation_count",
        job_type,
    )
    return sorted(rows, key=lambda r: r["job_key"])


async def _states(store, job_type: str) -> dict[int, str]:
    rows = await store.fetch("SELECT job_key, state FROM jobs WHERE job_type = $1", job_type)
    return {r["job_key"]: r["state"] for r in rows}


async def test_poisoned_completions_in_one_group_commit_fail_alone(live):
    """300 single completions written by one group-commit statement, 10 of them poisoned
    (5 with a NUL in their variables, 5 with an activationCount beyond int4): the 290 good
    ones complete, each poisoned one alone gets the database's refusal."""
    store, jobs = live.services.db, live.services.jobs
    rows = await _activated(store, "gc", 300)
    poisoned = {
        i: (NUL_VARIABLES, 1) if i % 2 else (None, INT4_OVERFLOW) for i in range(5, 300, 30)
    }
    calls = []
    for i, row in enumerate(rows):
        variables, count = poisoned.get(i, ('{"ok": true}', row["activation_count"]))
        calls.append(jobs.complete(row["job_key"], count, variables))
    results = await asyncio.gather(*calls, return_exceptions=True)
    failed = {i for i, r in enumerate(results) if r is not None}
    assert failed == set(poisoned), (
        f"{len(failed)} failed, of which {len(failed - set(poisoned))} good"
    )
    assert all(isinstance(results[i], asyncpg.DataError) for i in poisoned)
    states = await _states(store, "gc")
    for i, row in enumerate(rows):
        assert states[row["job_key"]] == ("ACTIVATED" if i in poisoned else "COMPLETED")


async def test_a_poisoned_activation_fails_alone_among_callers_activated_together(store):
    """39 callers asking at once share one claim (ADR 009); one's worker name is refused
    by the database: the 38 others get their jobs under their own names, it gets the
    error, and no job is left activated for it."""
    service = Rounds(store, Settings())
    await job_rows.insert(
        store, [{"type": "together", "tenantId": t} for t in "abc" for _ in range(40)], utcnow()
    )
    callers = [ActivateRequest("together", 2, 60_000, worker=f"w{i}") for i in range(39)]
    callers[17] = ActivateRequest("together", 2, 60_000, worker=EVIL_WORKER)
    results = await asyncio.gather(*(service.activate(r) for r in callers), return_exceptions=True)
    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert failed == [17], f"{len(failed)} callers failed"
    assert isinstance(results[17], asyncpg.DataError)
    keys = []
    for req, result in zip(callers, results, strict=True):
        if req.worker == EVIL_WORKER:
            continue
        rows, _ = result
        assert len(rows) == 2 and {r.worker for r in rows} == {req.worker}
        keys += [r.job_key for r in rows]
    assert len(set(keys)) == 76
    activated = await store.fetchval("SELECT count(*) FROM jobs WHERE state = 'ACTIVATED'")
    assert activated == 76


async def test_a_poisoned_waiter_at_the_head_fails_alone_and_jobs_are_still_created(live):
    """A long poll whose worker name the database refuses waits at the head of its type's
    queue.  A job created then is handed off to it (ADR 012) and the hand-off fails: the
    job is created all the same, for any tenant, the poisoned waiter alone is failed, and
    the honest poll behind it gets the job."""
    c, services = live.client, live.services
    assert await activate(c, "ho") == []  # the type is known dry: nobody is woken
    evil = services.activation.waiters.enqueue(ActivateRequest("ho", 1, 60_000, EVIL_WORKER))
    good = asyncio.create_task(c.post("/v2/jobs/activate", json=_poll("ho", "good")))
    await until_waiting(c, 2)
    created = []
    for tenant in ("acme", "globex"):
        r = await c.post("/v2/jobs", json={"type": "ho", "tenantId": tenant})
        assert r.status_code == 201, r.text
        created.append(r.json()["jobKey"])
    with pytest.raises(asyncpg.DataError):
        await asyncio.wait_for(evil.future, 5)
    [job] = (await good).json()["jobs"]
    assert job["worker"] == "good" and job["jobKey"] in created
    [other] = set(created) - {job["jobKey"]}
    assert (await c.get(f"/v2/jobs/{other}")).json()["state"] == "CREATED"
    await until_waiting(c, 0)


async def test_a_poisoned_stream_at_the_head_fails_alone_and_jobs_are_still_created(live):
    c, services = live.client, live.services
    assert await activate(c, "hs") == []
    stream = services.activation.open_stream(
        ActivateRequest("hs", 1, 60_000, EVIL_WORKER), check_ms=1_000
    )
    events = stream.events()
    first = asyncio.create_task(anext(events))
    await until_waiting(c, 1)
    r = await c.post("/v2/jobs", json={"type": "hs"})
    assert r.status_code == 201, r.text
    with pytest.raises(asyncpg.DataError):
        await asyncio.wait_for(first, 5)
    await until_waiting(c, 0)
    job = (await c.get(f"/v2/jobs/{r.json()['jobKey']}")).json()
    assert job["state"] == "CREATED" and job["activationCount"] == 0
    again = await c.post("/v2/jobs", json={"type": "hs"})
    assert again.status_code == 201
    out = {j["jobKey"] for j in await activate(c, "hs", 10)}
    assert out == {job["jobKey"], again.json()["jobKey"]}


async def test_a_poisoned_waiter_does_not_keep_its_dispatcher_from_the_waiters_behind(live):
    """Jobs created two at a time are not handed off: the type's dispatcher serves its
    waiters in order, and the poisoned one at the head fails alone."""
    c, services = live.client, live.services
    assert await activate(c, "hd") == []
    evil = services.activation.waiters.enqueue(ActivateRequest("hd", 1, 60_000, EVIL_WORKER))
    good = asyncio.create_task(c.post("/v2/jobs/activate", json=_poll("hd", "good", 5_000)))
    await until_waiting(c, 2)
    r = await c.post("/v2/jobs/batch", json={"jobs": [{"type": "hd"}, {"type": "hd"}]})
    assert r.status_code == 201
    [job] = (await good).json()["jobs"]
    assert job["worker"] == "good" and job["jobKey"] in r.json()["jobKeys"]
    with pytest.raises(asyncpg.DataError):
        evil.future.result()
    await until_waiting(c, 0)


async def test_charges_carried_by_a_poisoned_lane_read_are_still_written(store):
    """A lane read carries the charges of earlier claims of its type, whoever made them
    (LaneCharges.read).  A read refused for its caller's tenant filter gives
    them back to the writer: the lanes are charged all the same."""
    service = Rounds(store, Settings())
    await job_rows.insert(
        store, [{"type": "ch", "tenantId": t} for t in "ab" for _ in range(4)], utcnow()
    )
    rows, _ = await service.activate(ActivateRequest("ch", 3, 60_000, "good"))
    await service.settle()
    # Charges of a claim not yet written (as when the next read follows at once): the
    # poisoned read below takes them into its own statement.
    service.charges.add("ch", Charges(Counter({"a": 2}), {"a": 1.0}, Counter(), {}))
    evil = ActivateRequest("ch", 1, 60_000, "evil", tenant_ids=["a", "b\x00"])
    with pytest.raises(asyncpg.DataError):
        await service.activate_owed(evil)
    await service.settle()
    totals = await store.fetch("SELECT tenant_id, activated_total FROM lanes ORDER BY 1")
    claimed = Counter(r.tenant_id for r in rows)
    assert {r["tenant_id"]: r["activated_total"] for r in totals} == {
        "a": claimed["a"] + 2,
        "b": claimed["b"],
    }


async def test_a_poisoned_job_handed_to_a_waiter_fails_its_producer_alone(live):
    """The other way round: the job's own value is refused.  Its producer gets the
    error, and the waiter it was offered to waits on and gets the next job."""
    c, services = live.client, live.services
    assert await activate(c, "hj") == []
    good = asyncio.create_task(c.post("/v2/jobs/activate", json=_poll("hj", "good")))
    await until_waiting(c, 1)
    with pytest.raises(asyncpg.DataError):
        await services.jobs.create([{"type": "hj", "variables": {"note": "\x00"}}], utcnow())
    r = await c.post("/v2/jobs", json={"type": "hj"})
    assert r.status_code == 201
    [job] = (await good).json()["jobs"]
    assert job["jobKey"] == r.json()["jobKey"] and job["worker"] == "good"
    assert len(await _states(services.db, "hj")) == 1


async def test_a_poisoned_waiter_in_a_batch_claimed_together_fails_alone(store):
    """A dispatcher claims once for a batch of waiters of one filter (ADR 030); one whose
    worker name the database refuses fails that shared claim, and then alone: the
    waiters beside it, before and after, each get their job, and none is left
    activated for it."""
    from app.activation.waiting import Waiter, WaiterHub, _TypeQueue

    service = Rounds(store, Settings())
    hub = WaiterHub(service, service.release, max_waiters=10, backup_poll_ms=3_600_000)
    await job_rows.insert(store, [{"type": "batch"} for _ in range(3)], utcnow())
    q = _TypeQueue()
    waiters = [
        Waiter(ActivateRequest("batch", 1, 60_000, worker))
        for worker in ("first", EVIL_WORKER, "last")
    ]
    q.waiters.extend(waiters)
    got = await hub._serve_group(q, waiters)
    await service.settle()
    assert got == [1, None, 1]
    with pytest.raises(asyncpg.DataError):
        waiters[1].future.result()
    assert [w.future.result()[0].worker for w in (waiters[0], waiters[2])] == ["first", "last"]
    rows = await store.fetch("SELECT state, worker FROM jobs WHERE job_type = 'batch'")
    assert Counter((r["state"], r["worker"]) for r in rows) == {
        ("ACTIVATED", "first"): 1,
        ("ACTIVATED", "last"): 1,
        ("CREATED", None): 1,
    }
