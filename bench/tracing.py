"""What ``app.api.tracing`` adds to a request: its id, the header, the access log.

``python -m bench.tracing`` calls a do-nothing ASGI app a number of times bare and
through ``tracing.traced`` (access log off, on but below its level, and on and written to
a null stream), in-process, and prints the added microseconds per request: the cost
every request pays, without the network and the server around it.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app import logs
from app.api import tracing

SCOPE: dict[str, Any] = {
    "type": "http",
    "method": "POST",
    "path": "/v2/jobs/2251799813685249/complete",
    "headers": [
        (b"host", b"127.0.0.1:8080"),
        (b"accept", b"*/*"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"connection", b"keep-alive"),
        (b"user-agent", b"python-httpx/0.28.1"),
        (b"content-type", b"application/json"),
        (b"content-length", b"22"),
    ],
}
START = {"type": "http.response.start", "status": 204, "headers": [(b"content-length", b"0")]}
BODY = {"type": "http.response.body", "body": b""}


async def app(scope: Any, receive: Any, send: Callable[[Any], Awaitable[None]]) -> None:
    await send(dict(START))
    await send(BODY)


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message: Any) -> None:
    pass


async def per_call_us(calls: int, call: Callable[[], Awaitable[None]]) -> float:
    best = float("inf")
    for _ in range(5):  # the best of five: the machine is shared
        started = time.perf_counter()
        for _ in range(calls):
            await call()
        best = min(best, time.perf_counter() - started)
    return best / calls * 1e6


async def main(calls: int) -> None:
    bare = await per_call_us(calls, lambda: app(SCOPE, receive, send))
    rows = {"bare app": bare}
    off = await per_call_us(
        calls, lambda: tracing.traced(app, SCOPE, receive, send, access_log=False)
    )
    rows["traced, access log off"] = off
    tracing.access.setLevel(logging.WARNING)
    below = await per_call_us(
        calls, lambda: tracing.traced(app, SCOPE, receive, send, access_log=True)
    )
    rows["traced, access log on, level warning"] = below
    tracing.access.setLevel(logging.INFO)
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logs.JsonFormatter())
    tracing.access.addHandler(handler)
    tracing.access.propagate = False
    on = await per_call_us(
        calls, lambda: tracing.traced(app, SCOPE, receive, send, access_log=True)
    )
    rows["traced, access log on (JSON)"] = on
    for name, us in rows.items():
        added = "" if name == "bare app" else f"  (+{us - bare:.2f} us)"
        print(f"{name:40s} {us:6.2f} us/request{added}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=100_000)
    asyncio.run(main(p.parse_args().calls))
