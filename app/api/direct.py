"""The calls made per job, answered without FastAPI's per-request machinery.

A worker finishing jobs one at a time makes one request per job, and so does a producer
creating them one at a time.  FastAPI's route search, endpoint wrapper and exception
middleware cost more per request here than the work itself (ADR 008 has the figures
of ``python -m bench.run ceiling``: an empty FastAPI route against the same as bare
ASGI).  ``App`` answers the hot operations of the route table (``app.api.routes``) by
calling their endpoints, after the same ``authorize`` and with the same problem+json
mapping; every other request goes on to FastAPI, which routes the same table, so the
OpenAPI document and the behaviour do not change.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from app.admission import Admission
from app.api import problems, security, tracing
from app.api.operation import Operation
from app.errors import JobfairError, Overloaded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: re.Pattern[str]
    operation: Operation
    # The routes FastAPI would try first for the same method, as one pattern: a path it
    # matches is theirs, exactly as in FastAPI's own in-order search.
    shadowed_by: re.Pattern[str] | None


def _pattern(op: Operation) -> re.Pattern[str]:
    """The pattern FastAPI's route for ``op`` matches paths with (``APIRoute.path_regex``)."""
    pattern, _, _ = compile_path(op.route_path)
    return pattern


def _routes(operations: Sequence[Operation]) -> list[_Route]:
    found: list[_Route] = []
    for i, op in enumerate(operations):
        if op.hot:
            shadows = [_pattern(e) for e in operations[:i] if op.method in e.methods]
            found.append(_Route(op.method, _pattern(op), op, _any_of(shadows)))
    return found


def _any_of(patterns: Sequence[re.Pattern[str]]) -> re.Pattern[str] | None:
    """One pattern matching what any of ``patterns`` matches (their group names dropped:
    a name may not repeat in one pattern)."""
    if not patterns:
        return None
    unnamed = (re.sub(r"\(\?P<\w+>", "(?:", p.pattern) for p in patterns)
    return re.compile("|".join(f"(?:{p})" for p in unnamed))


class DirectRoutes:
    """The ``hot`` operations of ``operations`` (given in the order the app routes them),
    their endpoints called directly."""

    def __init__(self, operations: Sequence[Operation]) -> None:
        self.routes = _routes(operations)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request if it is one of ours; False leaves it to the caller."""
        if scope["type"] != "http":
            return False
        for route in self.routes:
            if scope["method"] != route.method:
                continue
            match = route.pattern.match(scope["path"])
            if match is None or (route.shadowed_by and route.shadowed_by.match(scope["path"])):
                continue
            response = await _answer(route.operation, Request(scope, receive), match)
            await response(scope, receive, send)
            return True
        return False


def literal_paths(operations: Sequence[Operation]) -> dict[str, frozenset[str]]:
    """The methods of each path that an operation names without parameters."""
    methods: dict[str, set[str]] = {}
    for op in operations:
        if "{" not in op.route_path:
            methods.setdefault(op.route_path, set()).update(op.methods)
    return {path: frozenset(m) for path, m in methods.items()}


class App(FastAPI):
    """FastAPI, with ``direct`` routes answered before any of FastAPI's own machinery
    (its telemetry check and middleware stack, not only its routing).

    A path that a route names literally (``/v2/jobs/activate``) is that resource's
    alone: another method on it is 405, not taken by a parameter route that also matches
    it (``PATCH /v2/jobs/{jobKey}`` would answer 400, "activate" is not a job key)."""

    direct: DirectRoutes | None = None
    literal: dict[str, frozenset[str]] = {}
    admission: Admission = Admission(0)
    gate: security.Gate | None = None  # set while the lifespan runs
    access_log = False  # an access-log line per request (tracing)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await tracing.traced(self._serve, scope, receive, send, access_log=self.access_log)
        else:
            await super().__call__(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self  # what Request.app reads, as Starlette sets it
        try:
            self.admission.enter(scope)
        except Overloaded as exc:  # before the body is read: refusing must cost little
            await problems.answer(Request(scope, receive), exc)(scope, receive, send)
            return
        try:
            await self._admitted(scope, receive, send)
        finally:
            self.admission.leave(scope)

    async def _admitted(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            owned = self.literal.get(scope["path"])
            if owned is not None and scope["method"] not in owned:
                allow = {"Allow": ", ".join(sorted(owned))}
                detail = f"{scope['method']} is not a method of {scope['path']}"
                response = problems.problem(
                    405,
                    problems.METHOD_NOT_ALLOWED,
                    "METHOD_NOT_ALLOWED",
                    detail,
                    scope["path"],
                    allow,
                )
                await response(scope, receive, send)
                return
        if self.direct is not None:
            if await self.direct.serve(scope, receive, send):
                return
        await super().__call__(scope, receive, send)


async def _answer(op: Operation, request: Request, match: re.Match[str]) -> Response:
    try:
        await security.authorize(request, op)
        return await op.endpoint(request, **match.groupdict())
    except JobfairError as exc:
        return problems.answer(request, exc)
    except ClientDisconnect:
        return problems.client_gone(request.url.path)
    # Anything else is a bug: logged and answered where the request entered (tracing).
