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
