"""The security matrix, generated from the route table (API.md "Security").

Every operation of ``app.api.routes.OPERATIONS`` x every role (admin, producer, worker)
x a target in the keys' scope and two outside it (another tenant; another job type) x
a valid key, none, a malformed one, a revoked one and an expired one.  Each cell's
status is predicted from the operation's permission, the role's rights (``ROLES``) and
how the operation names its scope (a job in its path: 404 outside; a tenant or type in
its body or query: 403 outside); every answer a scoped key gets is searched for what
it must never see: another scope's job keys (other than one the request itself named),
tenant, job type and variable values.  A new operation fails the coverage check until
it is given a body here, so it cannot go untested.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest

from app.api.operation import Operation
from app.api.routes import OPERATIONS
from app.api.security import ROLES, Permission
from app.config import Settings
from app.db import key_rows
from app.domain import utcnow
from app.keys import Role, digest, new_token
from tests.fixtures import Live, quiet_settings

IN_TENANT, OUT_TENANT = "insider", "outsider"
IN_TYPE, OUT_TYPE = "intype", "outtype"
HIDDEN_VALUE = "hidden-variable-7f3a9c"
# (tenant, type) of each target: in the scoped keys' scope, or out of it one way or other.
TARGETS = {
    "in": (IN_TENANT, IN_TYPE),
    "other-tenant": (OUT_TENANT, IN_TYPE),
    "other-type": (IN_TENANT, OUT_TYPE),
}
CREDENTIALS = ("valid", "none", "malformed", "revoked", "expired")

# A valid body per operation that takes one: {tenant}, {type}, {k} (a job key of the
# target, ACTIVATED) and {n} (its activationCount, a number) are filled in per cell.
BODIES: dict[str, Any] = {
    "postJobs": {"type": "{type}", "tenantId": "{tenant}", "variables": {"v": "x"}},
    "postJobsBatch": {"jobs": [{"type": "{type}", "tenantId": "{tenant}"}]},
    "postJobsActivate": {
        "type": "{type}",
        "maxJobs": 1,
        "timeout": 60_000,
        "requestTimeout": -1,
        "tenantIds": ["{tenant}"],
    },
    "postJobsActivation": {
        "type": "{type}",
        "maxJobsToActivate": 1,
        "timeout": 60_000,
        "requestTimeout": -1,
        "tenantIds": ["{tenant}"],
    },
    "postJobsComplete": {"jobs": [{"jobKey": "{k}", "activationCount": "{n}"}]},
    "postJobsSearch": {"filter": {"tenantId": "{tenant}", "type": "{type}"}},
    "patchJobsByKey": {"changeset": {"timeout": 60_000}},
    "postJobsCompleteByKey": {"activationCount": "{n}"},
    "postJobsCompletionByKey": {},
    "postJobsErrorByKey": {"activationCount": "{n}", "errorCode": "E"},
    "postJobsFailByKey": {"activationCount": "{n}", "retries": 1},
    "postJobsFailureByKey": {"retries": 1},
    "putJobTypesByKey": {"maxActiveJobs": 100},
    "putTenantsByKey": {"weight": 1},
    "putTenantsKeysByKey": {"weight": 2},
    "postJobsRetry": {"tenantId": "{tenant}", "type": "{type}"},
    "postJobsCancel": {"tenantId": "{tenant}", "type": "{type}", "limit": 1},
    "postKeys": {"role": "worker", "tenants": ["{tenant}"], "types": ["{type}"]},
    "postOauthToken": "grant_type=client_credentials",  # a form; the key as HTTP Basic
}
QUERIES = {
    "getJobsStream": "type={type}&maxJobs=1&timeout=60000&tenantIds={tenant}",
    "getStats": "type={type}",
    "getJobs": "type={type}&tenantId={tenant}",
    "getWorkers": "type={type}",
}
# Operations whose request itself names a tenant or type: outside the key's scope, 403.
NAMES_ITS_SCOPE = {
    "postJobs",
    "postJobsBatch",
    "postJobsActivate",
    "postJobsActivation",
    "getJobsStream",
}


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(auth="required")


@dataclass
class World:
    live: Live
    tokens: dict[str, str]  # role or credential -> token
    key_ids: dict[str, str]
    jobs: dict[str, tuple[str, int]]  # target -> (key, activationCount) of an ACTIVATED job
    hidden_keys: set[str]  # every job key outside the scoped keys' scope
    victim: str  # a key id the admin may revoke


async def make_world(live: Live) -> World:
    keys = live.services.keys
    tokens: dict[str, str] = {}
    key_ids: dict[str, str] = {}
    for role in Role:
        scoped = role is not Role.ADMIN
        row, token = await keys.create(
            role,
            [IN_TENANT] if scoped else None,
            [IN_TYPE] if scoped else None,
            None,
            None,
            "matrix",
        )
        tokens[role.value], key_ids[role.value] = token, row.key_id
    row, tokens["revoked"] = await keys.create(Role.ADMIN, None, None, None, None, "matrix")
    await keys.revoke(row.key_id, "matrix")
    key_ids["revoked"] = row.key_id
    key_id, tokens["expired"] = new_token()
    key_ids["expired"] = key_id
    key_ids["malformed"] = "0123456789abcdef"
    past = utcnow() - timedelta(seconds=1)
    await key_rows.insert(
        live.services.db, key_id, digest(tokens["expired"]), "admin", None, None, None, past,
        past - timedelta(days=1), "matrix",
    )  # fmt: skip
    tokens["malformed"] = "jf_0123456789abcdef_" + "A" * 43
    victim, _ = await keys.create(Role.WORKER, None, None, "victim", None, "matrix")
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    c = live.client
    jobs: dict[str, tuple[str, int]] = {}
    hidden: set[str] = set()
    for target, (tenant, job_type) in TARGETS.items():
        variables = {"secret": HIDDEN_VALUE if target != "in" else "visible"}
        batch = [{"type": job_type, "tenantId": tenant, "variables": variables}] * 40
        r = await c.post("/v2/jobs/batch", json={"jobs": batch}, headers=admin)
        assert r.status_code == 201, r.text
        if target != "in":
            hidden.update(r.json()["jobKeys"])
        act = {"type": job_type, "maxJobs": 20, "timeout": 600_000, "requestTimeout": -1}
        r = await c.post("/v2/jobs/activate", json={**act, "tenantIds": [tenant]}, headers=admin)
        first = r.json()["jobs"][0]
        jobs[target] = (first["jobKey"], first["activationCount"])
    return World(live, tokens, key_ids, jobs, hidden, victim.key_id)


def _fill(template: Any, values: dict[str, Any]) -> Any:
    if isinstance(template, str):
        if template in values and not isinstance(values[template], str):
            return values[template]
        for name, value in values.items():
            template = template.replace(name, str(value))
        return template
    if isinstance(template, list):
        return [_fill(t, values) for t in template]
    if isinstance(template, dict):
        return {k: _fill(v, values) for k, v in template.items()}
    return template


def request_of(op: Operation, world: World, target: str) -> tuple[str, str | None, Any]:
    """(url, query, body) of ``op`` aimed at ``target``."""
    tenant, job_type = TARGETS[target]
    key, count = world.jobs[target]
    values = {"{tenant}": tenant, "{type}": job_type, "{k}": key, "{n}": count}
    path = op.path
    for name, value in {
        "{jobKey}": key,
        "{tenantId}": tenant,
        "{fairnessKey}": "user:1",
        "{type}": job_type,
        "{keyId}": world.victim,
        "{asset}": "app.js",
    }.items():
        path = path.replace(name, value)
    query = _fill(QUERIES[op.operation_id], values) if op.operation_id in QUERIES else None
    body = _fill(BODIES[op.operation_id], values) if op.operation_id in BODIES else None
    return path, query, body


def expectation(op: Operation, role: Role, target: str, credential: str) -> Callable[[int], bool]:
    """What the cell's status must satisfy."""
    needed = op.permission
    if op.operation_id == "postOauthToken":  # the key is its credentials (HTTP Basic)
        expected = {"valid": 200, "none": 400}.get(credential, 401)
        return lambda s: s == expected
    if needed is Permission.PUBLIC or needed is Permission.DOCS:  # docs open by default
        return lambda s: s == 200
    if credential != "valid":
        return lambda s: s == 401
    if needed not in ROLES[role]:
        return lambda s: s == 403
    scoped = role is not Role.ADMIN
    if scoped and target != "in":
        if "{jobKey}" in op.path:
            return lambda s: s == 404
        if op.operation_id in NAMES_ITS_SCOPE:
            return lambda s: s == 403
    # Allowed: a job finished by an earlier cell answers 409, never 401/403/404; an
    # operator's call may find no configuration (404).
    refused = (401, 403, 404) if "{jobKey}" in op.path else (401, 403)
    return lambda s: s < 500 and s not in refused


def headers_of(op: Operation, world: World, role: Role, credential: str) -> dict[str, str]:
    form = {"content-type": "application/x-www-form-urlencoded"}
    if credential == "none":
        return form if op.operation_id == "postOauthToken" else {}
    name = role.value if credential == "valid" else credential
    token = world.tokens[name]
    if op.operation_id == "postOauthToken":
        pair = f"{world.key_ids[name]}:{token}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode(), **form}
    return {"Authorization": f"Bearer {token}"}


def leaks(text: str, world: World, role: Role, named: set[str]) -> list[str]:
    """What of another scope ``text`` shows to a scoped key (beyond what it named)."""
    if role is Role.ADMIN:
        return []
    found = [k for k in world.hidden_keys - named if k in text]
    for word in (HIDDEN_VALUE, OUT_TENANT, OUT_TYPE):
        if word in text and word not in named:
            found.append(word)
    return found


async def call(
    c: httpx.AsyncClient, op: Operation, url: str, headers: dict[str, str], body: Any
) -> tuple[int, str, httpx.Headers]:
    if op.operation_id == "getJobsStream":  # the status alone: an open stream never ends
        async with c.stream("GET", url, headers=headers, timeout=10) as r:
            text = "" if r.status_code == 200 else (await r.aread()).decode()
            return r.status_code, text, r.headers
    if isinstance(body, str):
        r = await c.request(op.method, url, content=body.encode(), headers=headers)
    else:
        r = await c.request(op.method, url, json=body, headers=headers)
    return r.status_code, r.text, r.headers


async def test_every_operation_role_scope_and_credential(live: Live):
    world = await make_world(live)
    c = live.client
    failures: list[str] = []
    cells = 0
    covered: set[str] = set()
    for op in OPERATIONS:
        if op.body is not None:
            assert op.operation_id in BODIES, f"give {op.operation_id} a body in BODIES"
        covered.add(op.operation_id)
        for target in TARGETS:
            path, query, body = request_of(op, world, target)
            url = f"{path}?{query}" if query else path
            names_job = "{jobKey}" in op.path or op.operation_id == "postJobsComplete"
            named = {*TARGETS[target], *([world.jobs[target][0]] if names_job else [])}
            for credential in CREDENTIALS:
                # A key that is not valid is 401 whatever it aims at: one target suffices.
                if credential != "valid" and target != "in":
                    continue
                roles = list(Role) if credential == "valid" else [Role.WORKER]
                for role in roles:
                    sent = headers_of(op, world, role, credential)
                    status, text, answer = await call(c, op, url, sent, body)
                    cells += 1
                    cell = f"{op.method} {op.path} role={role} target={target} key={credential}"
                    if not expectation(op, role, target, credential)(status):
                        failures.append(f"{cell}: {status} {text[:200]}")
                    elif credential == "valid" and (found := leaks(text, world, role, named)):
                        failures.append(f"{cell}: leaked {found[:5]}")
                    if status == 401 and "www-authenticate" not in answer:
                        failures.append(f"{cell}: a 401 without WWW-Authenticate")
                    hidden = role is not Role.ADMIN and target != "in"
                    if op.operation_id == "postJobsComplete" and status == 200 and hidden:
                        if json.loads(text)["results"][0]["status"] != 404:
                            failures.append(f"{cell}: another scope's job was judged: {text}")
    assert covered == {op.operation_id for op in OPERATIONS}
    assert not failures, f"{len(failures)} of {cells} cells wrong:\n" + "\n".join(failures[:40])
    assert cells > 400


async def test_a_scoped_stream_never_delivers_another_scopes_jobs(live: Live):
    """Only another tenant's jobs of the type are ready when the scoped worker's stream
    opens; its first event is still its own job, created after it opened."""
    world = await make_world(live)
    c = live.client
    admin = {"Authorization": f"Bearer {world.tokens['admin']}"}
    worker = {"Authorization": f"Bearer {world.tokens['worker']}"}
    take = {"type": IN_TYPE, "maxJobs": 100, "timeout": 600_000, "requestTimeout": -1}
    r = await c.post("/v2/jobs/activate", json={**take, "tenantIds": [IN_TENANT]}, headers=admin)
    assert len(r.json()["jobs"]) == 20  # the world's own ready ones: none is left
    url = f"/v2/jobs/stream?type={IN_TYPE}&maxJobs=5&timeout=60000"
    async with c.stream("GET", url, headers=worker, timeout=30) as stream:
        assert stream.status_code == 200
        r = await c.post("/v2/jobs", json={"type": IN_TYPE, "tenantId": IN_TENANT}, headers=admin)
        mine = r.json()["jobKey"]
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                first = json.loads(line[5:])
                break
    assert first["jobKey"] == mine, first
    ready = await live.services.db.fetchval(
        "SELECT count(*) FROM jobs WHERE state = 'CREATED' AND (tenant_id, job_type) <> ($1, $2)",
        IN_TENANT,
        IN_TYPE,
    )
    assert ready == 40  # both other-scope lanes untouched: 20 + 20 still ready
