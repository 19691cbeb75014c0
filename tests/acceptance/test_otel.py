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
from tests.acceptance.test_streams import Events

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


WORKER = "00-" + "e" * 32 + "-" + "f" * 16 + "-01"  # the worker's own span, as it sends it


def _server_spans(server: InMemorySpanExporter, name: str) -> list:
    return [s for s in server.get_finished_spans() if s.name == name]


def _is_child_of_worker(span) -> bool:
    return span.parent.trace_id == int("e" * 32, 16) and span.parent.span_id == int("f" * 16, 16)


async def test_a_stream_records_a_span_for_each_claim_it_writes(live, spans):
    server = InMemorySpanExporter()
    telemetry.configure("jobfair", server)
    c = live.client
    produced = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    first = (await c.post("/v2/jobs", json={"type": "sse", "tenantId": "acme"},
                          headers={"traceparent": produced})).json()  # fmt: skip
    [created] = _server_spans(server, "jobfair create")
    path = "/v2/jobs/stream?type=sse&maxJobs=5&timeout=60000&worker=w1"
    async with c.stream("GET", path, headers={"traceparent": WORKER}) as r:
        assert r.status_code == 200
        events = Events(r)
        got = await events.next_job()
        assert got["jobKey"] == first["jobKey"]
        second = (await c.post("/v2/jobs", json={"type": "sse", "tenantId": "zeta",
                                                 "fairnessKey": "k1"})).json()  # fmt: skip
        assert (await events.next_job())["jobKey"] == second["jobKey"]
        events.reader.cancel()
    claims = _server_spans(server, "jobfair activate")
    assert all(s.attributes["jobfair.stream"] for s in claims)
    # One span per claim written, a child of the call that opened the stream.
    assert len(claims) == 2, claims
    assert all(_is_child_of_worker(s) for s in claims)
    assert [s.attributes["jobfair.tenants"] for s in claims] == [("acme=1",), ("zeta=1",)]
    assert [s.attributes["jobfair.keys"] for s in claims] == [("acme/<default>=1",), ("zeta/k1=1",)]
    assert {s.attributes["jobfair.worker"] for s in claims} == {"w1"}
    assert {s.attributes["jobfair.type"] for s in claims} == {"sse"}
    # The first is linked to the trace its job keeps (the server's create span's).
    assert [link.context.span_id for link in claims[0].links] == [created.context.span_id]
    assert created.context.trace_id == int("a" * 32, 16)
    # The second job came without a trace: its create span began one, linked all the same.
    assert len(claims[1].links) == 1


async def test_camundas_routes_record_the_same_spans(live, spans):
    server = InMemorySpanExporter()
    telemetry.configure("jobfair", server)
    c = live.client
    produced = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    r = await c.post("/v2/jobs/batch", json={"jobs": [{"type": "cam"}, {"type": "cam"}]},
                     headers={"traceparent": produced})  # fmt: skip
    assert r.status_code == 201, r.text
    keys = r.json()["jobKeys"]
    asked = {"type": "cam", "maxJobsToActivate": 2, "timeout": 60_000, "worker": "zeebe"}
    activated = await c.post("/v2/jobs/activation", json=asked, headers={"traceparent": WORKER})
    jobs = {j["jobKey"]: j for j in activated.json()["jobs"]}
    assert sorted(jobs) == sorted(keys)
    done = await c.post(f"/v2/jobs/{keys[0]}/completion", headers={"traceparent": WORKER},
                        json={"jobLeaseToken": jobs[keys[0]]["jobLeaseToken"]})  # fmt: skip
    assert done.status_code == 204, done.text
    token = jobs[keys[1]]["jobLeaseToken"]
    failed = await c.post(f"/v2/jobs/{keys[1]}/failure", headers={"traceparent": WORKER},
                          json={"retries": 1, "jobLeaseToken": token})  # fmt: skip
    assert failed.status_code == 204, failed.text
    [created] = _server_spans(server, "jobfair create")
    [activate] = _server_spans(server, "jobfair activate")
    assert activate.attributes["jobfair.api"] == "camunda"
    assert activate.attributes["jobfair.jobs"] == 2
    assert activate.attributes["jobfair.worker"] == "zeebe"
    assert _is_child_of_worker(activate)
    # Both jobs keep the create span's context: one link for the two.
    assert [link.context.span_id for link in activate.links] == [created.context.span_id]
    for name, key in (("jobfair complete", keys[0]), ("jobfair fail", keys[1])):
        [finish] = _server_spans(server, name)
        assert finish.attributes["jobfair.api"] == "camunda"
        assert finish.attributes["jobfair.job_key"] == key
        assert _is_child_of_worker(finish), name
    # Camunda's clients are handed the trace as a custom header, as the native ones are.
    assert {j["customHeaders"]["traceparent"] for j in jobs.values()} == {
        telemetry.traceparent_of(created)
    }


async def test_a_jobs_own_traceparent_of_any_json_value_is_ignored_when_activated(live, spans):
    """A job's customHeaders.traceparent may be any JSON value: a long poll, Camunda's
    activation and a stream hand such jobs out like any other, traced on."""
    server = InMemorySpanExporter()
    telemetry.configure("jobfair", server)
    c = live.client
    odd: list[object] = [7, [1], {"a": 1}, True, None, "garbage"]
    for job_type in ("odd-poll", "odd-camunda", "odd-stream"):
        jobs = [{"type": job_type, "customHeaders": {"traceparent": v}} for v in odd]
        made = await c.post("/v2/jobs/batch", json={"jobs": [{"type": job_type}, *jobs]})
        assert made.status_code == 201, made.text
    ask = {"type": "odd-poll", "maxJobs": 10, "timeout": 60_000, "requestTimeout": -1}
    polled = await c.post("/v2/jobs/activate", json=ask)
    assert polled.status_code == 200, polled.text
    assert len(polled.json()["jobs"]) == 1 + len(odd)
    camunda = {"type": "odd-camunda", "maxJobsToActivate": 10, "timeout": 60_000}
    activated = await c.post("/v2/jobs/activation", json=camunda)
    assert activated.status_code == 200, activated.text
    assert len(activated.json()["jobs"]) == 1 + len(odd)
    async with c.stream("GET", "/v2/jobs/stream?type=odd-stream&maxJobs=10&timeout=60000") as r:
        events = Events(r)
        got = [await events.next_job() for _ in range(1 + len(odd))]
        events.reader.cancel()
    assert len({j["jobKey"] for j in got}) == 1 + len(odd)
    # Each activation's span links the one trace its jobs keep that can be read: the
    # batch's create span (the odd values are kept as they were sent).
    activations = _server_spans(server, "jobfair activate")
    assert len(activations) == 3
    assert all(len(s.links) == 1 for s in activations)
