"""DESIGN §1.5–1.6 and API.md "Finish a job": fencing, leases, retries, back-off."""

from __future__ import annotations

import asyncio
from datetime import timedelta, timezone

from app.domain import utcnow
from tests.acceptance.test_metrics import scrape, value
from tests.helpers import activate, assert_problem, complete


async def _one(c, job_type="f", **fields):
    r = await c.post("/v2/jobs", json={"type": job_type, **fields})
    assert r.status_code == 201, r.text
    return r.json()


async def test_lease_expiry_returns_the_job_and_fences_the_stale_holder(live):
    c = live.client
    job = await _one(c)
    [first] = await activate(c, "f", lease_ms=1)
    assert first["activationCount"] == 1
    released = await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    assert released == 1
    back = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert back["state"] == "CREATED" and back["retries"] == 3 and back["deadline"] is None
    [second] = await activate(c, "f", lease_ms=60_000)
    assert second["jobKey"] == job["jobKey"] and second["activationCount"] == 2

    key = job["jobKey"]
    stale = {"activationCount": 1}
    for r in (
        await complete(c, first),
        await c.post(f"/v2/jobs/{key}/fail", json=stale),
        await c.post(f"/v2/jobs/{key}/error", json={**stale, "errorCode": "E"}),
        await c.patch(f"/v2/jobs/{key}", json={**stale, "changeset": {"timeout": 1000}}),
        await c.patch(f"/v2/jobs/{key}", json={**stale, "changeset": {"retries": 5}}),
    ):
        body = assert_problem(r, 409)
        assert body["type"] == "urn:jobfair:stale-activation"
    unchanged = (await c.get(f"/v2/jobs/{key}")).json()
    assert unchanged["state"] == "ACTIVATED" and unchanged["retries"] == 3

    assert (await complete(c, second)).status_code == 204
    assert_problem(await complete(c, second), 409)
    assert (await c.get(f"/v2/jobs/{key}")).json()["state"] == "COMPLETED"


async def test_heartbeat_extends_the_lease(live):
    c = live.client
    await _one(c)
    [job] = await activate(c, "f", lease_ms=1000)
    r = await c.patch(
        f"/v2/jobs/{job['jobKey']}", json={"activationCount": 1, "changeset": {"timeout": 600_000}}
    )
    assert r.status_code == 204, r.text
    # A sweep as of 5 minutes from now does not take it back: the lease runs 10.
    assert await live.services.background.lease.run_once(utcnow() + timedelta(minutes=5)) == 0
    after = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert after["state"] == "ACTIVATED"


async def test_fail_spends_a_retry_and_backs_off(live):
    c = live.client
    job = await _one(c, retries=2)
    [a] = await activate(c, "f")
    r = await c.post(
        f"/v2/jobs/{a['jobKey']}/fail",
        json={"activationCount": 1, "errorMessage": "boom", "retryBackOff": 60_000},
    )
    assert r.status_code == 204, r.text
    now = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert now["state"] == "CREATED" and now["retries"] == 1 and now["errorMessage"] == "boom"
    # Backing off: not activatable until runAt, then promoted.
    assert await activate(c, "f") == []
    assert await live.services.background.promoter.run_once(utcnow()) == 0
    assert await live.services.background.promoter.run_once(utcnow() + timedelta(seconds=61)) == 1
    [b] = await activate(c, "f")
    assert b["jobKey"] == job["jobKey"] and b["activationCount"] == 2


async def test_retries_exhausted_fail_the_job_and_patch_revives_it(live):
    c = live.client
    job = await _one(c, retries=1)
    [a] = await activate(c, "f")
    assert (
        await c.post(f"/v2/jobs/{a['jobKey']}/fail", json={"activationCount": 1})
    ).status_code == 204
    failed = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert failed["state"] == "FAILED" and failed["retries"] == 0
    assert await activate(c, "f") == []
    r = await c.patch(f"/v2/jobs/{job['jobKey']}", json={"changeset": {"retries": 2}})
    assert r.status_code == 204, r.text
    revived = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert revived["state"] == "CREATED" and revived["retries"] == 2
    [b] = await activate(c, "f")
    assert b["jobKey"] == job["jobKey"] and b["activationCount"] == 2


async def test_fail_with_explicit_retries_and_no_backoff_is_activatable_at_once(live):
    c = live.client
    await _one(c, retries=1)
    [a] = await activate(c, "f")
    r = await c.post(f"/v2/jobs/{a['jobKey']}/fail", json={"activationCount": 1, "retries": 5})
    assert r.status_code == 204
    [b] = await activate(c, "f")
    assert b["retries"] == 5 and b["activationCount"] == 2


async def test_error_is_terminal(live):
    c = live.client
    job = await _one(c)
    [a] = await activate(c, "f")
    r = await c.post(
        f"/v2/jobs/{a['jobKey']}/error",
        json={"activationCount": 1, "errorCode": "NO_SUCH_USER", "errorMessage": "x"},
    )
    assert r.status_code == 204, r.text
    done = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert done["state"] == "ERROR_THROWN" and done["errorCode"] == "NO_SUCH_USER"
    assert await activate(c, "f") == []


async def test_cancel_from_created_or_activated_never_from_a_finished_job(live):
    c = live.client
    job = await _one(c)
    assert (await c.post(f"/v2/jobs/{job['jobKey']}/cancel")).status_code == 204
    assert (await c.get(f"/v2/jobs/{job['jobKey']}")).json()["state"] == "CANCELED"
    assert await activate(c, "f") == []
    assert_problem(await c.post(f"/v2/jobs/{job['jobKey']}/cancel"), 409, "INVALID_STATE")
    await _one(c)
    [running] = await activate(c, "f")
    assert (await c.post(f"/v2/jobs/{running['jobKey']}/cancel")).status_code == 204
    assert_problem(await complete(c, running), 409, "INVALID_STATE")
    finished = await _one(c)
    [done] = await activate(c, "f")
    assert (await complete(c, done)).status_code == 204
    assert_problem(await c.post(f"/v2/jobs/{finished['jobKey']}/cancel"), 409)
    assert_problem(await c.post("/v2/jobs/12345/cancel"), 404, "NOT_FOUND")


async def test_batch_completion_reports_each_job(live):
    c = live.client
    for _ in range(3):
        await _one(c)
    jobs = await activate(c, "f", 3)
    items = [{"jobKey": j["jobKey"], "activationCount": j["activationCount"]} for j in jobs]
    items[1]["activationCount"] = 7
    items.append({"jobKey": "999999", "activationCount": 1})
    r = await c.post("/v2/jobs/complete", json={"jobs": items})
    assert r.status_code == 200, r.text
    statuses = [x["status"] for x in r.json()["results"]]
    assert statuses == [204, 409, 204, 404]
    assert [x["jobKey"] for x in r.json()["results"]] == [i["jobKey"] for i in items]


async def test_a_job_named_again_with_the_same_count_is_judged_after_its_first_naming(live):
    """A stale naming first, then the right one, then repeats of each: only the right one
    completes, wherever the repeats stand (as if each naming came after the one before)."""
    c = live.client
    for _ in range(2):
        await _one(c)
    a, b = await activate(c, "f", 2)
    stale = {"jobKey": a["jobKey"], "activationCount": a["activationCount"] + 1}
    right = {"jobKey": a["jobKey"], "activationCount": a["activationCount"]}
    other = {"jobKey": b["jobKey"], "activationCount": b["activationCount"]}
    items = [stale, stale, right, other, right, stale, other]
    r = await c.post("/v2/jobs/complete", json={"jobs": items})
    assert [x["status"] for x in r.json()["results"]] == [409, 409, 204, 204, 409, 409, 409]
    assert (await c.get(f"/v2/jobs/{a['jobKey']}")).json()["state"] == "COMPLETED"


async def test_idempotency_key_returns_the_same_job(live):
    c = live.client
    body = {"type": "f", "tenantId": "acme", "idempotencyKey": "order-1"}
    r1 = await c.post("/v2/jobs", json=body)
    r2 = await c.post("/v2/jobs", json=body)
    assert r1.status_code == 201 and r2.status_code == 200
    assert r1.json()["jobKey"] == r2.json()["jobKey"]
    other_tenant = await c.post("/v2/jobs", json={**body, "tenantId": "globex"})
    assert other_tenant.status_code == 201
    assert other_tenant.json()["jobKey"] != r1.json()["jobKey"]
    batch = await c.post("/v2/jobs/batch", json={"jobs": [body, body, {"type": "f"}]})
    keys = batch.json()["jobKeys"]
    assert keys[0] == keys[1] == r1.json()["jobKey"] and keys[2] != keys[0]
    assert len(await activate(c, "f", 10)) == 3
    # A key new to the database, twice in one batch beside a job without a key.
    fresh = {**body, "idempotencyKey": "order-2"}
    batch = await c.post("/v2/jobs/batch", json={"jobs": [{"type": "f"}, fresh, fresh]})
    keys = batch.json()["jobKeys"]
    assert keys[1] == keys[2] and len({keys[0], keys[1]}) == 2
    assert sorted(j["jobKey"] for j in await activate(c, "f", 10)) == sorted(set(keys))


async def test_one_key_created_at_once_from_many_calls_makes_one_job(live):
    """Single creates racing with one new key: one insert wins, the others wait for its
    commit, find the key taken and answer the job holding it (200); counted once."""
    c = live.client
    body = {"type": "race", "tenantId": "acme", "idempotencyKey": "order-9"}
    answers = await asyncio.gather(*(c.post("/v2/jobs", json=body) for _ in range(20)))
    assert sorted(r.status_code for r in answers) == [200] * 19 + [201]
    assert len({r.json()["jobKey"] for r in answers}) == 1
    assert len(await activate(c, "race", 10)) == 1
    created = value(await scrape(c), "jobfair_jobs_created_total", type="race", tenant="acme")
    assert created == 1


async def test_delayed_job_waits_for_run_at(live):
    c = live.client
    job = await _one(c, delay=30_000)
    assert job["state"] == "CREATED"
    assert await activate(c, "f") == []
    await live.services.background.promoter.run_once(utcnow() + timedelta(seconds=31))
    [a] = await activate(c, "f")
    assert a["jobKey"] == job["jobKey"]


async def test_run_at_is_honoured_as_spelled_in_any_zone(live):
    """runAt in another zone names the same instant; one in the past is ready at once.
    Defaults (tenant, priority, retries) are filled in for fields left out."""
    c = live.client
    due = utcnow().replace(microsecond=0) + timedelta(seconds=30)
    kolkata = timezone(timedelta(hours=5, minutes=30))
    later = await _one(c, "ra", runAt=due.astimezone(kolkata).isoformat())
    past = await _one(c, "ra", runAt="2020-01-01T00:00:00Z", priority=7)
    [ready] = await activate(c, "ra", 10)
    assert ready["jobKey"] == past["jobKey"]
    assert (ready["tenantId"], ready["priority"], ready["retries"]) == ("<default>", 7, 3)
    promoter = live.services.background.promoter
    await promoter.run_once(due - timedelta(seconds=1))
    assert await activate(c, "ra", 10) == []
    await promoter.run_once(due)
    [a] = await activate(c, "ra", 10)
    assert a["jobKey"] == later["jobKey"] and a["priority"] == 50


async def test_concurrent_single_completions_are_each_judged_once(live):
    """Completions arriving together share one statement (group commit) but keep their
    own verdicts: every job completes once, and a duplicate or stale completion sent in
    the same instant is a 409, exactly as if it had come after."""
    c = live.client
    r = await c.post("/v2/jobs/batch", json={"jobs": [{"type": "gc"}] * 60})
    assert r.status_code == 201
    jobs = await activate(c, "gc", max_jobs=60)
    assert len(jobs) == 60
    calls = []
    for j in jobs:
        calls += [complete(c, j), complete(c, j), complete(c, {**j, "activationCount": 7})]
    responses = await asyncio.gather(*calls)
    by_key: dict[str, list[int]] = {}
    for j, r in zip([j for j in jobs for _ in range(3)], responses, strict=True):
        by_key.setdefault(j["jobKey"], []).append(r.status_code)
    assert all(sorted(codes) == [204, 409, 409] for codes in by_key.values()), by_key
    states = {(await c.get(f"/v2/jobs/{j['jobKey']}")).json()["state"] for j in jobs}
    assert states == {"COMPLETED"}


async def test_group_commit_keeps_a_key_to_one_statement(live):
    """Two completions of one job queued before the flusher runs: the second is judged
    by the next statement, after the first committed."""
    c = live.client
    await c.post("/v2/jobs", json={"type": "gc1"})
    [job] = await activate(c, "gc1")
    item = (int(job["jobKey"]), job["activationCount"], None)
    first, second = await asyncio.gather(
        live.services.jobs.group_commit.complete(item),
        live.services.jobs.group_commit.complete(item),
    )
    assert first is not None and first.job_key == item[0]  # the job it completed
    assert second is None
