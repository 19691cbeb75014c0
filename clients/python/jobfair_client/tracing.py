"""OpenTelemetry in the client, where it is installed (``pip install
'jobfair-client[otel]'``, or any opentelemetry-api): traces from the producer through the
server to the worker (docs/tracing.md).

- A create carries the caller's current span as a W3C ``traceparent`` header; the server
  keeps it with each job (its ``customHeaders.traceparent``).
- A worker runs each handler in a span ("<type> process", a consumer span) whose parent
  is the trace the job keeps, so one trace spans producer -> server -> worker; the span
  also links to it, and its finish carries it as ``traceparent``.

Without opentelemetry-api, or with no tracer provider set up by the application, both are
no-ops: the API's default tracer records nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - the extra is not installed
    propagate = trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from jobfair_client.models import Job

HEADER = "traceparent"


def headers() -> dict[str, str]:
    """The current span's context as headers (``traceparent``, ``tracestate``), or none."""
    if propagate is None:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def handling(job: Job) -> Iterator[Any]:
    """The span a handler runs in: a child of the job's trace (its
    ``customHeaders.traceparent``) and linked to it."""
    if trace is None:
        yield None
        return
    kept = job.custom_headers.get(HEADER)
    parent = propagate.extract({HEADER: kept}) if isinstance(kept, str) else None
    links = []
    if parent is not None:
        context = trace.get_current_span(parent).get_span_context()
        if context.is_valid:
            links.append(trace.Link(context))
    tracer = trace.get_tracer("jobfair_client")
    with tracer.start_as_current_span(
        f"{job.type} process",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "jobfair.job_key": job.key,
            "jobfair.type": job.type,
            "jobfair.tenant": job.tenant_id,
            "jobfair.activation_count": job.activation_count,
        },
    ) as span:
        yield span
