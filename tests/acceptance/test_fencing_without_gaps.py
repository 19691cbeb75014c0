"""Fencing without gaps (issue 19 §4): a job is finished at most once however its
completions arrive, an unfenced heartbeat never cuts someone else's lease, and an
activated record says the priority its pick used."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.helpers import activate, complete, enqueue


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
