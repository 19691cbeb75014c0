"""What tracing (app.telemetry, issue 45 §5) costs a create and a finish, off and on:
``python -m bench.otel [--calls 200000]``.

In-process, as bench/tracing.py measures the request-id middleware: the hooks a create and
a finish run -- ``app.api.traced.create`` and ``finish``, entered and left
around nothing -- timed per call against an empty ``with`` block, with tracing off
(without and with a producer's ``traceparent`` header: off, the header is still kept
with the jobs) and on (spans to an in-memory exporter, each exported as it ends).
Medians of five rounds, nanoseconds per call; a table, then the JSON (also
bench/results/otel.json)."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.requests import Request

from app import telemetry
from app.api import traced
from bench.harness import median, table, write_results

PARENT = b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"


def request(traceparent: bool) -> Request:
    headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1:8080")]
    if traceparent:
        headers.append((b"traceparent", PARENT))
    return Request({"type": "http", "method": "POST", "path": "/v2/jobs", "headers": headers})


def per_call_ns(enter: Callable[[], Any], calls: int) -> float:
    rounds = []
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(calls):
            with enter():
                pass
        rounds.append((time.perf_counter_ns() - started) / calls)
    return median(rounds)


def main(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    base = per_call_ns(contextlib.nullcontext, args.calls)
    rows.append({"hook": "empty with (baseline)", "tracing": "-", "ns/call": round(base)})
    for on in (False, True):
        if on:
            exporter = InMemorySpanExporter()
            telemetry.configure("bench", exporter)
        state = "on" if on else "off"
        for header in (False, True):
            req = request(header)
            # A new job dict each call: a kept traceparent is written into it.
            ns = per_call_ns(lambda req=req: traced.create(req, [{"type": "t"}]), args.calls)
            rows.append(
                {
                    "hook": f"create{' + traceparent' if header else ''}",
                    "tracing": state,
                    "ns/call": round(ns),
                }
            )
            if on:
                exporter.clear()
        req = request(True)
        ns = per_call_ns(lambda req=req: traced.finish(req, "jobfair complete"), args.calls)
        rows.append({"hook": "finish + traceparent", "tracing": state, "ns/call": round(ns)})
        if on:
            telemetry.shutdown()
    print(table(rows, list(rows[0])), flush=True)
    return {"args": vars(args), "rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    write_results("otel", main(parser.parse_args()))
