"""Issue 24, section 3: the API a job browser needs -- the listing with cursor paging, a
job's attempt history, bulk retry and cancel, cancel of an ACTIVATED job, the workers
seen -- over HTTP against a real server and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
from datetime import timedelta
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain import utcnow
from tests.helpers import activate, assert_problem, backdate, complete, enqueue

LISTED = ("CREATED", "ACTIVATED", "COMPLETED", "FAILED", "ERROR_THROWN", "CANCELED")


async def list_all(c: httpx.AsyncClient, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every page of a listing, following nextCursor."""
    items: list[dict[str, Any]] = []
    query = dict(params)
    while True:
        r = await c.get("/v2/jobs", params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        items.extend(page["items"])
        if page["nextCursor"] is None:
            return items
        query["cursor"] = page["nextCursor"]


async def fail(c: httpx.AsyncClient, job: dict[str, Any], **fields: Any) -> httpx.Response:
    return await c.post(
        f"/v2/jobs/{job['jobKey']}/fail",
        json={"activationCount": job["activationCount"], **fields},
    )


async def make_world(live) -> list[str]:
    """Jobs of three types and three tenants in every state, created over two days; the
    keys of all of them."""
    c, db = live.client, live.services.db
    keys: list[str] = []
    for i, (job_type, tenant) in enumerate(
        (t, n) for t in ("mail", "pdf", "sms") for n in ("acme", "globex", "initech")
    ):
        made = await enqueue(c, job_type, tenant, 7)
        keys += made
        keys += await enqueue(c, job_type, tenant, 1, delay=3_600_000)  # delayed: CREATED
        got = await activate(c, job_type, 5, tenantIds=[tenant])
        assert len(got) == 5
        assert (await complete(c, got[0])).status_code == 204
        assert (await fail(c, got[1], retries=0, errorMessage="boom")).status_code == 204
        r = await c.post(
            f"/v2/jobs/{got[2]['jobKey']}/error",
            json={"activationCount": got[2]["activationCount"], "errorCode": "E"},
        )
        assert r.status_code == 204
        assert (await c.post(f"/v2/jobs/{made[6]}/cancel")).status_code == 204
        # got[3], got[4] stay ACTIVATED; made[5] stays CREATED.  Spread creation times.
        await backdate(db, [int(k) for k in made], timedelta(hours=i * 5))
    return keys


async def test_the_listing_filters_by_type_tenant_state_and_creation_time(live):
    c = live.client
    await make_world(live)
    failed = await list_all(c, {"tenantId": "acme", "state": "FAILED"})
    assert sorted(j["type"] for j in failed) == ["mail", "pdf", "sms"]
    assert all(j["state"] == "FAILED" and j["errorMessage"] == "boom" for j in failed)
    keys = [int(j["jobKey"]) for j in failed]
    assert keys == sorted(keys, reverse=True)  # newest (highest key) first
    # A job as the listing answers it is the job as GET answers it.
    one = (await c.get(f"/v2/jobs/{failed[0]['jobKey']}")).json()
    assert failed[0] == one
    created = await list_all(c, {"type": "pdf", "tenantId": "globex", "state": "CREATED"})
    assert len(created) == 2  # one ready, one delayed: both CREATED
    both = await list_all(c, {"type": "mail", "state": "ACTIVATED,COMPLETED"})
    assert sorted(j["state"] for j in both) == ["ACTIVATED"] * 6 + ["COMPLETED"] * 3
    assert len(await list_all(c, {})) == 72
    # mail/acme was created now, mail/initech 10 h ago (each lane 5 h apart).
    since = (utcnow() - timedelta(hours=7)).isoformat()
    before = (utcnow() - timedelta(hours=3)).isoformat()
    window = await list_all(c, {"type": "mail", "createdAfter": since, "createdBefore": before})
    assert {j["tenantId"] for j in window} == {"globex"} and len(window) == 7
    assert await list_all(c, {"tenantId": "nobody"}) == []


async def test_pages_follow_the_cursor_and_stay_stable_while_jobs_are_inserted(live):
    """Keyset pages: each page continues below the last key of the one before, so jobs
    inserted between pages never make a page repeat or skip one that was there.  (A
    job inserted meanwhile shows up only if its key is below the cursor: keys come from
    a sequence each connection caches a block of.)"""
    c = live.client
    first = await enqueue(c, "p", "acme", 25)
    r = await c.get("/v2/jobs", params={"type": "p", "limit": 10})
    page = r.json()
    assert [j["jobKey"] for j in page["items"]] == sorted(first, key=int, reverse=True)[:10]
    inserted = await enqueue(c, "p", "acme", 30)
    seen = [j["jobKey"] for j in page["items"]]
    cursor = page["nextCursor"]
    while cursor is not None:
        r = await c.get("/v2/jobs", params={"type": "p", "limit": 10, "cursor": cursor})
        page = r.json()
        assert len(page["items"]) <= 10
        seen += [j["jobKey"] for j in page["items"]]
        cursor = page["nextCursor"]
        inserted += await enqueue(c, "p", "acme", 3)
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(first) <= set(seen)  # nothing skipped
    assert set(seen) <= set(first) | set(inserted)
    assert [int(k) for k in seen] == sorted((int(k) for k in seen), reverse=True)
    # The default limit is 100; more than 1,000 is refused.
    await enqueue(c, "p", "acme", 50)
    r = await c.get("/v2/jobs", params={"type": "p"})
    assert len(r.json()["items"]) == 100 and r.json()["nextCursor"] is not None
    assert_problem(await c.get("/v2/jobs", params={"limit": 1001}), 400)


async def test_random_filters_list_exactly_the_jobs_that_get_shows_matching(live):
    """Hypothesis: any filter, any page size, paged to the end, answers exactly the jobs
    a reference built from GET /v2/jobs/{key} of every job selects, newest first."""
    c = live.client
    keys = await make_world(live)
    records = [(await c.get(f"/v2/jobs/{k}")).json() for k in keys]
    now = utcnow()
    instants = [None, *(now - timedelta(hours=h) for h in (1, 6, 12, 50))]
    loop = asyncio.get_running_loop()

    def without_age(job: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in job.items() if k != "effectivePriority"}

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(
        job_type=st.sampled_from([None, "mail", "pdf", "sms", "none"]),
        tenant=st.sampled_from([None, "acme", "globex", "initech", "nobody"]),
        states=st.none() | st.sets(st.sampled_from(LISTED), min_size=1),
        after=st.sampled_from(instants),
        before=st.sampled_from(instants),
        limit=st.sampled_from([1, 2, 5, 13, 1000]),
    )
    def check(job_type, tenant, states, after, before, limit) -> None:  # type: ignore[no-untyped-def]
        params: dict[str, Any] = {"limit": limit}
        if job_type is not None:
            params["type"] = job_type
        if tenant is not None:
            params["tenantId"] = tenant
        if states is not None:
            params["state"] = ",".join(sorted(states))
        if after is not None:
            params["createdAfter"] = after.isoformat()
        if before is not None:
            params["createdBefore"] = before.isoformat()
        expected = [
            r
            for r in records
            if (job_type is None or r["type"] == job_type)
            and (tenant is None or r["tenantId"] == tenant)
            and (states is None or r["state"] in states)
            and (after is None or r["createdAt"] >= _ms(after))
            and (before is None or r["createdAt"] < _ms(before))
        ]
        expected.sort(key=lambda r: int(r["jobKey"]), reverse=True)
        got = asyncio.run_coroutine_threadsafe(list_all(c, params), loop).result(60)
        assert [without_age(j) for j in got] == [without_age(j) for j in expected]

    await asyncio.to_thread(check)


def _ms(instant: Any) -> str:
    """An instant as records spell it, for comparing with their createdAt: created_at is
    stored in microseconds, records show milliseconds; a job created within the same
    millisecond as the bound can be on either side, which the world never does."""
    from app.domain import rfc3339

    text: str = rfc3339(instant)  # type: ignore[assignment]
    return text


async def test_a_cursor_that_was_changed_or_made_for_other_filters_is_refused(live):
    c = live.client
    await enqueue(c, "q", "acme", 5)
    r = await c.get("/v2/jobs", params={"type": "q", "limit": 2})
    cursor = r.json()["nextCursor"]
    ok = await c.get("/v2/jobs", params={"type": "q", "limit": 2, "cursor": cursor})
    assert ok.status_code == 200 and len(ok.json()["items"]) == 2
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    version, key, fingerprint, mac = raw.split(":")
    forged_key = f"{version}:{int(key) + 1}:{fingerprint}:{mac}"
    forged = base64.urlsafe_b64encode(forged_key.encode()).decode().rstrip("=")
    for bad in (
        forged,
        cursor[:-1] + ("A" if cursor[-1] != "A" else "B"),
        "garbage",
        "",
        "x" * 300,
        "%00",
    ):
        r = await c.get("/v2/jobs", params={"type": "q", "limit": 2, "cursor": bad})
        assert_problem(r, 400)
    # Another filter's cursor, and a limit changed between pages (allowed).
    assert_problem(await c.get("/v2/jobs", params={"type": "other", "cursor": cursor}), 400)
    ok = await c.get("/v2/jobs", params={"type": "q", "limit": 50, "cursor": cursor})
    assert ok.status_code == 200 and len(ok.json()["items"]) == 3


async def test_hostile_listing_parameters_are_400_problems(live):
    c = live.client
    for params in (
        {"state": "SCHEDULED"},  # internal: delayed jobs are CREATED
        {"state": "created"},
        {"state": "CREATED,"},
        {"state": ""},
        {"limit": "0"},
        {"limit": "-1"},
        {"limit": "1e3"},
        {"limit": "١٠"},
        {"tenantId": "bad tenant"},
        {"tenantId": "x" * 32},
        {"type": "a\x00b"},
        {"type": ""},
        {"createdAfter": "yesterday"},
        {"createdBefore": "2026-13-01T00:00:00Z"},
        {"createdAfter": "0001-01-01T00:00:00Z"},
        {"page": "2"},
    ):
        assert_problem(await c.get("/v2/jobs", params=params), 400)
    assert_problem(await c.get("/v2/jobs?type=%FF"), 400)
    assert_problem(await c.get("/v2/jobs/abc/history"), 400)
    assert_problem(await c.get("/v2/jobs/42/history"), 404)


def _entries(history: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(e["event"], e["activationCount"], e["worker"]) for e in history["items"]]


async def _history(c: httpx.AsyncClient, key: str) -> dict[str, Any]:
    r = await c.get(f"/v2/jobs/{key}/history")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_the_history_records_each_attempt_and_how_it_ended(live):
    c = live.client
    [key] = await enqueue(c, "h", "acme", 1, retries=2)
    [a1] = await activate(c, "h", worker="w1", lease_ms=30_000)
    running = await _history(c, key)
    assert _entries(running) == [("created", 0, None), ("activated", 1, "w1")]
    assert running["items"][1]["deadline"] == a1["deadline"]
    assert running["truncated"] is False
    assert (await fail(c, a1, errorMessage="try again", retryBackOff=0)).status_code == 204
    [a2] = await activate(c, "h", worker="w2")
    assert (await fail(c, a2, retries=0, errorMessage="gave up")).status_code == 204
    r = await c.patch(f"/v2/jobs/{key}", json={"changeset": {"retries": 1}})
    assert r.status_code == 204
    [a3] = await activate(c, "h", worker="w3")
    r = await c.post(
        f"/v2/jobs/{key}/error",
        json={
            "activationCount": a3["activationCount"],
            "errorCode": "NO_USER",
            "errorMessage": "m",
        },
    )
    assert r.status_code == 204
    h = await _history(c, key)
    assert _entries(h) == [
        ("created", 0, None),
        ("activated", 1, "w1"),
        ("retried", 1, "w1"),
        ("activated", 2, "w2"),
        ("failed", 2, "w2"),
        ("revived", 2, None),
        ("activated", 3, "w3"),
        ("error-thrown", 3, "w3"),
    ]
    by = {(e["event"], e["activationCount"]): e for e in h["items"]}
    assert by[("retried", 1)]["errorMessage"] == "try again" and by[("retried", 1)]["retries"] == 1
    assert by[("failed", 2)]["errorMessage"] == "gave up" and by[("failed", 2)]["retries"] == 0
    assert by[("revived", 2)]["retries"] == 1
    assert by[("error-thrown", 3)]["errorCode"] == "NO_USER"
    assert by[("activated", 1)]["deadline"] == a1["deadline"]
    times = [e["at"] for e in h["items"]]
    assert times == sorted(times)
    job = (await c.get(f"/v2/jobs/{key}")).json()
    assert h["items"][0]["at"] == job["createdAt"]


async def test_a_lease_expiry_is_recorded_and_the_stale_workers_finish_adds_nothing(live):
    c = live.client
    [key] = await enqueue(c, "x", "acme", 1)
    [stale] = await activate(c, "x", worker="slow", lease_ms=1)
    later = utcnow() + timedelta(seconds=5)
    assert await live.services.background.lease.run_once(later) == 1
    [fresh] = await activate(c, "x", worker="quick")
    assert (await complete(c, stale)).status_code == 409
    assert (await fail(c, stale)).status_code == 409
    assert (await complete(c, fresh)).status_code == 204
    assert (await complete(c, fresh)).status_code == 409  # finished already
    h = await _history(c, key)
    assert _entries(h) == [
        ("created", 0, None),
        ("activated", 1, "slow"),
        ("lease-expired", 1, "slow"),
        ("activated", 2, "quick"),
        ("completed", 2, "quick"),
    ]
    [expired] = [e for e in h["items"] if e["event"] == "lease-expired"]
    assert expired["at"] == _ms(later)


async def test_cancel_of_an_activated_job_fences_out_its_worker_and_frees_its_cap(live):
    c = live.client
    await c.put("/v2/tenants/capped", json={"maxActiveJobs": 1})
    keys = await enqueue(c, "cc", "capped", 2)
    [running] = await activate(c, "cc", worker="w")
    assert await activate(c, "cc") == []  # the tenant is at its cap
    r = await c.post(f"/v2/jobs/{running['jobKey']}/cancel")
    assert r.status_code == 204
    assert_problem(await complete(c, running), 409, "INVALID_STATE")
    assert_problem(await fail(c, running), 409)
    r = await c.patch(
        f"/v2/jobs/{running['jobKey']}",
        json={"changeset": {"timeout": 60_000}, "activationCount": running["activationCount"]},
    )
    assert_problem(r, 409)
    [next_one] = await activate(c, "cc")  # the cap freed
    assert next_one["jobKey"] == keys[1]
    job = (await c.get(f"/v2/jobs/{running['jobKey']}")).json()
    assert (job["state"], job["deadline"]) == ("CANCELED", None)
    h = await _history(c, running["jobKey"])
    assert _entries(h) == [("created", 0, None), ("activated", 1, "w"), ("canceled", 1, "w")]
    [key] = await enqueue(c, "cc", "other", 1)
    assert (await c.post(f"/v2/jobs/{key}/cancel")).status_code == 204
    assert _entries(await _history(c, key)) == [("created", 0, None), ("canceled", 0, None)]


async def test_cancel_of_a_streamed_job_gives_the_stream_its_credit_back(live):
    from tests.acceptance.test_streams import Events

    c = live.client
    keys = await enqueue(c, "sc", "acme", 2)
    url = "/v2/jobs/stream?type=sc&maxJobs=1&timeout=60000&worker=s"
    async with c.stream("GET", url) as r:
        events = Events(r)
        first = await events.next_job()
        assert first["jobKey"] == keys[0]
        assert (await c.post(f"/v2/jobs/{first['jobKey']}/cancel")).status_code == 204
        second = await events.next_job()
        assert second["jobKey"] == keys[1]
        events.reader.cancel()


async def _states(live) -> dict[str, int]:
    rows = await live.services.db.fetch("SELECT state, count(*) AS n FROM jobs GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


async def test_bulk_retry_revives_failed_jobs_matching_its_filters(live):
    c = live.client
    await make_world(live)
    before = await _states(live)
    # A dry run counts, up to its limit, and changes nothing.
    dry = {"dryRun": True}
    assert (await c.post("/v2/jobs/retry", json=dry)).json() == {"count": 9, "more": False}
    r = await c.post("/v2/jobs/retry", json=dry | {"limit": 4})
    assert r.json() == {"count": 4, "more": True}
    r = await c.post("/v2/jobs/retry", json=dry | {"tenantId": "acme", "type": "pdf"})
    assert r.json() == {"count": 1, "more": False}
    assert (await c.post("/v2/jobs/retry", json={"dryRun": "yes"})).status_code == 400
    assert await _states(live) == before
    r = await c.post("/v2/jobs/retry", json={"tenantId": "acme", "type": "pdf", "retries": 4})
    assert r.json() == {"count": 1, "more": False}
    pdf = await list_all(c, {"tenantId": "acme", "type": "pdf", "state": "CREATED"})
    revived = [j for j in pdf if j["errorMessage"] == "boom"]
    assert len(revived) == 1 and revived[0]["retries"] == 4
    h = await _history(c, revived[0]["jobKey"])
    assert h["items"][-1]["event"] == "revived" and h["items"][-1]["retries"] == 4
    # The revived job is ready again, in its lane.
    got = await activate(c, "pdf", 10, tenantIds=["acme"])
    assert revived[0]["jobKey"] in {j["jobKey"] for j in got}
    # A limit: one at a time, "more" while others match.
    assert (await c.post("/v2/jobs/retry", json={"limit": 1})).json() == {"count": 1, "more": True}
    r = await c.post("/v2/jobs/retry", json={"createdBefore": utcnow().isoformat()})
    assert r.json() == {"count": 7, "more": False}
    assert (await c.post("/v2/jobs/retry", json={})).json() == {"count": 0, "more": False}
    after = await _states(live)
    assert after.get("FAILED", 0) == 0 and before["FAILED"] == 9


async def test_bulk_cancel_cancels_a_tenants_created_jobs_delayed_ones_too(live):
    c = live.client
    await make_world(live)
    r = await c.post("/v2/jobs/cancel", json={"tenantId": "globex", "type": "sms"})
    assert r.json() == {"count": 2, "more": False}  # one ready, one delayed
    r = await c.post("/v2/jobs/cancel", json={"tenantId": "acme", "limit": 2})
    assert r.json() == {"count": 2, "more": True}
    r = await c.post("/v2/jobs/cancel", json={"tenantId": "acme"})
    assert r.json() == {"count": 4, "more": False}
    left = await list_all(c, {"state": "CREATED"})
    assert sorted({j["tenantId"] for j in left}) == ["globex", "initech"] and len(left) == 10
    # ACTIVATED jobs are not the bulk cancel's: they keep running.
    assert len(await list_all(c, {"tenantId": "acme", "state": "ACTIVATED"})) == 6
    canceled = await list_all(c, {"tenantId": "acme", "state": "CANCELED"})
    h = await _history(c, canceled[0]["jobKey"])
    assert h["items"][-1]["event"] == "canceled"
    # Emptied lanes are parked: nothing ready is left for acme.
    assert await activate(c, "mail", 10, tenantIds=["acme"]) == []


async def test_bad_bulk_requests_are_refused_and_change_nothing(live):
    c = live.client
    await make_world(live)
    before = await _states(live)
    for path, body in (
        ("/v2/jobs/retry", {"retries": 0}),
        ("/v2/jobs/retry", {"limit": 100_001}),
        ("/v2/jobs/retry", {"limit": 0}),
        ("/v2/jobs/retry", {"tenantId": "bad tenant"}),
        ("/v2/jobs/retry", {"createdAfter": "2026-02-30T00:00:00Z"}),
        ("/v2/jobs/retry", {"state": "FAILED"}),
        ("/v2/jobs/retry", {"type": "a\u0000"}),
        ("/v2/jobs/cancel", {}),
        ("/v2/jobs/cancel", {"type": "mail"}),
        ("/v2/jobs/cancel", {"tenantId": "acme", "limit": "10"}),
        ("/v2/jobs/cancel", {"tenantId": "acme", "state": "ACTIVATED"}),
    ):
        assert_problem(await c.post(path, json=body), 400)
    assert_problem(await c.post("/v2/jobs/retry", content=b"{"), 400)
    assert_problem(await c.post("/v2/jobs/cancel", content=b"[]"), 400)
    assert await _states(live) == before


async def test_workers_seen_by_type_with_when_each_last_asked_and_got_jobs(live):
    c = live.client
    await enqueue(c, "ws", "acme", 1)
    await activate(c, "ws", worker="w-busy")
    await activate(c, "ws", worker="w-idle")  # nothing left: seen, never activated
    await activate(c, "other", worker="w-busy")
    await activate(c, "ws")  # no worker name: not a worker seen
    r = await c.get("/v2/workers", params={"type": "ws"})
    items = r.json()["items"]
    assert [(i["type"], i["worker"]) for i in items] == [("ws", "w-idle"), ("ws", "w-busy")]
    busy, idle = items[1], items[0]
    assert busy["lastActivatedAt"] is not None and idle["lastActivatedAt"] is None
    assert idle["lastSeenAt"] >= busy["lastSeenAt"]
    every = (await c.get("/v2/workers")).json()["items"]
    assert [(i["type"], i["worker"]) for i in every] == [
        ("other", "w-busy"),
        ("ws", "w-idle"),
        ("ws", "w-busy"),
    ]
    assert_problem(await c.get("/v2/workers", params={"type": "bad type"}), 400)
    assert_problem(await c.get("/v2/workers", params={"worker": "w"}), 400)


async def test_a_tenant_or_job_type_never_configured_says_so(live):
    c = live.client
    nobody = (await c.get("/v2/tenants/nobody")).json()
    assert nobody == {
        "tenantId": "nobody",
        "weight": 1,
        "maxActiveJobs": None,
        "minActiveJobs": None,
        "rateLimit": None,
        "paused": False,
        "configured": False,
    }
    await c.put("/v2/tenants/nobody", json={})
    assert (await c.get("/v2/tenants/nobody")).json()["configured"] is True
    assert (await c.get("/v2/job-types/none")).json()["configured"] is False
    await c.put("/v2/job-types/none", json={})
    assert (await c.get("/v2/job-types/none")).json()["configured"] is True
    assert [t["configured"] for t in (await c.get("/v2/tenants")).json()["tenants"]] == [True]
