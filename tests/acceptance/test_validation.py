"""Every validation rule in API.md answers 400 problem+json and changes nothing."""

from __future__ import annotations

import pytest

from tests.helpers import activate, assert_problem

OK_JOB = {"type": "v", "tenantId": "acme"}
BIG = "x" * (1024 * 1024)

BAD_CREATE = {
    "type missing": {"tenantId": "acme"},
    "type empty": {"type": ""},
    "type too long": {"type": "a" * 129},
    "type bad char": {"type": "send email"},
    "type not a string": {"type": 5},
    "tenant bad char": {**OK_JOB, "tenantId": "a b"},
    "tenant too long": {**OK_JOB, "tenantId": "a" * 32},
    "tenant empty": {**OK_JOB, "tenantId": ""},
    "tenant look-alike": {**OK_JOB, "tenantId": "<other>"},
    "priority high": {**OK_JOB, "priority": 101},
    "priority low": {**OK_JOB, "priority": -1},
    "priority string": {**OK_JOB, "priority": "5"},
    "priority float": {**OK_JOB, "priority": 5.5},
    "priority bool": {**OK_JOB, "priority": True},
    "retries negative": {**OK_JOB, "retries": -1},
    "variables list": {**OK_JOB, "variables": [1, 2]},
    "headers string": {**OK_JOB, "customHeaders": "x"},
    "payload over 1 MiB": {
        **OK_JOB,
        "variables": {"a": BIG[:600_000]},
        "customHeaders": {"b": BIG[:600_000]},
    },
    "runAt and delay": {**OK_JOB, "runAt": "2030-01-01T00:00:00Z", "delay": 5},
    "runAt garbage": {**OK_JOB, "runAt": "tomorrow"},
    "runAt no zone": {**OK_JOB, "runAt": "2030-01-01T00:00:00"},
    "delay negative": {**OK_JOB, "delay": -5},
    "unknown field": {**OK_JOB, "color": "red"},
    "idempotency empty": {**OK_JOB, "idempotencyKey": ""},
}


@pytest.fixture
async def baseline(live, store):
    r = await live.client.post("/v2/jobs", json=OK_JOB)
    job = r.json()

    async def unchanged():
        assert await store.fetchval("SELECT count(*) FROM jobs") == 1
        now = (await live.client.get(f"/v2/jobs/{job['jobKey']}")).json()
        assert {k: now[k] for k in ("state", "retries", "priority", "activationCount")} == {
            k: job[k] for k in ("state", "retries", "priority", "activationCount")
        }

    return job, unchanged


@pytest.mark.parametrize("case", list(BAD_CREATE))
async def test_bad_create_is_400(live, baseline, case):
    _, unchanged = baseline
    assert_problem(
        await live.client.post("/v2/jobs", json=BAD_CREATE[case]), 400, "INVALID_ARGUMENT"
    )
    await unchanged()


async def test_malformed_and_empty_bodies(live, baseline):
    _, unchanged = baseline
    c = live.client
    for content in (b"{not json", b"", b"[]", b"null", b'"x"'):
        assert_problem(
            await c.post("/v2/jobs", content=content, headers={"content-type": "application/json"}),
            400,
        )
    await unchanged()


async def test_body_over_16_mib(live, baseline):
    _, unchanged = baseline
    body = b'{"jobs": [' + b" " * (16 * 1024 * 1024) + b"]}"
    assert_problem(await live.client.post("/v2/jobs/batch", content=body), 413)
    await unchanged()


async def test_batch_is_all_or_nothing(live, baseline):
    _, unchanged = baseline
    c = live.client
    bad = {"jobs": [OK_JOB] * 5 + [{**OK_JOB, "priority": 500}] + [OK_JOB]}
    body = assert_problem(await c.post("/v2/jobs/batch", json=bad), 400)
    assert "jobs.5.priority" in body["detail"]
    assert_problem(await c.post("/v2/jobs/batch", json={"jobs": []}), 400)
    assert_problem(await c.post("/v2/jobs/batch", json={"jobs": [OK_JOB] * 10_001}), 400)
    await unchanged()


BAD_ACTIVATE = {
    "maxJobs 0": {"type": "v", "maxJobs": 0, "timeout": 1000},
    "maxJobs 1001": {"type": "v", "maxJobs": 1001, "timeout": 1000},
    "timeout 0": {"type": "v", "maxJobs": 1, "timeout": 0},
    "timeout too long": {"type": "v", "maxJobs": 1, "timeout": 86_400_001},
    "timeout missing": {"type": "v", "maxJobs": 1},
    "worker too long": {"type": "v", "maxJobs": 1, "timeout": 1000, "worker": "w" * 129},
    "tenantIds bad": {"type": "v", "maxJobs": 1, "timeout": 1000, "tenantIds": ["a b"]},
    "tenantIds empty": {"type": "v", "maxJobs": 1, "timeout": 1000, "tenantIds": []},
    "type bad": {"type": "a b", "maxJobs": 1, "timeout": 1000},
    "requestTimeout string": {"type": "v", "maxJobs": 1, "timeout": 1000, "requestTimeout": "x"},
    "unknown field": {"type": "v", "maxJobs": 1, "timeout": 1000, "fetchVariable": ["a"]},
}


@pytest.mark.parametrize("case", list(BAD_ACTIVATE))
async def test_bad_activate_is_400(live, baseline, case):
    _, unchanged = baseline
    assert_problem(await live.client.post("/v2/jobs/activate", json=BAD_ACTIVATE[case]), 400)
    await unchanged()


async def test_bad_finish_calls_are_400_and_change_nothing(live, store):
    c = live.client
    await c.post("/v2/jobs", json=OK_JOB)
    [job] = await activate(c, "v")
    k = job["jobKey"]
    cases = [
        ("post", f"/v2/jobs/{k}/complete", {}),
        ("post", f"/v2/jobs/{k}/complete", {"activationCount": -1}),
        ("post", f"/v2/jobs/{k}/complete", {"activationCount": "1"}),
        ("post", f"/v2/jobs/{k}/complete", {"activationCount": 1, "variables": [1]}),
        ("post", f"/v2/jobs/{k}/fail", {"activationCount": 1, "retries": -1}),
        ("post", f"/v2/jobs/{k}/fail", {"activationCount": 1, "retryBackOff": -1}),
        ("post", f"/v2/jobs/{k}/error", {"activationCount": 1}),
        ("post", f"/v2/jobs/{k}/error", {"activationCount": 1, "errorCode": ""}),
        ("patch", f"/v2/jobs/{k}", {"changeset": {}}),
        ("patch", f"/v2/jobs/{k}", {"activationCount": 1, "changeset": {"timeout": 0}}),
        ("patch", f"/v2/jobs/{k}", {"activationCount": 1, "changeset": {"priority": 101}}),
        ("patch", f"/v2/jobs/{k}", {"activationCount": 1, "changeset": {"retries": -2}}),
        ("patch", f"/v2/jobs/{k}", {"activationCount": 1, "changeset": {"color": 1}}),
        ("post", "/v2/jobs/complete", {"jobs": []}),
        ("post", "/v2/jobs/complete", {"jobs": [{"jobKey": k, "activationCount": 1}] * 1001}),
        ("post", "/v2/jobs/complete", {"jobs": [{"jobKey": "abc", "activationCount": 1}]}),
        ("post", "/v2/jobs/abc/complete", {"activationCount": 1}),
        ("post", "/v2/jobs/-1/complete", {"activationCount": 1}),
        ("post", "/v2/jobs/99999999999999999999/complete", {"activationCount": 1}),
    ]
    for method, path, payload in cases:
        r = await c.request(method.upper(), path, json=payload)
        assert_problem(r, 400, "INVALID_ARGUMENT")
    assert_problem(await c.get("/v2/jobs/12x"), 400)
    after = (await c.get(f"/v2/jobs/{k}")).json()
    assert after["state"] == "ACTIVATED" and after["retries"] == 3 and after["priority"] == 50
    assert after["deadline"] == job["deadline"]


async def test_bad_operator_input_is_400(live, store):
    c = live.client
    for path, payload in [
        ("/v2/tenants/acme", {"weight": 0}),
        ("/v2/tenants/acme", {"weight": 10_001}),
        ("/v2/tenants/acme", {"maxActiveJobs": -1}),
        ("/v2/tenants/acme", {"weight": 2, "shares": 3}),
        ("/v2/tenants/a%20b", {"weight": 2}),
        ("/v2/job-types/mail", {"agingStep": 101}),
        ("/v2/job-types/mail", {"agingIntervalMs": 0}),
        ("/v2/job-types/mail", {"maxActiveJobs": -5}),
        ("/v2/job-types/a%20b", {"maxActiveJobs": 5}),
        # Rate limits (ADR 028): positive finite numbers within bounds, both given.
        *(
            (path, {"rateLimit": limit})
            for path in ("/v2/tenants/acme", "/v2/job-types/mail")
            for limit in [
                {"perSecond": 0, "burst": 10},
                {"perSecond": -1, "burst": 10},
                {"perSecond": 0.0001, "burst": 10},
                {"perSecond": 1_000_001, "burst": 10},
                {"perSecond": 50, "burst": 0.5},
                {"perSecond": 50, "burst": 1e7},
                {"perSecond": "50", "burst": 100},
                {"perSecond": True, "burst": 100},
                {"perSecond": 50},
                {"burst": 100},
                {"perSecond": 50, "burst": 100, "refill": 1},
                50,
                [50, 100],
            ]
        ),
    ]:
        assert_problem(await c.put(path, json=payload), 400)
    assert await store.fetchval("SELECT count(*) FROM tenants") == 0
    assert await store.fetchval("SELECT count(*) FROM job_types") == 0


async def test_unknown_job_is_404(live):
    assert_problem(await live.client.get("/v2/jobs/42"), 404, "NOT_FOUND")
    r = await live.client.post("/v2/jobs/42/complete", json={"activationCount": 1})
    assert_problem(r, 404)
    assert_problem(await live.client.patch("/v2/jobs/42", json={"changeset": {"retries": 1}}), 404)


async def test_an_undeclared_method_is_405_naming_every_method_of_the_path(live):
    for path, allowed in [
        ("/v2/tenants/acme", "DELETE, GET, PUT"),
        ("/v2/jobs", "GET, POST"),
        ("/v2/jobs/42", "GET, PATCH"),
        ("/v2/job-types/a/b", "GET, PUT"),
        ("/v2/job-types/a/pause", "GET, POST, PUT"),
        ("/v2/jobs/retry", "POST"),
    ]:
        r = await live.client.request("TRACE", path)
        assert_problem(r, 405, "METHOD_NOT_ALLOWED")
        assert r.headers["allow"] == allowed, path
    # A path a route names literally is not taken for a job key by PATCH /v2/jobs/{jobKey}.
    for path in ("/v2/jobs/activate", "/v2/jobs/activation", "/v2/jobs/batch", "/v2/jobs/search"):
        r = await live.client.patch(path, json={"changeset": {"retries": 1}})
        assert_problem(r, 405, "METHOD_NOT_ALLOWED")
        assert r.headers["allow"] == "POST", path
    r = await live.client.get("/v2/jobs/complete")
    assert_problem(r, 405)
    assert r.headers["allow"] == "POST"
