"""Issue 45 §5, optional part: the metrics through OpenTelemetry too.  A live server with
``JOBFAIR_OTEL_METRICS_ENABLED`` sends, over real OTLP/HTTP (OpenTelemetry's exporter),
to a receiver here that decodes OTLP's protobuf: each counter, gauge and histogram as
``GET /metrics`` shows it -- same names, labels and values -- with the database's gauges
from the leading process."""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from app.domain import utcnow
from app.metrics import otlp
from tests.fixtures import quiet_settings
from tests.helpers import complete, enqueue

Pushed = dict[str, Any]  # a metric's name -> the OTLP Metric message


class Receiver:
    """An OTLP/HTTP metrics endpoint: every request it got, decoded."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest.FromString(body)
                answer = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                with receiver.changed:
                    receiver.requests.append(request)
                    receiver.changed.notify_all()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"

    async def push_where(self, wanted: Callable[[Pushed], bool], timeout_s: float = 20) -> Pushed:
        """The first push (from the newest on as they come) whose metrics satisfy ``wanted``."""

        def wait() -> Pushed:
            seen = 0
            deadline = time.monotonic() + timeout_s
            with self.changed:
                while True:
                    for request in self.requests[seen:]:
                        pushed = _metrics(request)
                        if wanted(pushed):
                            return pushed
                    seen = len(self.requests)
                    left = deadline - time.monotonic()
                    if left <= 0 or not self.changed.wait(left):
                        last = _metrics(self.requests[-1]) if self.requests else {}
                        raise AssertionError(f"no such push in {seen}; the last: {last}")

        return await asyncio.to_thread(wait)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _metrics(request: ExportMetricsServiceRequest) -> Pushed:
    [resource] = request.resource_metrics
    out: Pushed = {"resource": {a.key: a.value.string_value for a in resource.resource.attributes}}
    for scope in resource.scope_metrics:
        for metric in scope.metrics:
            out[metric.name] = metric
    return out


def _value(point: Any) -> float:
    return point.as_int if point.WhichOneof("value") == "as_int" else point.as_double


def _attrs(point: Any) -> dict[str, str]:
    return {a.key: a.value.string_value for a in point.attributes}


def _sum_at(pushed: Pushed, name: str, **labels: str) -> float | None:
    metric = pushed.get(name)
    if metric is None:
        return None
    for p in metric.sum.data_points:
        if _attrs(p) == labels:
            return _value(p)
    return None


def _ready(pushed: Pushed) -> list[float]:
    """The ready jobs of type otlp and tenant acme, as the push gave them."""
    metric = pushed.get("jobfair_ready_jobs")
    points = metric.gauge.data_points if metric is not None else []
    want = {("type", "otlp"), ("tenant", "acme")}
    return [_value(p) for p in points if want <= set(_attrs(p).items())]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def background():
    return True


@pytest.fixture
def settings(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "1000")  # the least it takes
    return quiet_settings()


async def test_the_metrics_go_over_otlp_as_a_scrape_shows_them(live, receiver):
    c = live.client
    keys = await enqueue(c, "otlp", "acme", 3)
    r = await c.post("/v2/jobs/activate", json={"type": "otlp", "maxJobs": 1, "timeout": 60_000})
    [job] = r.json()["jobs"]
    assert (await complete(c, job)).status_code == 204
    assert len(keys) == 3

    def settled(p: Pushed) -> bool:
        return (
            _sum_at(p, "jobfair_jobs_completed", type="otlp", tenant="acme") == 1
            and _ready(p) == [2]  # the leader's database gauges, sampled since
        )

    pushed = await receiver.push_where(settled)
    scraped = {f.name: f for f in text_string_to_metric_families((await c.get("/metrics")).text)}
    # Who sent it: one instance per process (the server runs in this one).
    assert pushed["resource"]["service.name"] == "jobfair"
    assert pushed["resource"]["service.instance.id"] == f"{socket.gethostname()}:{os.getpid()}"

    # A counter: a cumulative monotonic sum, as the scrape counts it.
    created = pushed["jobfair_jobs_created"]
    assert created.sum.is_monotonic
    assert created.sum.aggregation_temporality == 2  # CUMULATIVE
    assert _sum_at(pushed, "jobfair_jobs_created", type="otlp", tenant="acme") == 3
    [scraped_created] = [
        s for s in scraped["jobfair_jobs_created"].samples
        if s.name == "jobfair_jobs_created_total" and s.labels == {"type": "otlp", "tenant": "acme"}
    ]  # fmt: skip
    assert scraped_created.value == 3

    # A gauge of the database's: two ready now, as the scrape reads it.
    [scraped_ready] = [
        s.value for s in scraped["jobfair_ready_jobs"].samples
        if s.labels.get("type") == "otlp" and s.labels.get("tenant") == "acme"
    ]  # fmt: skip
    assert _ready(pushed) == [scraped_ready] == [2]

    # A histogram: Prometheus's cumulative buckets as counts per bucket, same bounds.
    pickup = pushed["jobfair_pickup_latency_seconds"].histogram
    [point] = [p for p in pickup.data_points if _attrs(p) == {"type": "otlp", "tenant": "acme"}]
    assert point.count == 1 and sum(point.bucket_counts) == 1
    assert len(point.bucket_counts) == len(point.explicit_bounds) + 1
    buckets = [
        s for s in scraped["jobfair_pickup_latency_seconds"].samples
        if s.name.endswith("_bucket") and (s.labels["type"], s.labels["tenant"]) == ("otlp", "acme")
    ]  # fmt: skip
    finite = sorted(float(s.labels["le"]) for s in buckets if s.labels["le"] != "+Inf")
    assert list(point.explicit_bounds) == finite
    cumulative = [sum(point.bucket_counts[: i + 1]) for i in range(len(point.bucket_counts))]
    by_le = {float(s.labels["le"]): s.value for s in buckets}
    assert cumulative == [by_le[le] for le in sorted(by_le)]
    assert not point.HasField("min") and not point.HasField("max")  # Prometheus has none


async def test_a_process_that_does_not_lead_sends_its_own_counts_alone(live, receiver):
    """The database's gauges go once for the cluster, from the leader; every other
    process sends what it counted itself."""
    await enqueue(live.client, "otlp", "acme", 1)
    scrape = live.app.state.services.scrape
    exporter = OTLPMetricExporter(endpoint=receiver.endpoint)
    follower = otlp.MetricsPush(scrape, lambda: False, "follower", exporter, interval=60_000)
    await follower.run_once(utcnow())
    pushed = await receiver.push_where(lambda p: p["resource"]["service.name"] == "follower")
    assert _sum_at(pushed, "jobfair_jobs_created", type="otlp", tenant="acme") == 1
    assert "jobfair_ready_jobs" not in pushed and "jobfair_database_up" not in pushed
    follower.shutdown()


def test_asked_for_by_a_setting_or_the_standard_endpoint_unless_the_sdk_is_off():
    assert not otlp.wanted(False, {})
    assert otlp.wanted(True, {})
    assert otlp.wanted(False, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"})
    assert not otlp.wanted(True, {"OTEL_SDK_DISABLED": "TRUE"})
    assert otlp.interval_ms({}) == 60_000
    huge = "1" + "0" * 5000  # int() alone refuses it
    for raw, ms in (("2500", 2500), ("", 60_000), ("0", 1000), ("250", 1000), ("-5", 60_000),
                    ("1e3", 60_000), (" 5000", 60_000), (huge, 86_400_000)):  # fmt: skip
        assert otlp.interval_ms({"OTEL_METRIC_EXPORT_INTERVAL": raw}) == ms, raw
    assert otlp.interval_ms({"OTEL_METRIC_EXPORT_INTERVAL": "١٠"}) == 60_000  # not ASCII
