"""A corpus of hostile input, sent to every route the app has: each answer is a 4xx
problem+json, never a 5xx, and the database is as it was.

The routes are enumerated from the app and looked up in its OpenAPI document, so a new
route is covered as soon as it exists (and this test fails until the document describes
it and, if it takes a body, VALID_BODIES has one).  Each body route gets the generic
corpus (bytes that are not JSON, JSON that is not an object, a body too deep, too large,
or in another media type) and every mutation of a valid body that must be refused: a NUL
appended to each string and each key, each number made an integer beyond 64 bits, NaN,
Infinity, 1e400, or a number a double does not keep (1e-400, -0.0, 36 digits), and each
key of each object given twice."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute

from app.api import openapi
from app.api.operation import ENDPOINT_PARAMS
from app.api.routes import OPERATIONS as ROUTE_TABLE
from app.config import Settings
from app.main import create_app
from tests.fixtures import quiet_settings
from tests.helpers import activate

LIMIT = 256 * 1024
HOLE = "\x01hostile\x01"  # where a raw JSON token goes in a mutated body

# Free-form values with a string, a number, a list and an object in them, to mutate.
VALUES = {"s": "v", "n": 1, "l": [2, "x"], "o": {"k": 2.5}}
JOB = {
    "type": "t",
    "tenantId": "acme",
    "priority": 5,
    "retries": 2,
    "variables": VALUES,
    "customHeaders": {"h": "x"},
    "idempotencyKey": "i",
    "delay": 10,
}
# One valid body per operation that takes one ({k}: an ACTIVATED job at activation 1).
VALID_BODIES: dict[str, Any] = {
    "postJobs": JOB,
    "postJobsBatch": {"jobs": [JOB]},
    "postJobsActivate": {
        "type": "t",
        "maxJobs": 1,
        "timeout": 1000,
        "worker": "w",
        "requestTimeout": -1,
        "tenantIds": ["acme"],
        "fetchVariables": ["s"],
    },
    "postJobsActivation": {
        "type": "t",
        "maxJobsToActivate": 1,
        "timeout": 1000,
        "worker": "w",
        "requestTimeout": -1,
        "tenantIds": ["acme"],
        "fetchVariable": ["s"],
    },
    "postJobsComplete": {"jobs": [{"jobKey": "{k}", "activationCount": 1, "variables": VALUES}]},
    "postJobsSearch": {
        "filter": {
            "jobKey": "{k}",
            "type": "t",
            "state": "CREATED",
            "tenantId": {"$eq": "acme"},
            "worker": {"$in": ["w"]},
            "retries": {"$eq": 3},
        },
        "sort": [{"field": "jobKey", "order": "ASC"}],
        "page": {"limit": 10, "from": 0},
    },
    "patchJobsByKey": {
        "changeset": {"retries": 2, "timeout": 1000, "priority": 5},
        "activationCount": 1,
        "operationReference": 1,
    },
    "postJobsCompleteByKey": {"activationCount": 1, "variables": VALUES},
    "postJobsCompletionByKey": {"variables": VALUES, "result": {"r": 1}},
    "postJobsErrorByKey": {
        "activationCount": 1,
        "errorCode": "E",
        "errorMessage": "m",
        "variables": VALUES,
        "operationReference": 1,
    },
    "postJobsFailByKey": {
        "activationCount": 1,
        "retries": 1,
        "errorMessage": "m",
        "retryBackOff": 10,
        "variables": VALUES,
    },
    "postJobsFailureByKey": {
        "retries": 1,
        "errorMessage": "m",
        "retryBackOff": 10,
        "variables": VALUES,
    },
    "putJobTypesByKey": {
        "maxActiveJobs": 5,
        "agingIntervalMs": 1000,
        "agingStep": 5,
        "rateLimit": {"perSecond": 50, "burst": 100},
    },
    "putTenantsByKey": {
        "weight": 2,
        "maxActiveJobs": 5,
        "rateLimit": {"perSecond": 0.5, "burst": 1},
    },
    "putTenantsKeysByKey": {"weight": 2},
    "postJobsRetry": {
        "type": "t",
        "tenantId": "acme",
        "createdAfter": "2026-01-01T00:00:00Z",
        "createdBefore": "2027-01-01T00:00:00Z",
        "retries": 2,
        "limit": 10,
    },
    "postJobsCancel": {"tenantId": "acme", "type": "t", "limit": 10},
    "postKeys": {
        "role": "worker",
        "tenants": ["acme"],
        "types": ["t"],
        "name": "n",
        "expiresAt": "2099-01-01T00:00:00Z",
    },
}

NOT_JSON = {
    "invalid UTF-8": b'{"type": "\xff\xfe"}',
    "UTF-8 of a surrogate": b'{"type": "\xed\xa0\x80"}',
    "a lone surrogate escaped": b'{"type": "\\ud800"}',
    "a raw NUL byte": b'{"type": "a\x00b"}',
    "100,000 levels of [": b"[" * 100_000,
    "50,000 levels of {": b'{"a": ' * 50_000,
    "truncated": b'{"type": "t"',
    "a byte-order mark": b'\xef\xbb\xbf{"type": "t"}',
    "JSON then garbage": b'{"type": "t"} x',
    "an array": b"[]",
    "a string": b'"x"',
    "a number": b"1",
    "null": b"null",
    "true": b"true",
    "NaN": b"NaN",
    "a 400-digit integer": b"1" + b"0" * 400,
    "1e400": b"1e400",
}
OTHER_MEDIA = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "text/xml")
BAD_TOKENS = {
    "2^64": str(1 << 64),
    "-2^63-1": str(-(1 << 63) - 1),
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "1e400": "1e400",
    # A double does not keep them as sent (issue 39 section 2).
    "1e-400": "1e-400",
    "-0.0": "-0.0",
    "36 digits": "0.1000000000000000055511151231257827",
}
# Path parameters no route may take (each is percent-encoded as sent).
BAD_PATH_VALUES = {
    "jobKey": ["%00", "1%00", "%C2%B2", "%D9%A1%D9%A2", "%EF%BC%91", "%ED%A0%80", "%FF",
               "1%0A", "-1", "9223372036854775808", "99999999999999999999", "1.0"],
    "tenantId": ["a%00", "%00", "acme%0A", "%ED%A0%80", "%FF", "a" * 32, "%3Cother%3E"],
    "fairnessKey": ["a%00", "k%0A", "%ED%A0%80", "%FF", "a%20b", "a" * 129, "%3Cother%3E"],
    "type": ["a%00", "t%0A", "%ED%A0%80", "%FF", "a%20b", "a" * 129],
    "keyId": ["a%00", "%ED%A0%80", "%FF", "0123456789abcdef%0A", "a" * 201, "%3Cother%3E"],
}  # fmt: skip
# NUL; bytes that are not UTF-8 (a lone surrogate's encoding, a stray byte, a cut
# sequence), which Starlette would have read as U+FFFD.
BAD_QUERY_TEXT = ["a%00", "%ED%A0%80", "a%FF", "%C3"]
BAD_QUERY_INTEGERS = ["%D9%A1", "1_0", "%201", "1.5", "99999999999999999999", "0x10", ""]
# Wire names of the routes' path parameters (the routes name them after Python).
WIRE_NAMES = {python: wire for wire, python in ENDPOINT_PARAMS.items()}
# FastAPI's own pages and Swagger UI's files: not in the document.
NOT_API = {op.route_path for op in ROUTE_TABLE if not op.documented}


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(max_body_bytes=LIMIT)


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, documented path, operation) of every route of the app."""
    doc = openapi.build()["paths"]
    found = []
    routes = create_app(Settings(), "postgresql://unused/unused", background=False).routes
    for route in routes:
        if not isinstance(route, APIRoute) or route.path in NOT_API:
            continue
        path = route.path
        for python, wire in WIRE_NAMES.items():
            path = path.replace(python, wire)
        for method in sorted(route.methods or ()):
            op = doc.get(path, {}).get(method.lower())
            assert op is not None, f"{method} {path} is a route the document does not describe"
            found.append((method, path, op))
    return found


OPERATIONS = _operations()
# JSON bodies (the OAuth token request's form body has its own corpus, test_security).
BODY_OPERATIONS = [
    o for o in OPERATIONS if "application/json" in o[2].get("requestBody", {}).get("content", {})
]


def _id(op: tuple[str, str, dict[str, Any]]) -> str:
    return str(op[2]["operationId"])


def test_every_operation_that_takes_a_body_has_a_valid_one_here():
    assert {_id(o) for o in BODY_OPERATIONS} == set(VALID_BODIES)


def _mutations(value: Any) -> Iterator[tuple[str, Any]]:
    """Every copy of ``value`` with one string or key NUL-ed or one number made ``HOLE``."""
    if isinstance(value, str):
        yield "NUL", value + "\x00"
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        yield "number", HOLE
    elif isinstance(value, list):
        for i, item in enumerate(value):
            for what, m in _mutations(item):
                yield f"{i}.{what}", [*value[:i], m, *value[i + 1 :]]
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f"key {key}", {(k + "\x00" if k == key else k): v for k, v in value.items()}
            for what, m in _mutations(item):
                yield f"{key}.{what}", {**value, key: m}


def _twice(value: Any) -> Iterator[tuple[str, str]]:
    """``value`` as JSON text with one key of one of its objects given twice (the second
    time as null), for every key of every object in it."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            for what, text in _twice(item):
                parts = [json.dumps(v) for v in value]
                parts[i] = text
                yield f"{i}.{what}", "[" + ", ".join(parts) + "]"
    elif isinstance(value, dict):
        for key in value:
            again = json.dumps(key) + ": null"
            body = ", ".join(json.dumps(k) + ": " + json.dumps(v) for k, v in value.items())
            yield f"key {key} twice", "{" + body + ", " + again + "}"
            for what, text in _twice(value[key]):
                parts = [
                    json.dumps(k) + ": " + (text if k == key else json.dumps(v))
                    for k, v in value.items()
                ]
                yield f"{key}.{what}", "{" + ", ".join(parts) + "}"


def _hostile_bodies(valid: Any) -> Iterator[tuple[str, bytes]]:
    for what, mutated in _mutations(valid):
        text = json.dumps(mutated)
        if json.dumps(HOLE) in text:
            for name, token in BAD_TOKENS.items():
                yield f"{what} {name}", text.replace(json.dumps(HOLE), token).encode()
        else:
            yield what, text.encode()
    for what, text in _twice(valid):
        yield what, text.encode()


class World:
    def __init__(self, live: Any, store: Any) -> None:
        self.live, self.store = live, store
        self.fill: dict[str, str] = {}

    async def setup(self) -> None:
        c = self.live.client
        for _ in range(2):  # one to hold ACTIVATED, one CREATED (an activation would take it)
            assert (
                await c.post("/v2/jobs", json={**JOB, "idempotencyKey": None, "delay": None})
            ).status_code == 201
        [job] = await activate(c, "t", tenantIds=["acme"])
        assert (await c.put("/v2/tenants/acme", json={"weight": 3})).status_code == 200
        # The activation charges its lane after answering: let it, before the snapshot.
        await self.live.services.activation.settle()
        self.fill = {
            "{jobKey}": job["jobKey"],
            "{tenantId}": "acme",
            "{fairnessKey}": "user:1",
            "{type}": "t",
        }
        self.before = await self.tables()

    async def tables(self) -> str:
        """A digest of every row of every table a request could change."""
        parts = ", ".join(
            f"(SELECT string_agg(x::text, ',' ORDER BY x::text) FROM {t} x)"
            for t in (
                "jobs",
                "lanes",
                "lane_keys",
                "key_weights",
                "tenants",
                "job_types",
                "api_keys",
                "signing_keys",
            )
        )
        return str(await self.store.fetchval(f"SELECT md5(concat_ws('|', {parts}))"))

    def url(self, path: str, **overrides: str) -> str:
        for name, value in {**self.fill, **overrides}.items():
            path = path.replace(name, value)
        return path

    def body(self, op_id: str) -> Any:
        text = json.dumps(VALID_BODIES[op_id]).replace('"{k}"', json.dumps(self.fill["{jobKey}"]))
        return json.loads(text)

    async def refused(
        self,
        method: str,
        url: str,
        content: bytes | None,
        what: str,
        media: str = "application/json",
    ) -> None:
        """The answer is a 4xx problem+json, and nothing changed."""
        headers = {"content-type": media} if content is not None else {}
        # A short timeout: a stream wrongly opened would never end.
        r = await self.live.client.request(
            method, url, content=content, headers=headers, timeout=10
        )
        assert 400 <= r.status_code < 500, (method, url, what, r.status_code, r.text[:300])
        assert r.headers["content-type"].startswith("application/problem+json"), (url, what)
        assert r.json()["status"] == r.status_code
        assert await self.tables() == self.before, (method, url, what, "changed the database")


@pytest.fixture
async def world(live, store) -> World:
    w = World(live, store)
    await w.setup()
    return w


@pytest.mark.parametrize("op", BODY_OPERATIONS, ids=_id)
async def test_every_hostile_body_is_a_4xx_and_changes_nothing(world, op):
    method, path, operation = op
    url = world.url(path)
    required = operation["requestBody"]["required"]
    for what, content in NOT_JSON.items():
        await world.refused(method, url, content, what)
    if required:
        await world.refused(method, url, b"", "empty")
        await world.refused(method, url, b"   \n", "only white space")
    big = b'{"type": "' + b"x" * LIMIT + b'"}'
    await world.refused(method, url, big, "over the limit")
    valid = json.dumps(world.body(operation["operationId"])).encode()
    for media in OTHER_MEDIA:
        await world.refused(method, url, valid, media, media=media)
    for what, content in _hostile_bodies(world.body(operation["operationId"])):
        await world.refused(method, url, content, what)


async def test_a_query_parameter_that_is_not_utf8_is_refused_by_name(world):
    for url in ("/v2/stats?type=%FF", "/v2/jobs/stream?type=t&maxJobs=1&worker=%ED%A0%80"):
        await world.refused("GET", url, None, url)
    r = await world.live.client.get("/v2/stats?type=%FF")
    assert "'type'" in r.json()["detail"]


async def test_a_body_over_the_limit_is_413(world):
    r = await world.live.client.post("/v2/jobs", content=b"[" + b" " * LIMIT + b"]")
    assert r.status_code == 413 and r.json()["title"] == "PAYLOAD_TOO_LARGE"


@pytest.mark.parametrize("op", [o for o in OPERATIONS if "{" in o[1]], ids=_id)
async def test_every_hostile_path_parameter_is_a_4xx_and_changes_nothing(world, op):
    method, path, operation = op
    content = None
    if "requestBody" in operation:
        content = json.dumps(world.body(operation["operationId"])).encode()
    for name in re.findall(r"\{\w+\}", path):
        for value in BAD_PATH_VALUES[name.strip("{}")]:
            await world.refused(method, world.url(path, **{name: value}), content, value)


@pytest.mark.parametrize(
    "op", [o for o in OPERATIONS if "{" not in o[1] and "requestBody" not in o[2]], ids=_id
)
async def test_a_route_without_a_body_ignores_one_and_never_fails(world, op):
    method, path, operation = op
    query = {
        p["name"]: "1" if p["schema"].get("type") == "integer" else "t"
        for p in operation.get("parameters", [])
        if p["in"] == "query" and p["required"]
    }
    if query:  # the stream: every query value no parameter may take
        for p in operation["parameters"]:
            bad = BAD_QUERY_INTEGERS if p["schema"].get("type") == "integer" else BAD_QUERY_TEXT
            for value in bad:
                qs = "&".join(f"{k}={v}" for k, v in {**query, p["name"]: value}.items())
                await world.refused(method, f"{path}?{qs}", None, f"{p['name']}={value}")
        return
    for what, content in NOT_JSON.items():
        r = await world.live.client.request(method, path, content=content, timeout=10)
        assert r.status_code < 500, (path, what, r.text[:300])
        assert await world.tables() == world.before, (path, what)


@pytest.mark.parametrize("op_id", sorted(VALID_BODIES))
async def test_the_valid_bodies_are_valid(world, op_id):
    """The mutations above are refused for what they change, not for something else."""
    [(method, path, _)] = [o for o in BODY_OPERATIONS if _id(o) == op_id]
    r = await world.live.client.request(method, world.url(path), json=world.body(op_id))
    assert 200 <= r.status_code < 300, (op_id, r.text)
