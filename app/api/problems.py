"""problem+json (RFC 9457) for every error, from one place."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from app.api.parsing import describe_errors
from app.errors import InvalidArgument, JobfairError, OutcomeUnknown, Overloaded, StoreUnavailable
from app.logs import request_id

PROBLEM = "application/problem+json"
METHOD_NOT_ALLOWED = "urn:jobfair:method-not-allowed"


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def problem(
    status: int,
    type_: str,
    title: str,
    detail: str,
    instance: str,
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"type": type_, "title": title, "status": status, "detail": detail, "instance": instance}
    return Response(orjson.dumps(body), status_code=status, media_type=PROBLEM, headers=headers)


def from_error(exc: JobfairError, instance: str) -> Response:
    headers = dict(exc.headers) if exc.headers else None
    if exc.retry_after_s is not None:
        headers = (headers or {}) | {"Retry-After": str(exc.retry_after_s)}
    return problem(exc.status, exc.type, exc.title, exc.detail, instance, headers)


def answer(request: Request, exc: JobfairError) -> Response:
    """``exc`` answered for ``request``: as ``from_error``, a 503 counted in the metrics."""
    if exc.status == 503:
        services = getattr(request.app.state, "services", None)
        if services is not None:
            services.metrics.refused(_reason(exc))
    return from_error(exc, request.url.path)


def _reason(exc: JobfairError) -> str:
    """Why a 503 was answered, as ``jobfair_http_503_answers`` labels it."""
    if isinstance(exc, OutcomeUnknown):
        return "outcome_unknown"
    if isinstance(exc, StoreUnavailable):
        return "store_unavailable"
    if isinstance(exc, Overloaded):
        return "overloaded"
    return "resource_exhausted"


def internal(instance: str, request_id: str | None) -> Response:
    """A bug's answer, naming the request whose log entry has its traceback
    (``app.api.tracing`` logs it)."""
    detail = "an unexpected error occurred; it has been logged"
    if request_id is not None:
        detail += f" with requestId {request_id}"
    body = {
        "type": "urn:jobfair:internal",
        "title": "INTERNAL",
        "status": 500,
        "detail": detail,
        "instance": instance,
        "requestId": request_id,
    }
    return Response(orjson.dumps(body), status_code=500, media_type=PROBLEM)


def client_gone(instance: str) -> Response:
    """The answer to a request whose client went away mid-body (or sent it too slowly,
    app.infra.http): nobody reads it, and it is not an error of ours to log."""
    detail = "the client went away before its request's body arrived"
    return problem(400, "urn:jobfair:client-disconnected", "CLIENT_DISCONNECTED", detail, instance)


def install(app: FastAPI) -> None:
    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # Starlette raises the exception on after this answer; it is logged, once, where
        # the request entered (app.api.tracing).
        return internal(request.url.path, request_id.get())

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        return client_gone(request.url.path)

    @app.exception_handler(JobfairError)
    async def _domain(request: Request, exc: JobfairError) -> Response:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return problem(
            400,
            InvalidArgument.type,
            InvalidArgument.title,
            describe_errors(list(exc.errors())),
            request.url.path,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        titles = {
            404: ("urn:jobfair:not-found", "NOT_FOUND"),
            405: (METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED"),
        }
        type_, title = titles.get(exc.status_code, ("urn:jobfair:http", "HTTP_ERROR"))
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request.app, request.url.path))
        return problem(exc.status_code, type_, title, str(exc.detail), request.url.path, headers)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route answers on ``path`` (RFC 9110's ``Allow``).  Starlette's
    own 405 names only the methods of the first route matching the path, and a path
    here is often several routes (GET, PUT and DELETE of a tenant)."""
    methods = {
        m
        for route in _api_routes(app.routes)
        if route.path_regex.match(path)
        for m in route.methods or ()
    }
    return sorted(methods)


def _api_routes(routes: Iterable[Any]) -> Iterator[APIRoute]:
    """The API routes, also those of the routers the app includes (FastAPI keeps an
    included router whole, as one entry of ``app.routes``)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes)
