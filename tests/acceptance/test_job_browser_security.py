"""The job browser's routes under API keys: a scoped key lists and reads only its own
tenants' and types' jobs, and only an admin retries, cancels or pauses in bulk."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.keys import Role
from tests.fixtures import quiet_settings
from tests.helpers import assert_problem


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(auth="required")


async def _keys(live) -> dict[str, dict[str, str]]:
    keys = live.services.keys
    headers = {}
    for name, role, tenants, types in (
        ("admin", Role.ADMIN, None, None),
        ("worker", Role.WORKER, ["a"], ["t"]),
        ("producer", Role.PRODUCER, ["a"], None),
    ):
        _, token = await keys.create(role, tenants, types, name, None, "test")
        headers[name] = {"Authorization": f"Bearer {token}"}
    return headers


async def test_a_scoped_key_lists_and_reads_only_its_own_jobs(live):
    c = live.client
    h = await _keys(live)
    made = {}
    for tenant, job_type in (("a", "t"), ("b", "t"), ("a", "u")):
        jobs = [{"type": job_type, "tenantId": tenant, "variables": {"who": tenant + job_type}}]
        r = await c.post("/v2/jobs/batch", json={"jobs": jobs * 3}, headers=h["admin"])
        made[(tenant, job_type)] = r.json()["jobKeys"]
    everything = (await c.get("/v2/jobs", headers=h["admin"])).json()["items"]
    assert len(everything) == 9
    mine = (await c.get("/v2/jobs", headers=h["worker"])).json()
    assert sorted(j["jobKey"] for j in mine["items"]) == sorted(made[("a", "t")])
    for params in ({"tenantId": "b"}, {"type": "u"}, {"tenantId": "b", "type": "t"}):
        r = await c.get("/v2/jobs", params=params, headers=h["worker"])
        assert r.status_code == 200 and r.json() == {"items": [], "nextCursor": None}
    producer = (await c.get("/v2/jobs", headers=h["producer"])).json()["items"]
    assert {j["tenantId"] for j in producer} == {"a"} and len(producer) == 6
    # An admin's cursor in a scoped key's hands pages on within that key's scope.
    r = await c.get("/v2/jobs", params={"limit": 1}, headers=h["admin"])
    cursor = r.json()["nextCursor"]
    r = await c.get("/v2/jobs", params={"cursor": cursor}, headers=h["worker"])
    assert {j["tenantId"] + j["type"] for j in r.json()["items"]} <= {"at"}
    # History: another scope's job is a job that does not exist.
    ok = await c.get(f"/v2/jobs/{made[('a', 't')][0]}/history", headers=h["worker"])
    assert ok.status_code == 200
    for key in (made[("b", "t")][0], made[("a", "u")][0]):
        assert_problem(await c.get(f"/v2/jobs/{key}/history", headers=h["worker"]), 404)
    assert_problem(await c.get(f"/v2/jobs/{made[('a', 't')][0]}/history"), 401)


async def test_only_an_admin_retries_cancels_pauses_in_bulk_or_lists_workers(live):
    c = live.client
    h = await _keys(live)
    for who in ("worker", "producer"):
        for method, path, body in (
            ("POST", "/v2/jobs/retry", {}),
            ("POST", "/v2/jobs/cancel", {"tenantId": "a"}),
            ("POST", "/v2/tenants/a/pause", None),
            ("POST", "/v2/tenants/a/resume", None),
            ("POST", "/v2/job-types/t/pause", None),
            ("POST", "/v2/job-types/t/resume", None),
            ("GET", "/v2/workers", None),
        ):
            r = await c.request(method, path, json=body, headers=h[who])
            assert_problem(r, 403)
    assert (await c.get("/v2/tenants/a", headers=h["admin"])).json()["paused"] is False
    r = await c.post("/v2/jobs/cancel", json={"tenantId": "a"}, headers=h["admin"])
    assert r.json() == {"count": 0, "more": False}
