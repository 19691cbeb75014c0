"""API.md "Camunda-compatible surface" over HTTP: shapes, strict bodies and fencing.

The proof with Camunda's own SDKs is in test_camunda_sdk.py; these tests hold what
API.md fixes for each route, including the two routes shared with the native surface
(``/error`` and ``PATCH``), which take ``activationCount`` or ``jobLeaseToken`` or neither."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from app.domain import utcnow
from tests.helpers import assert_problem, enqueue

ACTIVATION = {"type": "cam", "maxJobsToActivate": 5, "timeout": 60_000, "requestTimeout": -1}
REQUIRED = {
    "jobKey": str,
    "type": str,
    "worker": str,
    "retries": int,
    "deadline": int,
    "variables": dict,
    "customHeaders": dict,
    "tenantId": str,
    "kind": str,
    "listenerEventType": str,
    "processDefinitionId": str,
    "processDefinitionVersion": int,
    "processDefinitionKey": str,
    "processInstanceKey": str,
    "elementId": str,
    "elementInstanceKey": str,
    "userTask": type(None),
    "tags": list,
    "rootProcessInstanceKey": type(None),
    "priority": int,
    "physicalTenantId": str,
    "businessId": type(None),
    "jobLeaseToken": str,
}


async def _activate(c, **fields):
    r = await c.post("/v2/jobs/activation", json={**ACTIVATION, **fields})
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


async def test_activated_jobs_carry_every_field_strict_clients_require(live):
    c = live.client
    await c.post(
        "/v2/jobs",
        json={
            "type": "cam",
            "tenantId": "acme",
            "variables": {"a": 1, "b": 2},
            "customHeaders": {"h": "x"},
        },
    )
    before = datetime.now(UTC)
    [job] = await _activate(c, worker="w1", fetchVariable=["a"], withLease=True)
    for name, kind in REQUIRED.items():
        assert isinstance(job[name], kind), (name, job[name])
    assert job["kind"] == "BPMN_ELEMENT" and job["listenerEventType"] == "UNSPECIFIED"
    assert job["worker"] == "w1" and job["tenantId"] == "acme" and job["retries"] == 3
    assert job["variables"] == {"a": 1} and job["customHeaders"] == {"h": "x"}
    assert job["elementId"] == "cam" and job["processDefinitionVersion"] == -1
    deadline = datetime.fromtimestamp(job["deadline"] / 1000, UTC)
    assert before + timedelta(seconds=55) < deadline < before + timedelta(seconds=65)


async def test_completion_is_fenced_by_the_lease_token(live):
    c = live.client
    await enqueue(c, "cam", "acme", 1)
    [first] = await _activate(c, timeout=1)
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    [second] = await _activate(c)
    assert second["jobKey"] == first["jobKey"]
    assert second["jobLeaseToken"] != first["jobLeaseToken"]
    key = first["jobKey"]
    stale = await c.post(
        f"/v2/jobs/{key}/completion",
        json={"jobLeaseToken": first["jobLeaseToken"], "variables": {"x": 1}},
    )
    assert_problem(stale, 409, "INVALID_STATE")
    ok = await c.post(
        f"/v2/jobs/{key}/completion",
        json={"jobLeaseToken": second["jobLeaseToken"], "variables": {"x": 2}},
    )
    assert ok.status_code == 204, ok.text
    again = await c.post(
        f"/v2/jobs/{key}/completion", json={"jobLeaseToken": second["jobLeaseToken"]}
    )
    assert_problem(again, 409, "INVALID_STATE")
    done = (await c.get(f"/v2/jobs/{key}")).json()
    assert done["state"] == "COMPLETED" and done["variables"] == {"x": 2}


async def test_without_a_token_only_an_activated_job_can_be_finished(live):
    c = live.client
    [key] = await enqueue(c, "cam", "acme", 1)
    assert_problem(await c.post(f"/v2/jobs/{key}/completion", json={}), 409, "INVALID_STATE")
    await _activate(c)
    assert (await c.post(f"/v2/jobs/{key}/completion", json={})).status_code == 204
    assert_problem(await c.post(f"/v2/jobs/{key}/completion", json={}), 409, "INVALID_STATE")
    assert_problem(await c.post("/v2/jobs/4242/completion", json={}), 404, "NOT_FOUND")
    # The body is optional, as in Camunda.
    [other] = await enqueue(c, "cam", "acme", 1)
    await _activate(c)
    assert (await c.post(f"/v2/jobs/{other}/completion")).status_code == 204
    assert_problem(await c.post(f"/v2/jobs/{other}/completion"), 409, "INVALID_STATE")


async def test_a_completion_with_an_empty_body_needs_no_fence(live):
    """Camunda's guarantee, kept: with no body (no token), a completion succeeds only
    while the job is ACTIVATED -- not while its lease has lapsed (CREATED), not twice."""
    c = live.client
    [key] = await enqueue(c, "cam", "acme", 1)
    await _activate(c, timeout=1)
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    assert_problem(await c.post(f"/v2/jobs/{key}/completion"), 409, "INVALID_STATE")
    await _activate(c)
    assert (await c.post(f"/v2/jobs/{key}/completion")).status_code == 204
    assert_problem(await c.post(f"/v2/jobs/{key}/completion"), 409, "INVALID_STATE")
    job = (await c.get(f"/v2/jobs/{key}")).json()
    assert job["state"] == "COMPLETED" and job["activationCount"] == 2


async def test_a_client_that_sends_its_lease_token_is_fenced_on_every_route(live):
    """A worker that activated withLease and sends its token back is held to it wherever
    it sends it: a stale token is 409 on completion (whatever else the body carries),
    failure, error and PATCH, and changes nothing; native routes, which take no token,
    refuse one (400) rather than ignore it."""
    c = live.client
    keys = await enqueue(c, "cam", "acme", 4)
    stale = {j["jobKey"]: j["jobLeaseToken"] for j in await _activate(c, timeout=1, withLease=True)}
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    current = {j["jobKey"]: j["jobLeaseToken"] for j in await _activate(c, withLease=True)}
    assert set(stale) == set(current) == set(keys)
    a, b, d, e = keys
    calls = [
        ("POST", f"/v2/jobs/{a}/completion", {}),
        ("POST", f"/v2/jobs/{a}/completion", {"variables": {"x": 1}, "result": {}}),
        ("POST", f"/v2/jobs/{b}/failure", {"retries": 1, "errorMessage": "late"}),
        ("POST", f"/v2/jobs/{d}/error", {"errorCode": "LATE"}),
        ("PATCH", f"/v2/jobs/{e}", {"changeset": {"retries": 9, "timeout": 600_000}}),
    ]
    before = {k: (await c.get(f"/v2/jobs/{k}")).json() for k in keys}
    for method, path, body in calls:
        key = path.split("/")[3]
        r = await c.request(method, path, json={**body, "jobLeaseToken": stale[key]})
        assert_problem(r, 409, "INVALID_STATE")
    for key in keys:
        assert (await c.get(f"/v2/jobs/{key}")).json() == before[key]
    for path, body in [
        (f"/v2/jobs/{a}/complete", {"activationCount": 2}),
        (f"/v2/jobs/{b}/fail", {"activationCount": 2}),
    ]:
        r = await c.post(path, json={**body, "jobLeaseToken": current[path.split("/")[3]]})
        assert_problem(r, 400, "INVALID_ARGUMENT")
    for method, path, body in calls[1:]:
        key = path.split("/")[3]
        r = await c.request(method, path, json={**body, "jobLeaseToken": current[key]})
        assert r.status_code == 204, r.text
    states = [(await c.get(f"/v2/jobs/{k}")).json()["state"] for k in keys]
    assert states == ["COMPLETED", "CREATED", "ERROR_THROWN", "ACTIVATED"]


async def test_concurrent_completions_with_stale_and_current_tokens_complete_once(live):
    """Completions written by one group-commit statement keep each token's fence."""
    c = live.client
    keys = await enqueue(c, "cam", "acme", 20)
    stale = {
        j["jobKey"]: j["jobLeaseToken"] for j in await _activate(c, timeout=1, maxJobsToActivate=20)
    }
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    current = {j["jobKey"]: j["jobLeaseToken"] for j in await _activate(c, maxJobsToActivate=20)}
    calls = [
        c.post(f"/v2/jobs/{k}/completion", json={"jobLeaseToken": token})
        for k in keys
        for token in (stale[k], current[k], current[k])
    ]
    codes = [r.status_code for r in await asyncio.gather(*calls)]
    assert [codes[i : i + 3].count(204) for i in range(0, len(codes), 3)] == [1] * 20
    assert all(code in (204, 409) for code in codes)
    assert codes[::3] == [409] * 20  # a stale token never completes


async def test_error_takes_a_token_a_count_or_neither(live):
    c = live.client
    a, b, d = await enqueue(c, "cam", "acme", 3)
    jobs = {j["jobKey"]: j for j in await _activate(c, timeout=1)}
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    again = {j["jobKey"]: j for j in await _activate(c)}
    error = {"errorCode": "NO_STOCK", "errorMessage": "none left", "operationReference": 7}

    stale = await c.post(
        f"/v2/jobs/{a}/error", json={**error, "jobLeaseToken": jobs[a]["jobLeaseToken"]}
    )
    assert_problem(stale, 409, "INVALID_STATE")
    assert (await c.get(f"/v2/jobs/{a}")).json()["state"] == "ACTIVATED"
    by_token = await c.post(
        f"/v2/jobs/{a}/error", json={**error, "jobLeaseToken": again[a]["jobLeaseToken"]}
    )
    assert by_token.status_code == 204, by_token.text
    by_count = await c.post(f"/v2/jobs/{b}/error", json={**error, "activationCount": 2})
    assert by_count.status_code == 204, by_count.text
    unfenced = await c.post(f"/v2/jobs/{d}/error", json=error)
    assert unfenced.status_code == 204, unfenced.text
    for key in (a, b, d):
        job = (await c.get(f"/v2/jobs/{key}")).json()
        assert job["state"] == "ERROR_THROWN" and job["errorCode"] == "NO_STOCK", job
    # Without a fence, a job that is no longer ACTIVATED cannot be finished again.
    assert_problem(await c.post(f"/v2/jobs/{d}/error", json=error), 409, "INVALID_STATE")


async def test_update_takes_a_token_a_count_or_neither(live):
    c = live.client
    [key] = await enqueue(c, "cam", "acme", 1)
    unactivated = await c.patch(f"/v2/jobs/{key}", json={"changeset": {"timeout": 60_000}})
    assert_problem(unactivated, 409, "INVALID_STATE")  # no lease to extend
    [first] = await _activate(c, timeout=1)
    await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
    [second] = await _activate(c, timeout=1000)
    lease = (await c.get(f"/v2/jobs/{key}")).json()["deadline"]
    stale = await c.patch(
        f"/v2/jobs/{key}",
        json={"changeset": {"timeout": 600_000}, "jobLeaseToken": first["jobLeaseToken"]},
    )
    assert_problem(stale, 409, "INVALID_STATE")
    assert (await c.get(f"/v2/jobs/{key}")).json()["deadline"] == lease

    extended = await c.patch(
        f"/v2/jobs/{key}",
        json={
            "changeset": {"timeout": 600_000, "retries": 9},
            "jobLeaseToken": second["jobLeaseToken"],
            "operationReference": 1,
        },
    )
    assert extended.status_code == 204, extended.text
    assert await live.services.background.lease.run_once(utcnow() + timedelta(minutes=5)) == 0
    # Camunda's own clients send no token: the current activation's lease is extended.
    unfenced = await c.patch(f"/v2/jobs/{key}", json={"changeset": {"timeout": 1_200_000}})
    assert unfenced.status_code == 204, unfenced.text
    assert await live.services.background.lease.run_once(utcnow() + timedelta(minutes=15)) == 0
    job = (await c.get(f"/v2/jobs/{key}")).json()
    assert job["state"] == "ACTIVATED" and job["retries"] == 9 and job["activationCount"] == 2


async def test_count_and_token_must_agree(live):
    c = live.client
    [key] = await enqueue(c, "cam", "acme", 1)
    [job] = await _activate(c)
    token = job["jobLeaseToken"]
    other = (await enqueue(c, "cam", "acme", 1))[0]
    cases = [
        (
            "post",
            f"/v2/jobs/{key}/error",
            {"errorCode": "E", "activationCount": 2, "jobLeaseToken": token},
        ),
        (
            "patch",
            f"/v2/jobs/{key}",
            {"changeset": {"retries": 1}, "activationCount": 2, "jobLeaseToken": token},
        ),
    ]
    for method, path, payload in cases:
        assert_problem(await c.request(method.upper(), path, json=payload), 400, "INVALID_ARGUMENT")
    # A token is opaque to its client: one that is not this job's lease (another job's,
    # or none at all) does not match, as a stale one does not.
    for method, path, payload in [
        ("post", f"/v2/jobs/{other}/error", {"errorCode": "E", "jobLeaseToken": token}),
        ("patch", f"/v2/jobs/{key}", {"changeset": {"retries": 1}, "jobLeaseToken": "not-a-token"}),
        ("post", f"/v2/jobs/{key}/completion", {"jobLeaseToken": "bm9wZQ"}),
    ]:
        assert_problem(await c.request(method.upper(), path, json=payload), 409, "INVALID_STATE")
    after = (await c.get(f"/v2/jobs/{key}")).json()
    assert after["state"] == "ACTIVATED" and after["retries"] == 3


async def test_failure_defaults_to_no_retries_and_honours_back_off(live):
    c = live.client
    a, b = await enqueue(c, "cam", "acme", 2)
    await _activate(c)
    assert (await c.post(f"/v2/jobs/{a}/failure", json={"errorMessage": "x"})).status_code == 204
    assert (await c.get(f"/v2/jobs/{a}")).json()["state"] == "FAILED"
    r = await c.post(f"/v2/jobs/{b}/failure", json={"retries": 2, "retryBackOff": 60_000})
    assert r.status_code == 204
    job = (await c.get(f"/v2/jobs/{b}")).json()
    assert job["state"] == "CREATED" and job["retries"] == 2
    assert await _activate(c) == []  # backing off


async def test_camunda_bodies_are_strict(live):
    c = live.client
    [key] = await enqueue(c, "cam", "acme", 1)
    for path, payload in [
        ("/v2/jobs/activation", {**ACTIVATION, "maxJobs": 5}),
        ("/v2/jobs/activation", {**ACTIVATION, "maxJobsToActivate": 0}),
        ("/v2/jobs/activation", {**ACTIVATION, "tenantFilter": "ALL"}),
        (f"/v2/jobs/{key}/completion", {"activationCount": 1}),
        (f"/v2/jobs/{key}/failure", {"retries": -1}),
    ]:
        assert_problem(await c.post(path, json=payload), 400, "INVALID_ARGUMENT")
    job = (await c.get(f"/v2/jobs/{key}")).json()
    assert job["state"] == "CREATED" and job["activationCount"] == 0


async def test_tenant_ids_filter_activation(live):
    c = live.client
    await enqueue(c, "cam", "<default>", 2)
    await enqueue(c, "cam", "acme", 2)
    jobs = await _activate(c, tenantIds=["<default>"])
    assert [j["tenantId"] for j in jobs] == ["<default>", "<default>"]


async def test_assigned_means_the_key_s_tenants_whatever_tenant_ids_says(live):
    """Found from outside: with no key (auth off), ASSIGNED still kept to tenantIds; it
    means the caller's tenants, which for no key (or an unscoped one) are all."""
    c = live.client
    await enqueue(c, "asg", "<default>", 1)
    await enqueue(c, "asg", "acme", 1)
    jobs = await _activate(
        c, type="asg", maxJobsToActivate=2, tenantIds=["acme"], tenantFilter="ASSIGNED"
    )
    assert sorted(j["tenantId"] for j in jobs) == ["<default>", "acme"]


SEARCH_ITEM_FIELDS = {
    "jobKey",
    "type",
    "worker",
    "state",
    "kind",
    "listenerEventType",
    "retries",
    "isDenied",
    "deniedReason",
    "hasFailedWithRetriesLeft",
    "errorCode",
    "errorMessage",
    "customHeaders",
    "deadline",
    "endTime",
    "processDefinitionId",
    "processDefinitionKey",
    "processInstanceKey",
    "rootProcessInstanceKey",
    "elementId",
    "elementInstanceKey",
    "tenantId",
    "businessId",
    "creationTime",
    "lastUpdateTime",
    "priority",
}


async def test_job_search_filters_sorts_and_pages(live):
    c = live.client
    a = await enqueue(c, "s1", "acme", 3)
    await enqueue(c, "s1", "globex", 2)
    await enqueue(c, "s2", "acme", 1)
    [done] = await _activate(c, type="s1", maxJobsToActivate=1, tenantIds=["acme"])
    await c.post(f"/v2/jobs/{done['jobKey']}/completion", json={})

    r = await c.post("/v2/jobs/search", json={"filter": {"type": "s1", "tenantId": "acme"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["page"] == {
        "totalItems": 3,
        "hasMoreTotalItems": False,
        "startCursor": None,
        "endCursor": None,
    }
    assert {i["jobKey"] for i in body["items"]} == set(a)
    for item in body["items"]:
        assert set(item) == SEARCH_ITEM_FIELDS
    states = {i["jobKey"]: i["state"] for i in body["items"]}
    assert states[done["jobKey"]] == "COMPLETED"

    created = await c.post("/v2/jobs/search", json={"filter": {"state": "CREATED"}})
    assert created.json()["page"]["totalItems"] == 5
    by_key = await c.post("/v2/jobs/search", json={"filter": {"jobKey": {"$in": a[:2]}}})
    assert sorted(i["jobKey"] for i in by_key.json()["items"]) == sorted(a[:2])
    paged = await c.post(
        "/v2/jobs/search",
        json={"sort": [{"field": "jobKey", "order": "DESC"}], "page": {"limit": 2, "from": 1}},
    )
    keys = [i["jobKey"] for i in paged.json()["items"]]
    assert len(keys) == 2 and int(keys[0]) > int(keys[1])
    assert paged.json()["page"]["totalItems"] == 6
    everything = await c.post("/v2/jobs/search", content=b"")
    assert everything.json()["page"]["totalItems"] == 6
    for bad in (
        {"filter": {"color": "red"}},
        {"filter": {"state": "SLEEPING"}},
        {"sort": [{"field": "nope"}]},
        {"page": {"limit": 0}},
    ):
        assert_problem(await c.post("/v2/jobs/search", json=bad), 400, "INVALID_ARGUMENT")


async def test_topology_is_a_minimal_valid_cluster(live):
    t = (await live.client.get("/v2/topology")).json()
    assert t["clusterSize"] == 1 and t["partitionsCount"] == 1 and t["replicationFactor"] == 1
    [broker] = t["brokers"]
    assert set(broker) == {"nodeId", "brokerId", "host", "port", "partitions", "version"}
    assert broker["partitions"] == [
        {"partitionId": 1, "role": "leader", "health": "healthy", "state": "active"}
    ]
    assert isinstance(t["gatewayVersion"], str) and isinstance(t["lastCompletedChangeId"], str)
