"""ADR 012: a job created while a request waits for its type is claimed for that request
in the transaction that creates it (a hand-off), unless the scheduler says otherwise."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.activation import ActivateRequest
from app.config import Settings
from app.db.listen import NOTIFY_CHANNEL
from app.domain import utcnow
from tests.acceptance.test_long_polling import POLL, metric, until_waiting
from tests.acceptance.test_streams import Events
from tests.fixtures import quiet_settings
from tests.helpers import activate, complete


@pytest.fixture
def settings() -> Settings:
    # No backup poll during a test: a dispatcher woken by its timer is busy for a moment,
    # and a create meanwhile goes the NOTIFY way (correct, but not what is tested here).
    return quiet_settings(backup_poll_ms=3_600_000)


class Announcements:
    """The ``jobfair`` notifications of one job type, as a listener sees them."""

    def __init__(self, conn: asyncpg.Connection, job_type: str) -> None:
        self.conn = conn
        self.job_type = job_type
        self.seen: list[str] = []
        self.arrived = asyncio.Event()

    @classmethod
    async def listen(cls, db_url: str, job_type: str) -> Announcements:
        a = cls(await asyncpg.connect(db_url), job_type)
        await a.conn.add_listener(NOTIFY_CHANNEL, a._on)
        return a

    def _on(self, conn: object, pid: int, channel: str, payload: str) -> None:
        if payload.partition(" ")[0] == self.job_type:
            self.seen.append(payload)
            self.arrived.set()

    async def until(self, payload: str) -> None:
        while payload not in self.seen:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)

    async def close(self) -> None:
        await self.conn.close()


async def test_a_job_created_for_a_waiting_poll_is_claimed_as_it_is_created(live, db_url):
    c = live.client
    heard = await Announcements.listen(db_url, "lp")
    poll = asyncio.create_task(c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 10_000}))
    await until_waiting(c, 1)
    hand_offs = await metric(c, "jobfair_activation_hand_offs_total")
    wakes = await metric(c, "jobfair_wake_queries_total")
    r = await c.post("/v2/jobs", json={"type": "lp", "tenantId": "acme"})
    assert r.status_code == 201
    created = r.json()
    # Already activated when its producer is answered.
    assert created["state"] == "ACTIVATED" and created["activationCount"] == 1
    [job] = (await poll).json()["jobs"]
    assert job["jobKey"] == created["jobKey"] and job["activationCount"] == 1
    assert await metric(c, "jobfair_activation_hand_offs_total") - hand_offs == 1
    assert await metric(c, "jobfair_wake_queries_total") - wakes == 0  # no dispatcher round
    # Nobody was woken for it: notifications come in commit order, so the first one
    # heard after it is the next create's.
    await c.post("/v2/jobs/batch", json={"jobs": [{"type": "lp"}, {"type": "lp"}]})
    await heard.until("lp 2")
    assert heard.seen == ["lp 2"]
    await heard.close()
    # The lane was charged for it as for any activation.
    lanes = await live.services.db.fetch(
        "SELECT tenant_id, activated_total FROM lanes WHERE job_type = 'lp'"
    )
    assert {r["tenant_id"]: r["activated_total"] for r in lanes}["acme"] == 1


async def test_a_stream_is_handed_the_job_created_while_it_waits(live):
    c = live.client
    async with c.stream("GET", "/v2/jobs/stream?type=hs&maxJobs=1&timeout=60000") as r:
        events = Events(r)
        await until_waiting(c, 1)
        hand_offs = await metric(c, "jobfair_activation_hand_offs_total")
        created = (await c.post("/v2/jobs", json={"type": "hs"})).json()
        job = await events.next_job()
        assert job["jobKey"] == created["jobKey"]
        assert await metric(c, "jobfair_activation_hand_offs_total") - hand_offs == 1
        # The stream's credit came back with the completion, as for any of its jobs.
        assert (await complete(c, job)).status_code == 204
        await until_waiting(c, 1)
        second = (await c.post("/v2/jobs", json={"type": "hs"})).json()
        assert (await events.next_job())["jobKey"] == second["jobKey"]


async def test_at_a_cap_the_tenant_with_room_is_handed_the_job(live, db_url):
    """The capped tenant's lane is held out of the reads (ADR 016): a job of a tenant
    with room goes to the waiter at once, and the capped tenant's job waits for its
    capacity."""
    c = live.client
    assert (await c.put("/v2/tenants/busy", json={"maxActiveJobs": 1})).status_code in (200, 201)
    await c.post("/v2/jobs", json={"type": "cap", "tenantId": "busy"})
    waiting = (await c.post("/v2/jobs", json={"type": "cap", "tenantId": "busy"})).json()
    [held] = await activate(c, "cap")
    # The waiter finds only the capped tenant's job, and waits.
    poll = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**POLL, "type": "cap", "requestTimeout": 10_000})
    )
    await until_waiting(c, 1)
    hand_offs = await metric(c, "jobfair_activation_hand_offs_total")
    created = (await c.post("/v2/jobs", json={"type": "cap", "tenantId": "free"})).json()
    assert created["state"] == "ACTIVATED"
    [job] = (await poll).json()["jobs"]
    assert job["jobKey"] == created["jobKey"]
    assert await metric(c, "jobfair_activation_hand_offs_total") - hand_offs == 1
    # Capacity freed: the capped tenant's lane is released, and a waiter woken for it.
    heard = await Announcements.listen(db_url, "cap")
    poll = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**POLL, "type": "cap", "requestTimeout": 10_000})
    )
    await until_waiting(c, 1)
    assert (await complete(c, held)).status_code == 204
    await heard.until("cap")
    [job] = (await poll).json()["jobs"]
    assert job["jobKey"] == waiting["jobKey"]
    await heard.close()


async def test_a_waiter_whose_filter_refuses_the_job_is_passed_over(live):
    c = live.client
    only_x = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**POLL, "tenantIds": ["x"], "requestTimeout": 1_500})
    )
    await until_waiting(c, 1)
    anyone = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**POLL, "worker": "any", "requestTimeout": 10_000})
    )
    await until_waiting(c, 2)
    created = (await c.post("/v2/jobs", json={"type": "lp", "tenantId": "y"})).json()
    [job] = (await anyone).json()["jobs"]
    assert job["jobKey"] == created["jobKey"] and job["worker"] == "any"
    assert (await only_x).json() == {"jobs": []}


async def test_a_job_claimed_for_a_waiter_that_left_is_given_back_at_once(live):
    services = live.services
    assert await activate(live.client, "gone") == []  # the type is known dry: no wake-up
    waiter = services.activation.waiters.enqueue(ActivateRequest("gone", 1, 60_000, "w"))
    assert services.activation.waiters.take_head("gone", "acme") is waiter
    waiter.future.cancel()  # the client left while the create was claiming for it
    job = {"type": "gone", "tenantId": "acme"}
    inserted = await services.activation._hand_to(waiter, job, utcnow())
    job = (await live.client.get(f"/v2/jobs/{inserted.job_key}")).json()
    assert job["state"] == "CREATED" and job["activationCount"] == 1
    [again] = await activate(live.client, "gone")
    assert again["jobKey"] == str(inserted.job_key) and again["activationCount"] == 2
