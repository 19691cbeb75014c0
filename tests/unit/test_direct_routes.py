"""DirectRoutes answers exactly the requests FastAPI would have sent to the same endpoints,
with the same problem+json, and leaves every other request to FastAPI.  (The real hot
routes are exercised through it by every acceptance test that activates or finishes.)"""

from __future__ import annotations

import httpx
import pytest
from fastapi import Request
from starlette.responses import Response

from app.api import problems
from app.api.direct import App, DirectRoutes
from app.api.operation import Operation, include
from app.api.routes import OPERATIONS
from app.api.security import Permission
from app.errors import InvalidArgument, ResourceExhausted

served_by: list[str] = []


async def special(request: Request) -> Response:
    served_by.append("fastapi:special")
    return Response(b"special", status_code=200)


async def poke(request: Request, key: str) -> Response:
    served_by.append(f"direct:{key}:{request.url.path}")
    if key == "bad":
        raise InvalidArgument("key must not be bad")
    if key == "busy":
        raise ResourceExhausted("too busy", retry_after_s=3)
    if key == "bug":
        raise RuntimeError("a bug")
    return Response(await request.body(), status_code=201)


async def get_thing(request: Request, key: str) -> Response:
    served_by.append("fastapi:get")
    return Response(b"got", status_code=200)


# In the order they are routed: the first takes a path the second also matches.
THINGS = (
    Operation("POST", "/things/special/poke", special, Permission.PUBLIC, "special", "t"),
    Operation("POST", "/things/{key}/poke", poke, Permission.PUBLIC, "poke", "t", hot=True),
    Operation("GET", "/things/{key}", get_thing, Permission.PUBLIC, "get", "t"),
)


def make_app() -> App:
    app = App()
    problems.install(app)
    include(app, THINGS)
    app.direct = DirectRoutes(THINGS)
    return app


@pytest.fixture
async def client():
    served_by.clear()
    transport = httpx.ASGITransport(app=make_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


async def test_a_direct_route_gets_its_path_parameters_and_body(client):
    r = await client.post("/things/42/poke", content=b"hello")
    assert (r.status_code, r.content) == (201, b"hello")
    assert served_by == ["direct:42:/things/42/poke"]


async def test_a_path_an_earlier_route_matches_stays_with_that_route(client):
    r = await client.post("/things/special/poke")
    assert (r.status_code, r.content) == (200, b"special")
    assert served_by == ["fastapi:special"]


async def test_other_methods_and_paths_go_on_to_fastapi(client):
    assert (await client.get("/things/42")).status_code == 200
    assert served_by == ["fastapi:get"]
    r = await client.put("/things/42/poke")  # FastAPI's own 405, through its handler
    assert r.status_code == 405
    assert r.headers["content-type"] == problems.PROBLEM


@pytest.mark.parametrize(
    ("key", "status", "title", "retry_after"),
    [("bad", 400, "INVALID_ARGUMENT", None), ("busy", 503, "RESOURCE_EXHAUSTED", "3")],
)
async def test_domain_errors_are_the_same_problems(client, key, status, title, retry_after):
    r = await client.post(f"/things/{key}/poke")
    assert r.status_code == status
    assert r.headers["content-type"] == problems.PROBLEM
    assert r.json()["title"] == title
    assert r.json()["instance"] == f"/things/{key}/poke"
    assert r.headers.get("retry-after") == retry_after


async def test_a_bug_is_a_500_problem_not_a_dropped_connection(client):
    r = await client.post("/things/bug/poke")
    assert r.status_code == 500
    assert r.json()["title"] == "INTERNAL"


def test_the_direct_routes_are_the_hot_operations_in_their_order():
    direct = DirectRoutes(OPERATIONS)
    assert [r.operation for r in direct.routes] == [op for op in OPERATIONS if op.hot]
    assert [r.operation.endpoint for r in DirectRoutes(THINGS).routes] == [poke]
