"""Where a request enters the app: its id, its access-log line, and the log entry of a bug.

Every request gets an id: the caller's ``X-Request-Id`` if it is sane (at most
``MAX_REQUEST_ID`` characters of ``REQUEST_ID_CHARS``; a proxy's or a client's own, so
that its log and ours meet), else a new one.  It is the ``X-Request-Id`` of the answer,
whatever answers it (the direct dispatcher, FastAPI, a problem of either), it is on every
log line logged while the request is handled (``app.logs.request_id``), and it is the
``requestId`` of a 500's problem, so that whoever got one can find its log entry.

An exception nobody handled -- a bug -- is logged here, once, with its traceback and the
request's id, and answered 500 problem+json if nothing was answered yet.  Not raised on:
uvicorn would log it a second time, without the id.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Awaitable, Callable

from starlette.types import Message, Receive, Scope, Send

from app.api import problems
from app.logs import request_id

log = logging.getLogger(__name__)
access = logging.getLogger("jobfair.access")

HEADER = b"x-request-id"
MAX_REQUEST_ID = 128
# Letters, digits and what UUIDs, W3C trace ids and base64 are written with; nothing that
# could end a header or a log field.
REQUEST_ID_CHARS = r"A-Za-z0-9._:+=/-"
_SANE = re.compile(rb"[%s]{1,%d}" % (REQUEST_ID_CHARS.encode(), MAX_REQUEST_ID))


def new_request_id() -> str:
    """16 hex digits.  Unique enough to find one request among a day's (not a secret, so
    not from the OS's random source, which costs three times as much per request)."""
    return f"{random.getrandbits(64):016x}"


def incoming_request_id(scope: Scope) -> str | None:
    """The caller's ``X-Request-Id``, if it is sane; None if absent or not."""
    for name, value in scope["headers"]:
        if name == HEADER:
            return value.decode() if _SANE.fullmatch(value) else None
    return None


async def traced(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    access_log: bool,
) -> None:
    """Run ``app`` for an HTTP request, with its id (see the module's docstring)."""
    rid = incoming_request_id(scope) or new_request_id()
    # Not reset at the end: uvicorn runs each request in a task of its own, and what it
    # logs about this one after the app returns is this request's too.
    request_id.set(rid)
    id_header = (HEADER, rid.encode())
    status = 0  # of the answer once it has started

    # Not a coroutine function: it hands back send's own awaitable, which saves a
    # coroutine per message (the hot routes' answers are two messages).
    def send_with_id(message: Message) -> Awaitable[None]:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            message["headers"] = [*message.get("headers", ()), id_header]
        return send(message)

    timed = access_log and access.isEnabledFor(logging.INFO)
    started = time.perf_counter() if timed else 0.0
    try:
        await app(scope, receive, send_with_id)
    except Exception as exc:
        log.error("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
        if status == 0:
            await problems.internal(scope["path"], rid)(scope, receive, send_with_id)
        # else the answer has started (FastAPI's handler answered the 500, or a stream
        # broke): uvicorn closes the connection.
    finally:
        if timed:
            _access(scope, status, started)


def _access(scope: Scope, status: int, started: float) -> None:
    duration_ms = round((time.perf_counter() - started) * 1000, 3)
    shown = status or "-"  # 0: the client went away before any answer
    access.info(
        "%s %s %s %.1f ms",
        scope["method"],
        scope["path"],
        shown,
        duration_ms,
        extra={
            "method": scope["method"],
            "path": scope["path"],
            "status": status or None,
            "durationMs": duration_ms,
        },
    )
