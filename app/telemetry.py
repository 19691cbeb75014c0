"""Traces across services (issue 45 §5, docs/tracing.md): OpenTelemetry, opt-in.

A producer's W3C ``traceparent`` (the header of a create) is kept with each job it
creates, as its ``customHeaders.traceparent`` (unless the job gives one), and so handed
to the worker with every activation: a worker's client runs the handler in that trace.

With tracing on (``JOBFAIR_OTEL_ENABLED=true``, or one of the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, and
``OTEL_SDK_DISABLED`` not ``true``), the server records a span for each create (a child of
the producer's span; the job keeps the server span's context instead, so the worker's
span follows it), each activation (linked to every job's trace, with the type, the
tenants served and how many jobs each got: the fairness decision) and each finish (a
child of the worker's span when its call carries one).  Spans go over OTLP/HTTP as the
standard ``OTEL_*`` variables say, in batches.

Off, nothing of OpenTelemetry is imported, and the hooks are a check of one module
global (``bench.otel`` measures what that costs a create and a drain).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
HEADER = "traceparent"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_provider: Any = None


def wanted(enabled: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether tracing is asked for: ``JOBFAIR_OTEL_ENABLED``, or an OTLP endpoint
    variable, unless the SDK is disabled by its own variable."""
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return enabled or any(environ.get(v) for v in ENDPOINT_VARIABLES)


def configure(service_name: str, exporter: Any = None) -> None:
    """Turn tracing on: a tracer provider of ``service_name`` sending to ``exporter``
    (each span at its end: the tests' in-memory one) or, by default, to the OTLP/HTTP
    exporter the ``OTEL_*`` variables configure, in batches."""
    global _tracer, _provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _provider = provider
    _tracer = provider.get_tracer("jobfair")


def shutdown() -> None:
    """Send what is left and turn tracing off."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def enabled() -> bool:
    return _tracer is not None


def traceparent(value: object) -> str | None:
    """``value`` if it is a W3C traceparent of version 00 (lower-case hex, a trace id and
    a parent id not all zeros: the standard's invalid ones), else None: a job's own
    ``customHeaders.traceparent`` may be any JSON value."""
    if not isinstance(value, str) or not TRACEPARENT.fullmatch(value):
        return None
    if value[3:35] == "0" * 32 or value[36:52] == "0" * 16:
        return None
    return value


def _context(parent: str | None) -> Any:
    if parent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({HEADER: parent})


def _link(parent: str) -> Any:
    from opentelemetry.trace import Link, get_current_span

    return Link(get_current_span(_context(parent)).get_span_context())


@contextlib.contextmanager
def span(
    name: str,
    parent: str | None = None,
    *,
    links: Sequence[str] = (),
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """A server span ``name``, a child of ``parent`` (a traceparent) and linked to
    ``links``; None (and nothing recorded) while tracing is off."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        name,
        context=_context(parent),
        kind=SpanKind.SERVER,
        links=[_link(tp) for tp in dict.fromkeys(links)],
        attributes=dict(attributes or {}),
    ) as current:
        yield current


def link(current: Any, to: str) -> None:
    """Link the span ``current`` to the trace ``to`` (a traceparent)."""
    current.add_link(_link(to).context)


def traceparent_of(current: Any) -> str:
    """The W3C traceparent of a span ``span`` yielded."""
    ctx = current.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def keep(jobs: Sequence[dict[str, Any]], parent: str | None) -> None:
    """Each job's ``customHeaders.traceparent``: ``parent`` unless it gives one."""
    if parent is None:
        return
    for job in jobs:
        headers = job.get("customHeaders")
        if headers is None:
            job["customHeaders"] = {HEADER: parent}
        elif HEADER not in headers:
            headers[HEADER] = parent
