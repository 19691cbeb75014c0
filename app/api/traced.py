"""The server's spans (app.telemetry, docs/tracing.md) on the routes that create,
activate and finish jobs: the native ones, SSE streams and Camunda's.

- A create's span is a child of the producer's ``traceparent``, and each job it makes
  keeps the span's context (tracing off: the producer's own), so that the worker's span
  follows it.
- An activation's span is a child of the worker's ``traceparent``, linked to the trace
  each job it gave keeps, with the fairness decision -- how many jobs of each tenant and
  fairness key -- as attributes. A long poll's lasts from when it is asked until it is
  answered; a stream records one for each claim it writes (``jobfair.stream``).
- A finish's span is a child of the worker's ``traceparent``.

Camunda's routes record the same spans, with ``jobfair.api`` ``camunda``.  Off, each hook
is a test of one module global (``bench.otel``).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import Request

from app import telemetry
from app.activation import Activated, ActivateRequest
from app.api import schemas
from app.api.callers import HttpCaller
from app.db.rows import JobRow
from app.domain import DEFAULT_KEY, tenant_of

UNTRACED = contextlib.nullcontext()  # reusable: it holds nothing


def incoming_traceparent(request: Request) -> str | None:
    """The call's W3C ``traceparent`` header, if sane: read off the raw headers (ASGI
    lower-cases their names), which costs a create nothing to speak of when it has none
    (``bench.otel``)."""
    for name, value in request.scope["headers"]:
        if name == b"traceparent":
            return telemetry.traceparent(value.decode("latin-1"))
    return None


def create(request: Request, jobs: list[schemas.CreateJob]) -> Any:
    """The create's span, and each job keeping the trace its worker is to continue: the
    server span's, or with tracing off the producer's own."""
    parent = incoming_traceparent(request)
    if not telemetry.enabled():
        telemetry.keep(jobs, parent)  # type: ignore[arg-type]
        return UNTRACED
    tenants = sorted({tenant_of(j) for j in jobs})
    attributes = {"jobfair.type": sorted({j["type"] for j in jobs}), "jobfair.jobs": len(jobs)}
    attributes["jobfair.tenants"] = tenants[:100]
    return _keeping(telemetry.span("jobfair create", parent, attributes=attributes), jobs)


@contextlib.contextmanager
def _keeping(traced: Any, jobs: list[schemas.CreateJob]) -> Iterator[Any]:
    with traced as current:
        telemetry.keep(jobs, telemetry.traceparent_of(current))  # type: ignore[arg-type]
        yield current


async def long_poll(
    request: Request,
    req: ActivateRequest,
    caller: HttpCaller,
    request_timeout: int | None,
    api: str = "jobfair",
) -> Activated:
    """A long poll's jobs, in a span while tracing is on."""
    activation = caller.services.activation
    if not telemetry.enabled():
        return await activation.long_poll(req, caller, request_timeout)
    parent = incoming_traceparent(request)
    with telemetry.span("jobfair activate", parent, attributes=_asked(req, api)) as current:
        got = await activation.long_poll(req, caller, request_timeout)
        _decided(current, got.rows)
    return got


def stream_caller(request: Request, req: ActivateRequest) -> HttpCaller:
    """The caller of an SSE stream: one that records each claim's span while tracing is
    on."""
    if not telemetry.enabled():
        return HttpCaller(request)
    return _TracedStreamCaller(request, incoming_traceparent(request), _asked(req, "jobfair"))


class _TracedStreamCaller(HttpCaller):
    def __init__(self, request: Request, parent: str | None, asked: dict[str, Any]) -> None:
        super().__init__(request)
        self.parent = parent
        self.attributes = {**asked, "jobfair.stream": True}

    def received(self, rows: Sequence[JobRow]) -> None:
        super().received(rows)
        if rows and telemetry.enabled():
            with telemetry.span("jobfair activate", self.parent, attributes=self.attributes) as s:
                _decided(s, rows)


def _asked(req: ActivateRequest, api: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {"jobfair.type": req.job_type, "jobfair.max_jobs": req.max_jobs}
    if req.worker:
        attributes["jobfair.worker"] = req.worker
    if api != "jobfair":
        attributes["jobfair.api"] = api
    return attributes


def _decided(current: Any, rows: Sequence[JobRow]) -> None:
    """The fairness decision on the activation's span, and a link to each trace its
    jobs keep."""
    lanes = Counter(r.tenant_id for r in rows)
    keys = Counter(f"{r.tenant_id}/{r.fairness_key or DEFAULT_KEY}" for r in rows)
    current.set_attribute("jobfair.jobs", len(rows))
    current.set_attribute("jobfair.tenants", [f"{t}={n}" for t, n in sorted(lanes.items())])
    current.set_attribute("jobfair.keys", [f"{k}={n}" for k, n in sorted(keys.items())][:100])
    traces = (telemetry.traceparent((r.custom_headers or {}).get(telemetry.HEADER)) for r in rows)
    for kept in dict.fromkeys(traces):  # once each: a batch's jobs keep one
        if kept is not None:
            telemetry.link(current, kept)


def finish(request: Request, name: str, **attributes: Any) -> Any:
    """A finish in a span (tracing on): a child of the worker's ``traceparent``."""
    if not telemetry.enabled():
        return UNTRACED
    return telemetry.span(name, incoming_traceparent(request), attributes=attributes)
