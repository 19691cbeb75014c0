"""The route table is the app's only registry of routes: every route the app answers
(FastAPI's and the direct dispatcher's) is an operation of it, declares a permission,
and passes ``security.authorize`` with that operation before its endpoint runs."""

from __future__ import annotations

import httpx
import pytest
from starlette.requests import Request

from app.api import security
from app.api.direct import App
from app.api.operation import Operation
from app.api.routes import OPERATIONS
from app.api.security import Permission
from app.config import Settings
from app.errors import JobfairError
from app.main import create_app

# A value for each path parameter: a valid one, so a route that matches is this one.
CONCRETE = {"{jobKey}": "1", "{tenantId}": "acme", "{type}": "t"}


def _app() -> App:
    app = create_app(Settings(), "postgresql://unused/unused", background=False)
    assert isinstance(app, App)
    return app


def _concrete(path: str) -> str:
    for param, value in CONCRETE.items():
        path = path.replace(param, value)
    return path


def test_every_route_of_the_app_is_an_operation_with_a_permission():
    by_route = {(m, op.route_path): op for op in OPERATIONS for m in op.methods}
    routed = set()
    for route in _app().routes:
        path, methods = getattr(route, "path", route), getattr(route, "methods", None) or {None}
        for method in methods:
            op = by_route.get((method, path))
            assert op is not None, f"{method} {path} is not an operation of app.api.routes"
            assert isinstance(op.permission, Permission)
            routed.add((method, path))
    assert routed == set(by_route), "an operation the app does not route"


def test_the_direct_routes_are_operations_with_a_permission():
    direct = _app().direct
    assert direct is not None
    assert [r.operation for r in direct.routes] == [op for op in OPERATIONS if op.hot]
    for route in direct.routes:
        assert route.operation in OPERATIONS
        assert isinstance(route.operation.permission, Permission)


def test_each_operation_is_declared_once():
    assert len({(op.method, op.path) for op in OPERATIONS}) == len(OPERATIONS)
    assert len({op.operation_id for op in OPERATIONS}) == len(OPERATIONS)


class Refused(JobfairError):
    status = 403
    type = "urn:test:refused"
    title = "REFUSED"


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: f"{op.method} {op.path}")
async def test_authorize_sees_every_operation_before_its_endpoint(monkeypatch, op: Operation):
    """With ``authorize`` refusing, every route answers its problem: the endpoint (which
    would need the database this app has not got) never runs."""
    seen: list[tuple[Operation, bool]] = []

    async def refuse(request: Request, operation: Operation) -> None:
        # FastAPI's routing leaves the endpoint in the scope; the direct dispatcher not.
        seen.append((operation, "endpoint" not in request.scope))
        raise Refused(f"{operation.permission.value} needed")

    monkeypatch.setattr(security, "authorize", refuse)
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.request(op.method, _concrete(op.path), content=b"{}")
    assert r.status_code == 403, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["detail"] == f"{op.permission.value} needed"
    assert seen == [(op, op.hot)]


def test_the_permissions_are_the_security_contracts():
    """What each operation needs, by group; changing it is a decision: make it here too."""
    expected = {
        # The dashboard's page and assets hold no data: it signs in to the API itself.
        Permission.PUBLIC: [
            "GET /healthz",
            "GET /readyz",
            "POST /oauth/token",
            "GET /ui",
            "GET /ui/{asset}",
        ],
        Permission.DOCS: [
            "GET /openapi.json",
            "GET /docs",
            "GET /docs/oauth2-redirect",
            "GET /docs/swagger-ui-bundle.js",
            "GET /docs/swagger-ui.css",
            "GET /docs/favicon.png",
        ],
        Permission.METRICS: ["GET /metrics"],
        Permission.AUTHENTICATED: ["GET /v2/topology", "GET /v2/whoami"],
        Permission.PRODUCE: [
            "POST /v2/jobs",
            "POST /v2/jobs/batch",
            "POST /v2/jobs/{jobKey}/cancel",
        ],
        Permission.READ_JOBS: [
            "GET /v2/jobs/{jobKey}",
            "POST /v2/jobs/search",
            "GET /v2/jobs",
            "GET /v2/jobs/{jobKey}/history",
            "GET /v2/jobs/{jobKey}/explain",
        ],
        Permission.READ_STATS: ["GET /v2/stats"],
        Permission.WORK: [
            "POST /v2/jobs/activate",
            "GET /v2/jobs/stream",
            "POST /v2/jobs/complete",
            "POST /v2/jobs/{jobKey}/complete",
            "POST /v2/jobs/{jobKey}/fail",
            "POST /v2/jobs/{jobKey}/error",
            "PATCH /v2/jobs/{jobKey}",
            "POST /v2/jobs/activation",
            "POST /v2/jobs/{jobKey}/completion",
            "POST /v2/jobs/{jobKey}/failure",
        ],
        Permission.ADMIN: [
            "GET /v2/tenants",
            "PUT /v2/tenants/{tenantId}",
            "GET /v2/tenants/{tenantId}",
            "DELETE /v2/tenants/{tenantId}",
            "PUT /v2/tenants/{tenantId}/keys/{fairnessKey}",
            "GET /v2/tenants/{tenantId}/keys/{fairnessKey}",
            "DELETE /v2/tenants/{tenantId}/keys/{fairnessKey}",
            "GET /v2/job-types",
            "PUT /v2/job-types/{type}",
            "GET /v2/job-types/{type}",
            "POST /v2/tenants/{tenantId}/pause",
            "POST /v2/tenants/{tenantId}/resume",
            "POST /v2/job-types/{type}/pause",
            "POST /v2/job-types/{type}/resume",
            "POST /v2/jobs/retry",
            "POST /v2/jobs/cancel",
            "GET /v2/workers",
            "POST /v2/keys",
            "GET /v2/keys",
            "DELETE /v2/keys/{keyId}",
        ],
    }
    declared = {f"{op.method} {op.path}": op.permission for op in OPERATIONS}
    assert declared == {name: p for p, names in expected.items() for name in names}
