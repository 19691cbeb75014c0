"""The metrics through OpenTelemetry too (issue 45 §5, docs/metrics.md): opt-in;
Prometheus's ``GET /metrics`` stays the default, and is unchanged.

On (``JOBFAIR_OTEL_METRICS_ENABLED=true``, or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``
set, and ``OTEL_SDK_DISABLED`` not ``true``), every ``OTEL_METRIC_EXPORT_INTERVAL`` ms
(60,000 by default) each process sends over OTLP/HTTP what it counts itself -- its events
and state, the series a scrape adds up over a server's processes -- and the process that
leads the background work sends the database's gauges too (once for the whole cluster,
not once per replica). Each process is an instance of its own (``service.instance.id``),
as OpenTelemetry's SDKs make them, so a backend adds them up as a scrape does.

The families prometheus-client keeps are sent as they are, not counted twice through
OpenTelemetry's instruments (which have no asynchronous histogram): counters as
cumulative monotonic sums, gauges as gauges, histograms as explicit-bucket histograms
(Prometheus's cumulative ``le`` buckets made per-bucket counts); names and labels are the
Prometheus ones. A hand-written conversion: OpenTelemetry's Python packages bridge the
other way only (its Prometheus exporter).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric

if TYPE_CHECKING:
    from app.metrics.scrape import Scrape

log = logging.getLogger(__name__)

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
INTERVAL_VARIABLE = "OTEL_METRIC_EXPORT_INTERVAL"
DEFAULT_INTERVAL_MS = 60_000
MIN_INTERVAL_MS = 1_000
MAX_INTERVAL_MS = 86_400_000  # a day
NO_MIN_MAX = (None, None)


def wanted(enabled: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether metrics over OTLP are asked for."""
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return enabled or bool(environ.get(ENDPOINT_VARIABLE))


def interval_ms(environ: Mapping[str, str] = os.environ) -> int:
    """``OTEL_METRIC_EXPORT_INTERVAL``: a whole number of milliseconds, held between
    MIN_INTERVAL_MS (each push of the leader's costs a scrape of the database's gauges)
    and MAX_INTERVAL_MS; 60 s if unset.  A value that is not a whole number, or out of
    those bounds, is said once in the log."""
    raw = environ.get(INTERVAL_VARIABLE)
    if raw is None or raw == "":
        return DEFAULT_INTERVAL_MS
    if not (raw.isascii() and raw.isdigit()):
        log.warning("%s=%r is not a whole number of ms: %d used", INTERVAL_VARIABLE, raw,
                    DEFAULT_INTERVAL_MS)  # fmt: skip
        return DEFAULT_INTERVAL_MS
    asked = int(raw) if len(raw) <= 18 else MAX_INTERVAL_MS + 1  # int() refuses 4,300 digits
    ms = min(max(asked, MIN_INTERVAL_MS), MAX_INTERVAL_MS)
    if ms != asked:
        log.warning("%s=%.20s is out of %d..%d ms: %d used", INTERVAL_VARIABLE, raw,
                    MIN_INTERVAL_MS, MAX_INTERVAL_MS, ms)  # fmt: skip
    return ms


def metrics_data(families: Iterable[Metric], resource: Any, start_ns: int, now_ns: int) -> Any:
    """``families`` as OpenTelemetry's SDK hands them to an exporter (MetricsData)."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.metrics.export import Metric as OtelMetric
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    cumulative = AggregationTemporality.CUMULATIVE

    def point(labels: Mapping[str, str], value: float) -> Any:
        return NumberDataPoint(dict(labels), start_ns, now_ns, value)

    out = []
    for family in families:
        kind, doc = family.type, family.documentation
        data: Any
        if kind == "counter":
            samples = [s for s in family.samples if s.name.endswith("_total")]
            points = [point(s.labels, s.value) for s in samples]
            data = Sum(points, cumulative, is_monotonic=True)
        elif kind in ("gauge", "unknown", "info"):
            data = Gauge([point(s.labels, s.value) for s in family.samples])
        elif kind == "histogram":
            points = _histogram_points(family, start_ns, now_ns, HistogramDataPoint)
            data = Histogram(points, cumulative)
        else:  # summaries, state sets: none here
            log.debug("metric %s of kind %s is not sent over OTLP", family.name, kind)
            continue
        if data.data_points:
            out.append(OtelMetric(family.name, doc, family.unit or None, data))
    scope = InstrumentationScope("jobfair")
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, out, "")], "")])


def _histogram_points(family: Metric, start_ns: int, now_ns: int, make: Any) -> list[Any]:
    """A point per label set: Prometheus's cumulative buckets made counts per bucket."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in family.samples:
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        one = series.setdefault(labels, {"buckets": [], "count": 0, "sum": 0.0})
        if s.name.endswith("_bucket"):
            one["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            one["count"] = int(s.value)
        elif s.name.endswith("_sum"):
            one["sum"] = s.value
    points = []
    for labels, one in series.items():
        buckets = sorted(one["buckets"])
        bounds = [le for le, _ in buckets if not math.isinf(le)]
        counts, below = [], 0.0
        for _, cumulative in buckets:
            counts.append(int(cumulative - below))
            below = cumulative
        if not buckets or not math.isinf(buckets[-1][0]):
            counts.append(int(one["count"] - below))  # no +Inf bucket: the rest
        count, total = one["count"], one["sum"]
        # Prometheus keeps no minimum or maximum: left unset (None) in OTLP.
        attributes = dict(labels)
        points.append(make(attributes, start_ns, now_ns, count, total, counts, bounds, *NO_MIN_MAX))
    return points


class MetricsPush:
    """A background task of every process: its metrics, and the leader's database
    gauges, sent over OTLP every interval."""

    name = "otlp metrics"

    def __init__(
        self,
        scrape: Scrape,
        leads: Callable[[], bool],
        service_name: str,
        exporter: Any = None,
        interval: int | None = None,
    ) -> None:
        from opentelemetry.sdk.resources import Resource

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter()
        self.scrape = scrape
        self.leads = leads
        self.exporter = exporter
        self.interval_ms = interval if interval is not None else interval_ms()
        instance = f"{socket.gethostname()}:{os.getpid()}"
        self.resource = Resource.create(
            {"service.name": service_name, "service.instance.id": instance}
        )
        self.start_ns = time.time_ns()  # counters count from this process's start

    async def run_once(self, now: datetime) -> int:
        families = await self.scrape.families(now, database=self.leads(), merged=False)
        data = metrics_data(families, self.resource, self.start_ns, time.time_ns())
        # The exporter blocks (requests, with its own retries and timeout): off the loop.
        # A failure it logs itself; the next push sends the cumulative values then.
        await asyncio.to_thread(self.exporter.export, data)
        return len(data.resource_metrics[0].scope_metrics[0].metrics)

    def shutdown(self) -> None:
        self.exporter.shutdown()
