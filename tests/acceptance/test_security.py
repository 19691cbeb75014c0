"""API keys against a live server with auth required (API.md "Security")."""

from __future__ import annotations

import asyncio
import base64
import time
from datetime import timedelta

import httpx
import pytest

from app.config import Settings
from app.domain import utcnow
from app.keys import Role
from tests.fixtures import Live, quiet_settings


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(auth="required")


async def make_key(
    live: Live,
    role: Role,
    tenants: list[str] | None = None,
    types: list[str] | None = None,
    **kwargs: object,
) -> tuple[str, str]:
    """(key id, secret), made as the CLI makes them (no HTTP)."""
    row, token = await live.services.keys.create(
        role, tenants, types, kwargs.get("name"), kwargs.get("expires_at"), "test"
    )  # type: ignore[arg-type]
    return row.key_id, token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


async def test_no_key_or_a_bad_one_is_401_with_a_challenge_and_health_is_open(live: Live):
    c = live.client
    for headers in ({}, bearer("jf_0123456789abcdef_nope"), bearer("garbage"), basic("a", "b")):
        r = await c.post("/v2/jobs", json={"type": "t"}, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert "Bearer" in r.headers["www-authenticate"]
        assert r.json()["title"] == "UNAUTHENTICATED"
    assert (await c.get("/healthz")).status_code == 200
    assert (await c.get("/readyz")).status_code == 200
    assert (await c.get("/metrics")).status_code == 401
    assert (await c.get("/openapi.json")).status_code == 200  # JOBFAIR_DOCS_OPEN default
    # Nothing was created by the refused calls.
    assert await live.services.db.fetchval("SELECT count(*) FROM jobs") == 0


async def test_a_key_that_is_wrong_by_one_character_is_refused(live: Live):
    _, token = await make_key(live, Role.ADMIN)
    assert (await live.client.get("/v2/keys", headers=bearer(token))).status_code == 200
    wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert (await live.client.get("/v2/keys", headers=bearer(wrong))).status_code == 401


async def test_roles_hold_their_rights_and_no_more(live: Live):
    c = live.client
    _, producer = await make_key(live, Role.PRODUCER)
    _, worker = await make_key(live, Role.WORKER)
    r = await c.post("/v2/jobs", json={"type": "t"}, headers=bearer(producer))
    assert r.status_code == 201
    assert (await c.post("/v2/jobs", json={"type": "t"}, headers=bearer(worker))).status_code == 403
    act = {"type": "t", "maxJobs": 1, "timeout": 60000, "requestTimeout": -1}
    assert (
        await c.post("/v2/jobs/activate", json=act, headers=bearer(producer))
    ).status_code == 403
    r = await c.post("/v2/jobs/activate", json=act, headers=bearer(worker))
    assert r.status_code == 200 and len(r.json()["jobs"]) == 1
    for key in (producer, worker):
        r = await c.put("/v2/tenants/acme", json={"weight": 2}, headers=bearer(key))
        assert r.status_code == 403, r.text
        assert r.json()["title"] == "FORBIDDEN"
        assert (await c.get("/v2/keys", headers=bearer(key))).status_code == 403
    assert await live.services.db.fetchval("SELECT count(*) FROM tenants") == 0


async def test_admin_manages_keys_over_http_and_secrets_are_never_listed(live: Live):
    c = live.client
    admin_id, admin = await make_key(live, Role.ADMIN)
    body = {"role": "worker", "tenants": ["acme"], "types": ["mail"], "name": "mailer"}
    r = await c.post("/v2/keys", json=body, headers=bearer(admin))
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["secret"].startswith(f"jf_{made['keyId']}_")
    assert (made["role"], made["tenants"], made["types"], made["createdBy"]) == (
        "worker",
        ["acme"],
        ["mail"],
        admin_id,
    )
    listed = (await c.get("/v2/keys", headers=bearer(admin))).json()["keys"]
    assert {k["keyId"] for k in listed} == {admin_id, made["keyId"]}
    assert made["secret"] not in (await c.get("/v2/keys", headers=bearer(admin))).text
    assert all("secret" not in k for k in listed)
    # Bad bodies change nothing.
    for bad in (
        {"role": "root", "tenants": "*", "types": "*"},
        {"role": "worker", "tenants": [], "types": "*"},
        {"role": "worker", "tenants": ["bad tenant"], "types": "*"},
        {"role": "worker", "tenants": "*", "types": "*", "expiresAt": "2001-01-01T00:00:00Z"},
        {"role": "worker", "tenants": "*", "types": "*", "name": "a\x00b"},
        {"role": "worker", "tenants": "*"},
    ):
        r = await c.post("/v2/keys", json=bad, headers=bearer(admin))
        assert r.status_code == 400, (bad, r.text)
    assert len((await c.get("/v2/keys", headers=bearer(admin))).json()["keys"]) == 2
    r = await c.delete(f"/v2/keys/{made['keyId']}", headers=bearer(admin))
    assert r.status_code == 204
    assert (await c.delete(f"/v2/keys/{made['keyId']}", headers=bearer(admin))).status_code == 204
    assert (await c.delete("/v2/keys/0000000000000000", headers=bearer(admin))).status_code == 404
    act = {"type": "mail", "maxJobs": 1, "timeout": 1000, "requestTimeout": -1}
    r = await c.post("/v2/jobs/activate", json=act, headers=bearer(made["secret"]))
    assert r.status_code == 401


async def test_a_scoped_worker_never_sees_touches_or_counts_another_tenants_jobs(live: Live):
    c = live.client
    _, admin = await make_key(live, Role.ADMIN)
    _, producer = await make_key(live, Role.PRODUCER, ["acme", "globex"])
    _, worker = await make_key(live, Role.WORKER, ["acme"], ["mail"])
    secret_value = "initech-private-variable"
    r = await c.post(
        "/v2/jobs/batch",
        json={
            "jobs": [
                {"type": "mail", "tenantId": "initech", "variables": {"v": secret_value}}
                for _ in range(3)
            ]
        },
        headers=bearer(admin),
    )
    other_keys = r.json()["jobKeys"]
    r = await c.post(
        "/v2/jobs", json={"type": "mail", "tenantId": "initech"}, headers=bearer(producer)
    )
    assert r.status_code == 403
    r = await c.post(
        "/v2/jobs", json={"type": "mail", "tenantId": "acme"}, headers=bearer(producer)
    )
    assert r.status_code == 201
    mine = r.json()["jobKey"]
    # Activation without tenantIds draws from the key's tenants only.
    act = {"type": "mail", "maxJobs": 10, "timeout": 60000, "requestTimeout": -1}
    jobs = (await c.post("/v2/jobs/activate", json=act, headers=bearer(worker))).json()["jobs"]
    assert [j["jobKey"] for j in jobs] == [mine]
    r = await c.post(
        "/v2/jobs/activate", json={**act, "tenantIds": ["acme", "initech"]}, headers=bearer(worker)
    )
    assert r.status_code == 403
    r = await c.post("/v2/jobs/activate", json={**act, "type": "other"}, headers=bearer(worker))
    assert r.status_code == 403
    # The other tenant's jobs, activated by the admin: 404 to the worker on every route.
    theirs = (await c.post("/v2/jobs/activate", json=act, headers=bearer(admin))).json()["jobs"]
    assert {j["jobKey"] for j in theirs} == set(other_keys)
    key, count = theirs[0]["jobKey"], theirs[0]["activationCount"]
    calls = [
        ("GET", f"/v2/jobs/{key}", None),
        ("POST", f"/v2/jobs/{key}/complete", {"activationCount": count}),
        ("POST", f"/v2/jobs/{key}/fail", {"activationCount": count, "retries": 0}),
        ("POST", f"/v2/jobs/{key}/error", {"activationCount": count, "errorCode": "E"}),
        ("PATCH", f"/v2/jobs/{key}", {"changeset": {"timeout": 1}}),
        ("POST", f"/v2/jobs/{key}/completion", {}),
        ("POST", f"/v2/jobs/{key}/failure", {}),
    ]
    for method, path, body in calls:
        r = await c.request(method, path, json=body, headers=bearer(worker))
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["detail"] == f"job {key} does not exist"
    r = await c.post(f"/v2/jobs/{key}/cancel", headers=bearer(producer))
    assert r.status_code == 404
    r = await c.post(
        "/v2/jobs/complete",
        json={"jobs": [{"jobKey": key, "activationCount": count}]},
        headers=bearer(worker),
    )
    assert r.json()["results"] == [{"jobKey": key, "status": 404}]
    state = await live.services.db.fetchval("SELECT state FROM jobs WHERE job_key = $1", int(key))
    assert state == "ACTIVATED"  # untouched
    # Search and stats show only the key's own.
    found = (await c.post("/v2/jobs/search", json={}, headers=bearer(worker))).json()
    assert [i["jobKey"] for i in found["items"]] == [mine]
    found = await c.post(
        "/v2/jobs/search", json={"filter": {"tenantId": "initech"}}, headers=bearer(worker)
    )
    assert found.json()["items"] == [] and found.json()["page"]["totalItems"] == 0
    stats = await c.get("/v2/stats", headers=bearer(worker))
    assert stats.status_code == 200
    assert "initech" not in stats.text and secret_value not in stats.text
    [row] = stats.json()["jobTypes"]
    assert row["active"] == 1 and [t["tenantId"] for t in row["tenants"]] == ["acme"]
    # The worker finishes its own job.
    r = await c.post(
        f"/v2/jobs/{mine}/complete", json={"activationCount": 1}, headers=bearer(worker)
    )
    assert r.status_code == 204


async def test_scoped_activation_keeps_the_weighted_shares(live: Live):
    c = live.client
    _, admin = await make_key(live, Role.ADMIN)
    _, worker = await make_key(live, Role.WORKER, ["a", "b"])
    await c.put("/v2/tenants/a", json={"weight": 3}, headers=bearer(admin))
    for tenant in ("a", "b", "c"):
        batch = {"jobs": [{"type": "t", "tenantId": tenant} for _ in range(100)]}
        assert (
            await c.post("/v2/jobs/batch", json=batch, headers=bearer(admin))
        ).status_code == 201
    act = {"type": "t", "maxJobs": 40, "timeout": 60000, "requestTimeout": -1}
    jobs = (await c.post("/v2/jobs/activate", json=act, headers=bearer(worker))).json()["jobs"]
    tenants = [j["tenantId"] for j in jobs]
    assert (tenants.count("a"), tenants.count("b"), tenants.count("c")) == (30, 10, 0)


async def test_basic_and_oauth_client_credentials(live: Live):
    c = live.client
    key_id, token = await make_key(live, Role.WORKER, ["acme"])
    act = {"type": "t", "maxJobsToActivate": 1, "timeout": 1000, "requestTimeout": -1}
    assert (
        await c.post("/v2/jobs/activation", json=act, headers=basic(key_id, token))
    ).status_code == 200
    assert (
        await c.post("/v2/jobs/activation", json=act, headers=basic("other", token))
    ).status_code == 401
    form = {"grant_type": "client_credentials", "client_id": key_id, "client_secret": token}
    r = await c.post("/oauth/token", data={**form, "audience": "zeebe-api"})
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    answer = r.json()
    assert answer["token_type"] == "Bearer" and answer["expires_in"] == 600
    access = answer["access_token"]
    assert (
        await c.post("/v2/jobs/activation", json=act, headers=bearer(access))
    ).status_code == 200
    # Credentials as HTTP Basic on the token request, as some OAuth clients send them.
    r = await c.post(
        "/oauth/token", data={"grant_type": "client_credentials"}, headers=basic(key_id, token)
    )
    assert r.status_code == 200
    # The token carries the key's scope.
    r = await c.post(
        "/v2/jobs/activation", json={**act, "tenantIds": ["globex"]}, headers=bearer(access)
    )
    assert r.status_code == 403
    for bad, status, error in (
        ({**form, "client_secret": token[:-1] + "x"}, 401, "invalid_client"),
        ({**form, "grant_type": "password"}, 400, "unsupported_grant_type"),
        ({"grant_type": "client_credentials"}, 400, "invalid_request"),
    ):
        r = await c.post("/oauth/token", data=bad)
        assert (r.status_code, r.json()["error"]) == (status, error), r.text
    r = await c.post("/oauth/token", json=form)
    assert r.status_code == 415
    # A forged token (signed with another secret) and a tampered one are refused.
    head, payload, sig = access.split(".")
    assert (
        await c.post(
            "/v2/jobs/activation", json=act, headers=bearer(f"{head}.{payload}.{sig[::-1]}")
        )
    ).status_code == 401
    # Revoking the key stops its tokens too.
    await live.services.keys.revoke(key_id, "test")
    assert (
        await c.post("/v2/jobs/activation", json=act, headers=bearer(access))
    ).status_code == 401


async def test_an_expired_key_is_refused(live: Live):
    _, token = await make_key(live, Role.ADMIN, expires_at=utcnow() + timedelta(milliseconds=300))
    assert (await live.client.get("/v2/keys", headers=bearer(token))).status_code == 200
    await asyncio.sleep(0.4)  # the key's own expiry: a time, not an event to wait for
    assert (await live.client.get("/v2/keys", headers=bearer(token))).status_code == 401


async def test_last_use_is_recorded(live: Live):
    key_id, token = await make_key(live, Role.ADMIN)
    before = await live.services.db.fetchval(
        "SELECT last_used_at FROM api_keys WHERE key_id = $1", key_id
    )
    assert before is None
    await live.client.get("/v2/keys", headers=bearer(token))
    after = await live.services.db.fetchval(
        "SELECT last_used_at FROM api_keys WHERE key_id = $1", key_id
    )
    assert after is not None


@pytest.fixture
def limited() -> Settings:
    return quiet_settings(
        auth="required", key_rate_limit=5, key_rate_burst=3, max_waiters_per_key=2
    )


async def test_rate_limit_and_waiters_per_key(db_url: str, limited: Settings):
    from app.main import create_app
    from tests.fixtures import serving

    async with serving(create_app(limited, db_url, background=False)) as live:
        _, key = await make_key(live, Role.WORKER)
        _, other = await make_key(live, Role.WORKER)
        statuses = [
            (await live.client.get("/v2/topology", headers=bearer(key))).status_code
            for _ in range(5)
        ]
        assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
        r = await live.client.get("/v2/topology", headers=bearer(key))
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        # Another key is not limited by the first.
        assert (await live.client.get("/v2/topology", headers=bearer(other))).status_code == 200
        # Two long polls held by one key; the third is refused.
        act = {"type": "idle", "maxJobs": 1, "timeout": 1000, "requestTimeout": 5000}
        polls = [
            asyncio.create_task(
                live.client.post("/v2/jobs/activate", json=act, headers=bearer(other))
            )
            for _ in range(2)
        ]
        hub = live.services.activation.waiters
        deadline = time.monotonic() + 30
        while hub.waiting < 2:  # the hub exposes a count, not an event
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        r = await live.client.post("/v2/jobs/activate", json=act, headers=bearer(other))
        assert r.status_code == 429, r.text
        await hub.close()
        for p in polls:
            assert (await p).status_code == 200
        assert live.services.limits.waiting == {}


async def test_revocation_reaches_another_server_process_within_a_second(spawn_server, db_url: str):
    """Two `jobfair serve` processes on one database: a key revoked through one is
    refused by the other within 1 s (each re-reads a key at most every 500 ms)."""
    from app.db import Database
    from app.keys import KeyService
    from tests.fixtures import wait_ready

    db = await Database.connect(db_url, size=2, min_size=1)
    try:
        env = {"JOBFAIR_AUTH": "required"}
        a, b = spawn_server(**env), spawn_server(**env)
        for server in (a, b):
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as ready:
                await wait_ready(ready, server)
        async with httpx.AsyncClient(timeout=10) as client:
            keys = KeyService(db)
            _, admin = await keys.create(Role.ADMIN, None, None, None, None, "test")
            row, token = await keys.create(Role.WORKER, None, None, None, None, "test")
            r = await client.get(f"{b.url}/v2/topology", headers=bearer(token))
            assert r.status_code == 200  # b has now read the key
            r = await client.delete(f"{a.url}/v2/keys/{row.key_id}", headers=bearer(admin))
            assert r.status_code == 204
            revoked = time.monotonic()
            while True:
                r = await client.get(f"{b.url}/v2/topology", headers=bearer(token))
                if r.status_code == 401:
                    break
                assert r.status_code == 200
                assert time.monotonic() - revoked < 1.0, "b still accepts the revoked key"
                await asyncio.sleep(0.02)
    finally:
        await db.close()


async def test_hostile_token_requests_are_4xx_and_issue_nothing(live: Live):
    key_id, token = await make_key(live, Role.WORKER)
    good = f"grant_type=client_credentials&client_id={key_id}&client_secret={token}"
    form = {"content-type": "application/x-www-form-urlencoded"}
    hostile = [
        b"",
        b"grant_type=client_credentials&grant_type=client_credentials",
        b"grant_type=client_credentials&client_id=%00&client_secret=x",
        b"grant_type=client_credentials&client_id=\xff&client_secret=x",
        b"grant_type=client_credentials&client_id=%ED%A0%80&client_secret=x",
        b"grant_type=client_credentials&client_id=a&client_secret=" + b"x" * 20_000,
        b"&".join([b"a=1"] * 200),
        b"grant_type=client_credentials&" + good.encode()[:-1],
        (good + "&client_id=other").encode(),
        b"%%%",
        b"grant_type=client_credentials;client_id=x",
    ]
    for content in hostile:
        r = await live.client.post("/oauth/token", content=content, headers=form)
        assert 400 <= r.status_code < 500, (content[:80], r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json", content[:80]
    for media in ("application/json", "text/plain", "multipart/form-data", None):
        headers = {} if media is None else {"content-type": media}
        r = await live.client.post("/oauth/token", content=good.encode(), headers=headers)
        assert r.status_code == 415, (media, r.text)
    r = await live.client.post("/oauth/token", content=good.encode(), headers=form)
    assert r.status_code == 200
    bad_basic = {**form, "Authorization": "Basic !!!"}
    r = await live.client.post(
        "/oauth/token", content=b"grant_type=client_credentials", headers=bad_basic
    )
    assert r.status_code == 401


@pytest.fixture
def opened() -> Settings:
    return quiet_settings(auth="required", metrics_open=True, docs_open=False)


async def test_metrics_and_docs_follow_their_settings(db_url: str, opened: Settings):
    from app.main import create_app
    from tests.fixtures import serving

    async with serving(create_app(opened, db_url, background=False)) as live:
        assert (await live.client.get("/metrics")).status_code == 200
        for path in ("/openapi.json", "/docs"):
            assert (await live.client.get(path)).status_code == 401, path
        _, token = await make_key(live, Role.PRODUCER)
        assert (await live.client.get("/openapi.json", headers=bearer(token))).status_code == 200


async def test_a_flood_of_unknown_keys_reads_a_few_at_a_time(live: Live):
    """Made-up key ids cannot be cached; their reads wait for each other, so the pool
    keeps connections for the jobs, and every one of them is still a 401."""
    tokens = [f"jf_{i:016x}_{'x' * 43}" for i in range(40)]
    before = live.services.keys.reads
    answers = await asyncio.gather(
        *(live.client.get("/v2/topology", headers=bearer(t)) for t in tokens)
    )
    assert {r.status_code for r in answers} == {401}
    assert live.services.keys.reads - before == 40
    peak = live.services.keys.peak_reads
    assert 1 <= peak <= 4


# -- found by an adversarial pass (issue 22) ------------------------------------------------


async def test_an_admin_key_cannot_be_scoped(live: Live):
    """A scoped admin would configure tenants and make unscoped keys beyond its scope."""
    _, admin = await make_key(live, Role.ADMIN)
    for scope in ({"tenants": ["A"], "types": "*"}, {"tenants": "*", "types": ["t"]}):
        r = await live.client.post(
            "/v2/keys", json={"role": "admin", **scope}, headers=bearer(admin)
        )
        assert r.status_code == 400, r.text
    assert len((await live.client.get("/v2/keys", headers=bearer(admin))).json()["keys"]) == 1


async def test_an_idempotency_key_taken_by_another_type_shows_nothing(live: Live):
    c = live.client
    _, admin = await make_key(live, Role.ADMIN)
    _, producer = await make_key(live, Role.PRODUCER, ["A"], ["t1"])
    hidden = {"type": "t2", "tenantId": "A", "idempotencyKey": "k", "variables": {"s": "hide"}}
    assert (await c.post("/v2/jobs", json=hidden, headers=bearer(admin))).status_code == 201
    mine = {"type": "t1", "tenantId": "A", "idempotencyKey": "k"}
    r = await c.post("/v2/jobs", json=mine, headers=bearer(producer))
    assert r.status_code == 409 and "hide" not in r.text, r.text
    batch = {"jobs": [{"type": "t1", "tenantId": "A"}, mine]}
    r = await c.post("/v2/jobs/batch", json=batch, headers=bearer(producer))
    assert r.status_code == 409, r.text
    assert await live.services.db.fetchval("SELECT count(*) FROM jobs") == 1  # nothing made


async def test_a_revoked_key_gets_no_more_jobs_on_its_open_long_poll_and_stream(live: Live):
    c = live.client
    _, admin = await make_key(live, Role.ADMIN)
    worker_id, worker = await make_key(live, Role.WORKER)
    act = {"type": "rv", "maxJobs": 5, "timeout": 60000, "requestTimeout": 20000}
    poll = asyncio.create_task(c.post("/v2/jobs/activate", json=act, headers=bearer(worker)))
    url = "/v2/jobs/stream?type=rv&maxJobs=5&timeout=60000"
    async with c.stream("GET", url, headers=bearer(worker), timeout=30) as stream:
        assert stream.status_code == 200
        deadline = time.monotonic() + 30
        while live.services.activation.waiters.waiting < 2:  # the hub exposes a count, not an event
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await live.services.keys.revoke(worker_id, "test")
        batch = {"jobs": [{"type": "rv"} for _ in range(4)]}
        assert (
            await c.post("/v2/jobs/batch", json=batch, headers=bearer(admin))
        ).status_code == 201
        r = await poll
        assert r.status_code == 401, r.text
        events = [line async for line in stream.aiter_lines() if line.startswith("data:")]
    assert events == []  # the stream ended without writing a job
    await live.services.activation.settle()
    states = await live.services.db.fetch("SELECT state FROM jobs WHERE job_type = 'rv'")
    assert [s["state"] for s in states] == ["CREATED"] * 4  # every one given back


async def test_two_authorization_headers_are_refused(live: Live):
    _, admin = await make_key(live, Role.ADMIN)
    headers = [("Authorization", f"Bearer {admin}"), ("Authorization", "Bearer junk")]
    r = await live.client.get("/v2/keys", headers=headers)
    assert r.status_code == 401 and "one Authorization header" in r.json()["detail"]


async def test_token_request_errors_carry_the_oauth_members(live: Live):
    key_id, token = await make_key(live, Role.WORKER)
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = await live.client.post(
        "/oauth/token", content=b"grant_type=client_credentials&client_id=a&client_id=b",
        headers=form,
    )  # fmt: skip
    assert (r.status_code, r.json()["error"]) == (400, "invalid_request")
    r = await live.client.post("/oauth/token", json={"grant_type": "client_credentials"})
    assert (r.status_code, r.json()["error"]) == (415, "invalid_request")
    both = {"grant_type": "client_credentials", "client_secret": token}
    r = await live.client.post("/oauth/token", data=both, headers=basic(key_id, token))
    assert (r.status_code, r.json()["error"]) == (400, "invalid_request")


def test_the_asgi_module_requires_keys_unless_told_otherwise(db_url: str):
    """Served by uvicorn or gunicorn directly, the bind address is unknown to the app."""
    import os
    import subprocess
    import sys

    code = "from app.asgi import app; print(app.state.settings.auth_mode)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFAIR_")}
    for extra, expected in (({}, "required"), ({"JOBFAIR_AUTH": "off"}, "off")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "JOBFAIR_DATABASE_URL": db_url, **extra},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected


async def test_a_key_revoked_while_its_long_poll_waits_gets_401_without_jobs_too(live: Live):
    """Found from outside: with no job arriving, the wait ended in 200 ``[]`` although the
    key had been revoked a second before (only a poll that got jobs was refused)."""
    worker_id, worker = await make_key(live, Role.WORKER)
    act = {"type": "rv0", "maxJobs": 1, "timeout": 60000, "requestTimeout": 1500}
    poll = asyncio.create_task(
        live.client.post("/v2/jobs/activate", json=act, headers=bearer(worker))
    )
    deadline = time.monotonic() + 30
    while live.services.activation.waiters.waiting < 1:  # the hub exposes a count only
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await live.services.keys.revoke(worker_id, "test")
    r = await poll
    assert r.status_code == 401, r.text
    assert r.headers["content-type"].startswith("application/problem+json")


async def test_a_call_that_does_not_wait_needs_no_waiter_place(db_url: str):
    """Found from outside: a key holding its most long polls got 429 for an activation
    with a negative requestTimeout, which holds nothing open."""
    from app.main import create_app
    from tests.fixtures import serving

    two_places = quiet_settings(auth="required", max_waiters_per_key=2)
    async with serving(create_app(two_places, db_url, background=False)) as live:
        _, key = await make_key(live, Role.WORKER)
        held = {"type": "idle2", "maxJobs": 1, "timeout": 1000, "requestTimeout": 5000}
        polls = [
            asyncio.create_task(
                live.client.post("/v2/jobs/activate", json=held, headers=bearer(key))
            )
            for _ in range(2)
        ]
        hub = live.services.activation.waiters
        deadline = time.monotonic() + 30
        while hub.waiting < 2:  # the hub exposes a count, not an event
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        now = {**held, "requestTimeout": -1}
        r = await live.client.post("/v2/jobs/activate", json=now, headers=bearer(key))
        assert r.status_code == 200 and r.json() == {"jobs": []}, r.text
        waits = {**held, "requestTimeout": 1000}
        r = await live.client.post("/v2/jobs/activate", json=waits, headers=bearer(key))
        assert r.status_code == 429, r.text  # one that would wait still needs a place
        await hub.close()
        for p in polls:
            assert (await p).status_code == 200
