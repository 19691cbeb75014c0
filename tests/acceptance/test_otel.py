"""Issue 45 §5: one trace from the producer through the server to the worker, with
OpenTelemetry's in-memory exporter.  The producer creates a job in a span of its own;
the server, traced, records the create as a child of it and keeps that span's context
with the job; the Python worker runs the handler in a span of the same trace, and its
finish is a child of that; the activation is linked to the job's trace and carries the
fairness decision.  Traced off, the server keeps the producer's own context with the
job, and the worker's span continues the producer's trace all the same."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from jobfair_client import AsyncJobfair, AsyncWorker, Job
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app import telemetry

EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The client side's spans go to EXPORTER (the process's global tracer provider: what
    an application using the client sets up); the server's tracing is turned off after."""
    trace.set_tracer_provider(_PROVIDER)  # once per process; later calls are ignored
    EXPORTER.clear()
    yield EXPORTER
    telemetry.shutdown()
    EXPORTER.clear()


async def _produce_and_work(url: str) -> tuple[int, Job, dict[str, int]]:
    """A job created inside the producer's span, handled by a worker: the producer
    span's trace id, the job as the worker got it, and the trace ids the handler saw."""
    tracer = trace.get_tracer("producer")
    seen: dict[str, int] = {}
    got: list[Job] = []
    async with AsyncJobfair(url) as jf:
        with tracer.start_as_current_span("signup") as producer:
            await jf.create_job("mail", tenant_id="acme")

        async def handler(job: Job) -> None:
            got.append(job)
            seen["trace_id"] = trace.get_current_span().get_span_context().trace_id
            worker.stop()

        worker = AsyncWorker(jf, "mail", handler, concurrency=1, batch_completion=False)
        await asyncio.wait_for(worker.run(), 30)
    return producer.get_span_context().trace_id, got[0], seen


async def test_one_trace_spans_the_producer_the_server_and_the_worker(live, spans):
    server = InMemorySpanExporter()  # its own: shut down with the server's tracing
    telemetry.configure("jobfair", server)
    trace_id, job, seen = await _produce_and_work(live.url)
    finished = [*spans.get_finished_spans(), *server.get_finished_spans()]
    by_name = {s.name: s for s in finished}
    assert {"signup", "jobfair create", "mail process", "jobfair complete"} <= set(by_name)
    # One trace: producer -> server's create -> worker's handler -> server's complete.
    for name in ("jobfair create", "mail process", "jobfair complete"):
        assert by_name[name].context.trace_id == trace_id, name
    assert by_name["jobfair create"].parent.span_id == by_name["signup"].context.span_id
    assert by_name["mail process"].parent.span_id == by_name["jobfair create"].context.span_id
    assert by_name["jobfair complete"].parent.span_id == by_name["mail process"].context.span_id
    assert seen["trace_id"] == trace_id  # the handler ran in it
    # The job kept the server's create span, and was handed it with its activation.
    kept = job.custom_headers["traceparent"]
    assert kept == telemetry.traceparent_of(by_name["jobfair create"])
    # The activation: linked to the job's trace, with the fairness decision.
    activate = by_name["jobfair activate"]
    assert trace_id in {link.context.trace_id for link in activate.links}
    assert activate.attributes["jobfair.tenants"] == ("acme=1",)
    assert activate.attributes["jobfair.keys"] == ("acme/<default>=1",)
    assert activate.attributes["jobfair.type"] == "mail"
    assert by_name["mail process"].attributes["jobfair.job_key"] == job.key


async def test_traced_off_the_server_hands_the_producers_context_to_the_worker(live, spans):
    assert not telemetry.enabled()
    trace_id, job, seen = await _produce_and_work(live.url)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert "jobfair create" not in by_name and "jobfair activate" not in by_name
    # The worker continues the producer's trace, a child of its span.
    assert by_name["mail process"].context.trace_id == trace_id == seen["trace_id"]
    assert by_name["mail process"].parent.span_id == by_name["signup"].context.span_id
    assert job.custom_headers["traceparent"] == telemetry.traceparent_of(by_name["signup"])


async def test_a_bad_traceparent_is_ignored_and_a_jobs_own_is_kept(live):
    c = live.client
    for bad_value in (
        "00-xyz",
        "00-" + "A" * 32 + "-" + "b" * 16 + "-01",  # upper case
        "01-" + "a" * 32 + "-" + "b" * 16 + "-01",  # a version this does not know
        "00-" + "0" * 32 + "-" + "b" * 16 + "-01",  # the invalid trace id
        "00-" + "a" * 32 + "-" + "0" * 16 + "-01",  # the invalid parent id
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01-extra",
    ):
        bad = await c.post("/v2/jobs", json={"type": "t"}, headers={"traceparent": bad_value})
        assert bad.status_code == 201, bad.text
        assert "traceparent" not in bad.json()["customHeaders"], bad_value
    good = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    own = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
    r = await c.post(
        "/v2/jobs/batch",
        json={"jobs": [{"type": "t"}, {"type": "t", "customHeaders": {"traceparent": own}}]},
        headers={"traceparent": good},
    )
    keys = r.json()["jobKeys"]
    kept = [(await c.get(f"/v2/jobs/{k}")).json()["customHeaders"]["traceparent"] for k in keys]
    assert kept == [good, own]
