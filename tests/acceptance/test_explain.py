"""GET /v2/jobs/{jobKey}/explain on real PostgreSQL: each situation that keeps a job from
running is built and the explanation names it with its figures; and a job the
explanation calls next in its lane is the one the next activation of the lane takes."""

from __future__ import annotations

import asyncio
import random
import sys
from datetime import datetime

import httpx

from tests.fixtures import wait_ready
from tests.helpers import activate, assert_problem, complete, enqueue


async def explain(c, key: str) -> dict:  # type: ignore[no-untyped-def]
    r = await c.get(f"/v2/jobs/{key}/explain")
    assert r.status_code == 200, r.text
    return r.json()


def reasons(e: dict) -> dict[str, dict]:
    return {r["reason"]: r for r in e["reasons"]}


async def test_a_lone_ready_job_is_next_and_says_nobody_is_asking(live):
    c = live.client
    [key] = await enqueue(c, "mail", "acme", 1)
    e = await explain(c, key)
    assert (e["state"], e["activatableNow"], e["nextInLane"]) == ("CREATED", True, True)
    assert list(reasons(e)) == ["nobodyAsking"] and e["demand"]["lastAskedAt"] is None
    assert e["queue"]["aheadInKey"] == 0 and e["queue"]["readyInLane"] == 1
    assert e["estimatedStartAt"] == e["at"]  # nothing ahead, nothing holds it
    # A named worker asked (and was seen): somebody is asking now.
    await enqueue(c, "mail", "other", 1)
    await activate(c, "mail", 1, worker="mailer-1", tenantIds=["other"])
    await live.services.workers.flush()
    e = await explain(c, key)
    assert "nobodyAsking" not in reasons(e) and e["demand"]["lastAskedAt"] is not None


async def test_delays_name_their_cause_and_instant(live):
    c = live.client
    [later] = await enqueue(c, "mail", "acme", 1, runAt="2099-01-01T00:00:00Z")
    e = await explain(c, later)
    assert reasons(e)["delayed"]["by"] == "runAt"
    assert datetime.fromisoformat(reasons(e)["delayed"]["until"]).year == 2099
    assert e["activatableNow"] is False and e["estimatedStartAt"] is None
    [retried] = await enqueue(c, "pdf", "acme", 1)
    [job] = await activate(c, "pdf", 1)
    body = {"activationCount": job["activationCount"], "retries": 2, "retryBackOff": 600_000}
    assert (await c.post(f"/v2/jobs/{retried}/fail", json=body)).status_code == 204
    d = reasons(await explain(c, retried))["delayed"]
    assert d["by"] == "retryBackOff"


async def test_pauses_caps_and_rate_limits_hold_with_their_figures(live):
    c = live.client
    await c.put("/v2/tenants/capped", json={"maxActiveJobs": 1})
    await c.put("/v2/tenants/limited", json={"rateLimit": {"perSecond": 0.01, "burst": 1}})
    await c.put("/v2/job-types/narrow", json={"maxActiveJobs": 2})
    [_, capped] = await enqueue(c, "work", "capped", 2)
    [_, limited] = await enqueue(c, "work", "limited", 2)
    [paused] = await enqueue(c, "work", "sleepy", 1)
    await c.post("/v2/tenants/sleepy/pause")
    got = await activate(c, "work", 10)
    assert {j["tenantId"] for j in got} == {"capped", "limited"}
    e = await explain(c, capped)
    assert reasons(e)["tenantCap"] == {"reason": "tenantCap", "active": 1, "limit": 1}
    assert e["activatableNow"] is False and e["nextInLane"] is False
    assert e["estimatedStartAt"] is None
    rate = reasons(await explain(c, limited))["tenantRate"]
    wait_s = datetime.fromisoformat(rate["nextTokenAt"]) - datetime.fromisoformat(e["at"])
    assert 60 < wait_s.total_seconds() <= 100  # one token a hundred seconds
    assert "tenantPaused" in reasons(await explain(c, paused))
    [a, b, waiting] = await enqueue(c, "narrow", "x", 3)
    assert len(await activate(c, "narrow", 5)) == 2
    t = reasons(await explain(c, waiting))["typeCap"]
    assert (t["active"], t["limit"]) == (2, 2)
    await c.post("/v2/job-types/narrow/pause")
    assert "typePaused" in reasons(await explain(c, waiting))


async def test_the_queue_ahead_by_effective_priority_and_the_keys_turn(live):
    c = live.client
    keys = await enqueue(c, "img", "acme", 3, fairnessKey="k1")
    [urgent] = await enqueue(c, "img", "acme", 1, fairnessKey="k1", priority=90)
    e = await explain(c, keys[2])
    assert reasons(e)["behindInKey"]["ahead"] == 3  # the urgent one, then the two before
    assert e["priority"]["effective"] == 50 and "topAt" in e["priority"]
    assert (await explain(c, urgent))["nextInLane"] is True
    # Another key of the lane: it enters at k1's virtual time (a tie: k1 first, by
    # name); once k1 is served again, k2's turn comes first.
    settle = live.services.activation.settle  # an activation's charges, written after it
    [job] = await activate(c, "img", 1)
    assert job["jobKey"] == urgent
    await settle()
    [other] = await enqueue(c, "img", "acme", 1, fairnessKey="k2")
    assert (await explain(c, keys[0]))["nextInLane"] is True
    [job] = await activate(c, "img", 1)
    assert job["jobKey"] == keys[0]
    await settle()
    e = await explain(c, keys[1])
    assert e["queue"]["keysBacklogged"] == 2
    assert reasons(e)["otherKeysFirst"]["nextKey"] == "k2"
    assert (await explain(c, other))["nextInLane"] is True


async def test_activated_and_finished_jobs_say_who_holds_them_or_what_ended_them(live):
    c = live.client
    keys = await enqueue(c, "doc", "acme", 4)
    jobs = await activate(c, "doc", 4, worker="w-1", lease_ms=30_000)
    by_key = {j["jobKey"]: j for j in jobs}
    a = reasons(await explain(c, keys[0]))["activated"]
    assert a["worker"] == "w-1" and a["leaseUntil"] is not None and a["activationCount"] == 1
    j1, j2, j3 = (by_key[k] for k in keys[1:])
    await complete(c, j1)
    fail = {"activationCount": j2["activationCount"], "retries": 0, "errorMessage": "disk"}
    await c.post(f"/v2/jobs/{keys[2]}/fail", json=fail)
    error = {"activationCount": j3["activationCount"], "errorCode": "NO", "errorMessage": "x"}
    await c.post(f"/v2/jobs/{keys[3]}/error", json=error)
    assert list(reasons(await explain(c, keys[1]))) == ["completed"]
    failed = reasons(await explain(c, keys[2]))["failed"]
    assert failed["errorMessage"] == "disk" and "retry" in failed["revivedBy"]
    thrown = reasons(await explain(c, keys[3]))["errorThrown"]
    assert (thrown["errorCode"], thrown["revivedBy"]) == ("NO", None)
    assert_problem(await c.get("/v2/jobs/999999999/explain"), 404)
    assert_problem(await c.get("/v2/jobs/nope/explain"), 400)


async def test_the_job_called_next_in_its_lane_is_the_one_its_next_activation_takes(live):
    """Generated lanes (keys, weights, priorities; uncapped, unpaused), drained one
    activation at a time: before each, exactly one ready job of the lane says it is next,
    and the activation takes it."""
    c = live.client
    rng = random.Random(40)
    for world in range(4):
        tenant = f"t{world}"
        for key in ("a", "b", "c")[: rng.randint(1, 3)]:
            if rng.random() < 0.5:
                await c.put(f"/v2/tenants/{tenant}/keys/{key}", json={"weight": rng.randint(1, 4)})
        ready = []
        for _ in range(rng.randint(3, 8)):
            key = rng.choice("abc")
            ready += await enqueue(
                c, "gen", tenant, 1, fairnessKey=key, priority=rng.choice([0, 50, 50, 90])
            )
        while ready:
            nexts = [k for k in ready if (await explain(c, k))["nextInLane"]]
            assert len(nexts) == 1, (world, nexts)
            [job] = await activate(c, "gen", 1, tenantIds=[tenant])
            assert job["jobKey"] == nexts[0], (world, job, nexts)
            ready.remove(job["jobKey"])
            # Its charges are written just after it: the next explanation reads the lane
            # as the next activation will, once they are.
            await live.services.activation.settle()


async def test_jobfair_jobs_why_prints_the_reasons_with_their_figures(live):
    c = live.client
    await c.put("/v2/tenants/capped", json={"maxActiveJobs": 1, "weight": 2})
    [_, waiting] = await enqueue(c, "work", "capped", 2)
    await activate(c, "work", 1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "app.cli", "jobs", "why", waiting, "--url", live.url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert f"job {waiting}: CREATED · type work · tenant capped" in text
    assert "activatable now: no" in text
    assert "  - held by its tenant's cap: 1 of 1 active" in text
    assert "its lane: weight 2" in text
    assert "estimated start: cannot be estimated" in text
    missing = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "app.cli", "jobs", "why", "123456789", "--url", live.url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await missing.communicate()
    assert missing.returncode != 0 and b"does not exist" in err


async def test_two_server_processes_explain_alike(spawn_server):
    """``--workers 2``: explanations asked over many connections (spread by the kernel
    over both processes) name the same hold with the same figures, and agree once it is
    gone; the decision is the database's state, not a process's."""
    server = spawn_server("--workers", "2")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await wait_ready(c, server)
        await c.put("/v2/tenants/capped", json={"maxActiveJobs": 1})
        [_, waiting] = await enqueue(c, "two", "capped", 2)
        [job] = await activate(c, "two", 1)

        async def asked() -> dict:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as own:
                return await explain(own, waiting)

        held = await asyncio.gather(*(asked() for _ in range(12)))
        assert all(
            reasons(e)["tenantCap"] == {"reason": "tenantCap", "active": 1, "limit": 1}
            and e["activatableNow"] is False
            for e in held
        )
        assert (await complete(c, job)).status_code == 204
        free = await asyncio.gather(*(asked() for _ in range(12)))
        assert all("tenantCap" not in reasons(e) and e["nextInLane"] is True for e in free), [
            e["reasons"] for e in free
        ]


async def test_what_a_probe_found_reads_right(live):
    """Past the calendar's end: no 500, the instants null.  A worker that just asked
    here is seen at once.  The head of a key whose turn is not now is not estimated to
    start now.  A cap lowered below what is active shows what is."""
    c = live.client
    await c.put("/v2/job-types/ov", json={"agingIntervalMs": 2147483647, "agingStep": 1})
    far = (await c.post("/v2/jobs", json={"type": "ov", "runAt": "9999-12-30T00:00:00Z"})).json()
    e = await explain(c, far["jobKey"])
    assert e["priority"]["topAt"] is None and reasons(e)["delayed"]["by"] == "runAt"
    [a, b] = await enqueue(c, "asked", "acme", 2)
    await activate(c, "asked", 1, worker="named")
    assert "nobodyAsking" not in reasons(await explain(c, b))
    await enqueue(c, "turns", "acme", 2, fairnessKey="a")
    await enqueue(c, "turns", "acme", 2, fairnessKey="b")
    [first] = await activate(c, "turns", 1)
    await live.services.activation.settle()
    ready = [
        j
        for j in (await c.get("/v2/jobs", params={"type": "turns", "state": "CREATED"})).json()[
            "items"
        ]
    ]
    for j in ready:
        e = await explain(c, j["jobKey"])
        if e["estimatedStartAt"] == e["at"]:
            assert e["nextInLane"], e
    await enqueue(c, "many", "lowered", 3)
    await activate(c, "many", 3)
    await c.put("/v2/tenants/lowered", json={"maxActiveJobs": 1})
    [waiting] = await enqueue(c, "many", "lowered", 1)
    assert reasons(await explain(c, waiting))["tenantCap"] == {
        "reason": "tenantCap",
        "active": 3,
        "limit": 1,
    }
    assert first["tenantId"] == "acme"
