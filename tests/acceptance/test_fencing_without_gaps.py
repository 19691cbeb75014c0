"""Fencing without gaps (issue 19 §4): a job is finished at most once however its
completions arrive, an unfenced heartbeat never cuts someone else's lease, and an
activated record says the priority its pick used."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta

from app.domain import utcnow
from tests.helpers import activate, assert_problem, complete, enqueue


def _item(job: dict, count: int | None = None) -> dict:
    return {"jobKey": job["jobKey"], "activationCount": count or job["activationCount"]}


async def _complete_batch(c, items: list[dict]) -> list[int]:
    r = await c.post("/v2/jobs/complete", json={"jobs": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["jobKey"] for x in results] == [i["jobKey"] for i in items]
    return [x["status"] for x in results]


async def test_a_job_named_twice_in_one_batch_is_completed_once_and_the_repeat_is_409(live):
    c = live.client
    await enqueue(c, "twice", "acme", 3)
    a, b, d = await activate(c, "twice", 3)
    assert await _complete_batch(c, [_item(a), _item(a)]) == [204, 409]
    # A repeat with a wrong activationCount, either way round: judged in order.
    assert await _complete_batch(c, [_item(b), _item(b, 7)]) == [204, 409]
    assert await _complete_batch(c, [_item(d, 7), _item(d), _item(d)]) == [409, 204, 409]
    for job in (a, b, d):
        assert (await c.get(f"/v2/jobs/{job['jobKey']}")).json()["state"] == "COMPLETED"


async def test_completions_of_one_job_from_concurrent_calls_succeed_exactly_once(live):
    """Batch calls (each naming every job, some twice) and single calls (group-committed
    together) racing on the same jobs: each job gets exactly one 204."""
    c = live.client
    await enqueue(c, "race", "acme", 40)
    jobs = await activate(c, "race", 40)
    assert len(jobs) == 40
    batch = [_item(j) for j in jobs] + [_item(j) for j in jobs[::3]]
    calls = [c.post("/v2/jobs/complete", json={"jobs": batch}) for _ in range(3)]
    calls += [complete(c, j) for j in jobs for _ in range(2)]
    responses = await asyncio.gather(*calls)
    successes: Counter[str] = Counter()
    for r in responses[:3]:
        assert r.status_code == 200, r.text
        for x in r.json()["results"]:
            assert x["status"] in (204, 409)
            successes[x["jobKey"]] += x["status"] == 204
    for j, r in zip([j for j in jobs for _ in range(2)], responses[3:], strict=True):
        assert r.status_code in (204, 409), r.text
        successes[j["jobKey"]] += r.status_code == 204
    assert successes == {j["jobKey"]: 1 for j in jobs}


def _deadline(job: dict) -> datetime:
    return datetime.fromisoformat(job["deadline"].replace("Z", "+00:00"))


def _ms_now() -> datetime:
    """Now, floored to the millisecond the API shows instants in: a deadline the server
    set later in the same millisecond is shown before the unfloored now (a fresh clone's
    CI: 21:45:02.598000 shown for a lease set after 21:45:02.598232)."""
    now = utcnow()
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


async def _job(c, key: str) -> dict:
    return (await c.get(f"/v2/jobs/{key}")).json()


async def test_an_unfenced_heartbeat_extends_a_lease_and_never_shortens_it(live):
    c = live.client
    await enqueue(c, "hb", "acme", 1)
    [job] = await activate(c, "hb", lease_ms=60_000)
    key, lease = job["jobKey"], _deadline(job)
    patch = {"changeset": {"timeout": 1_000}}
    assert (await c.patch(f"/v2/jobs/{key}", json=patch)).status_code == 204
    assert _deadline(await _job(c, key)) == lease  # another worker's 60 s lease stands
    assert await live.services.background.lease.run_once(utcnow() + timedelta(seconds=5)) == 0
    longer = {"changeset": {"timeout": 120_000}}
    before = _ms_now()
    assert (await c.patch(f"/v2/jobs/{key}", json=longer)).status_code == 204
    extended = _deadline(await _job(c, key))
    assert extended >= before + timedelta(seconds=120) > lease


async def test_a_fenced_heartbeat_sets_the_lease_and_a_stale_one_is_409(live):
    c = live.client
    await enqueue(c, "hb", "acme", 1)
    [first] = await activate(c, "hb", lease_ms=1)
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    [job] = await activate(c, "hb", lease_ms=60_000)
    key, lease = job["jobKey"], _deadline(job)
    stale = {"changeset": {"timeout": 1_000}, "activationCount": first["activationCount"]}
    assert_problem(await c.patch(f"/v2/jobs/{key}", json=stale), 409)
    assert _deadline(await _job(c, key)) == lease
    # The holder itself may shorten its own lease.
    mine = {"changeset": {"timeout": 1_000}, "activationCount": job["activationCount"]}
    before = _ms_now()
    assert (await c.patch(f"/v2/jobs/{key}", json=mine)).status_code == 204
    shortened = _deadline(await _job(c, key))
    assert before + timedelta(seconds=1) <= shortened < lease


async def test_a_camunda_heartbeat_without_a_token_never_shortens_and_a_stale_token_is_409(live):
    c = live.client
    await enqueue(c, "hbc", "acme", 1)
    activation = {"type": "hbc", "maxJobsToActivate": 1, "timeout": 1, "requestTimeout": -1}
    [first] = (await c.post("/v2/jobs/activation", json=activation)).json()["jobs"]
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    r = await c.post("/v2/jobs/activation", json={**activation, "timeout": 60_000})
    [job] = r.json()["jobs"]
    key = job["jobKey"]
    lease = _deadline(await _job(c, key))
    unfenced = {"changeset": {"timeout": 1_000}, "operationReference": 1}
    assert (await c.patch(f"/v2/jobs/{key}", json=unfenced)).status_code == 204
    assert _deadline(await _job(c, key)) == lease
    stale = {"changeset": {"timeout": 1_000}, "jobLeaseToken": first["jobLeaseToken"]}
    assert_problem(await c.patch(f"/v2/jobs/{key}", json=stale), 409, "INVALID_STATE")
    assert _deadline(await _job(c, key)) == lease
    current = {"changeset": {"timeout": 1_000}, "jobLeaseToken": job["jobLeaseToken"]}
    assert (await c.patch(f"/v2/jobs/{key}", json=current)).status_code == 204
    assert _deadline(await _job(c, key)) < lease


async def test_an_activated_record_says_the_aged_priority_its_pick_used(live):
    """Two jobs in one lane: one of priority 50 that has waited three aging intervals, one
    of priority 75 just created.  The pick takes the aged one (effective 80 > 75); its
    record says 80, and so does a later read of it."""
    c = live.client
    assert (
        await c.put("/v2/job-types/aged", json={"agingIntervalMs": 60_000, "agingStep": 10})
    ).status_code == 200
    [old] = await enqueue(c, "aged", "acme", 1, priority=50)
    await live.services.db.execute(
        "UPDATE jobs SET queued_at = queued_at - interval '3 minutes 1 second' WHERE job_key = $1",
        int(old),
    )
    await enqueue(c, "aged", "acme", 1, priority=75)
    assert (await _job(c, old))["effectivePriority"] == 80
    [job] = await activate(c, "aged")
    assert job["jobKey"] == old
    assert (job["priority"], job["effectivePriority"]) == (50, 80)
    assert (await _job(c, old))["effectivePriority"] == 80


async def test_a_finished_job_is_not_patched(live):
    """Found from outside: PATCH of retries or priority with a finished job's last
    activationCount answered 204 and changed it."""
    c = live.client
    r = await c.post("/v2/jobs", json={"type": "done-patch"})
    assert r.status_code == 201, r.text
    [job] = (
        await c.post(
            "/v2/jobs/activate",
            json={"type": "done-patch", "maxJobs": 1, "timeout": 60_000, "requestTimeout": -1},
        )
    ).json()["jobs"]
    r = await c.post(f"/v2/jobs/{job['jobKey']}/complete", json={"activationCount": 1})
    assert r.status_code == 204, r.text
    for body in (
        {"changeset": {"retries": 5, "priority": 99}, "activationCount": 1},
        {"changeset": {"priority": 7}},
    ):
        r = await c.patch(f"/v2/jobs/{job['jobKey']}", json=body)
        assert r.status_code == 409, r.text
    record = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert (record["retries"], record["priority"], record["state"]) == (3, 50, "COMPLETED")
