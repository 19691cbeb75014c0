"""clients/openapi.json: generated from the app, valid OpenAPI 3.1, complete, and current."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.routing import APIRoute
from openapi_spec_validator import validate

from app.api import openapi
from app.api.operation import ENDPOINT_PARAMS
from app.api.routes import OPERATIONS
from app.config import Settings
from app.main import create_app

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "clients" / "openapi.json"
# FastAPI's own pages and Swagger UI's files, not part of API.md.
NOT_API = {op.route_path for op in OPERATIONS if not op.documented}


def _routes() -> set[tuple[str, str]]:
    found = set()
    for route in create_app(Settings(), "postgresql://unused/unused", background=False).routes:
        assert isinstance(route, APIRoute), route
        path = route.path
        if path in NOT_API:
            continue
        # The routes name their path parameters after Python; API.md after the wire.
        for wire, python in ENDPOINT_PARAMS.items():
            path = path.replace(python, wire)
        for method in route.methods - {"HEAD"}:
            found.add((method.lower(), path))
    return found


def test_the_app_serves_the_same_spec():
    app = create_app(Settings(), "postgresql://unused/unused", background=False)
    assert app.openapi() == openapi.build()


def test_the_committed_spec_is_current():
    assert COMMITTED.read_bytes() == openapi.render(), (
        "clients/openapi.json is stale: run `make openapi` and commit it"
    )


def test_the_spec_is_valid_openapi():
    validate(json.loads(COMMITTED.read_text()))


def test_every_route_is_described_and_nothing_else():
    described = {(m, p) for p, ops in openapi.build()["paths"].items() for m in ops}
    assert described == _routes()


def test_errors_are_problem_json_and_bodies_are_the_validated_models():
    spec = openapi.build()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for status, answer in op["responses"].items():
                if status.startswith(("4", "5")):
                    assert list(answer["content"]) == ["application/problem+json"], (path, status)
            bodyless = path == "/v2/jobs/{jobKey}/cancel" or path.endswith(("/pause", "/resume"))
            if method in ("post", "put", "patch") and not bodyless:
                assert "requestBody" in op, (method, path)
            if method in ("post", "put", "patch") and "requestBody" in op:
                assert "400" in op["responses"], (method, path)
    create = spec["components"]["schemas"]["CreateJob"]
    assert create["additionalProperties"] is False and create["required"] == ["type"]
    job = spec["components"]["schemas"]["Job"]
    assert {"jobKey", "activationCount", "deadline", "effectivePriority"} <= set(job["properties"])
