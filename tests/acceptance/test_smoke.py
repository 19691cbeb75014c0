"""The README's walk-through: create, activate, complete."""

from __future__ import annotations

from tests.helpers import activate, complete


async def test_create_activate_complete(live):
    c = live.client
    r = await c.post(
        "/v2/jobs",
        json={"type": "send-email", "tenantId": "acme", "variables": {"to": "a@example.com"}},
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "CREATED" and job["activationCount"] == 0
    assert job["priority"] == 50 and job["retries"] == 3
    [active] = await activate(c, "send-email", 10, worker="w1")
    assert active["jobKey"] == job["jobKey"]
    assert active["state"] == "ACTIVATED" and active["activationCount"] == 1
    assert active["worker"] == "w1" and active["deadline"] is not None
    r = await complete(c, active, variables={"sent": True})
    assert r.status_code == 204, r.text
    done = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert done["state"] == "COMPLETED"
    assert done["variables"] == {"to": "a@example.com", "sent": True}
    assert done["completedAt"] is not None and done["deadline"] is None


async def test_a_create_answers_the_record_a_read_gives(live):
    """POST /v2/jobs answers from its insert (one statement, ready or for later, with
    its type's aging settings); a read of the job must give the same record."""
    c = live.client
    r = await c.put("/v2/job-types/aged", json={"agingIntervalMs": 60_000, "agingStep": 7})
    assert r.status_code in (200, 204), r.text
    bodies = [
        {"type": "aged", "tenantId": "acme", "priority": 12, "retries": 9,
         "variables": {"big": 18446744073709551615, "s": "é\u2028"},
         "customHeaders": {"h": [1, None]}},
        {"type": "aged", "delay": 60_000},
        {"type": "plain", "runAt": "2030-01-01T00:00:00Z", "tenantId": "t"},
        {"type": "plain"},
    ]  # fmt: skip
    for body in bodies:
        r = await c.post("/v2/jobs", json=body)
        assert r.status_code == 201, r.text
        created = r.json()
        read = (await c.get(f"/v2/jobs/{created['jobKey']}")).json()
        assert created == read
