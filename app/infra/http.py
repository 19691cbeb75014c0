"""uvicorn's httptools protocol, with bounds on how long and how large a request may be.

uvicorn bounds the idle time between requests (``timeout_keep_alive``) but not the time a
client takes to send one: a connection that sends half its headers, or trickles its body,
holds a file descriptor for ever, and a few thousand of them refuse every honest client
at the process's descriptor limit.  Nor does its httptools parser (the fast one, ADR 008)
bound the headers: ``h11_max_incomplete_event_size`` applies to the h11 parser only.
So this subclass adds, per request:

* its request line and headers must arrive within ``request_header_timeout_ms`` of its
  first byte (or of the connection's opening): else 408 and the connection is closed;
* they may be at most ``max_header_bytes`` long and ``max_headers`` many: else 431;
* its body must arrive within ``request_body_timeout_ms`` of the headers' end: else 408
  if nothing was answered yet, and the connection is closed (the handler reading it sees
  the client gone).

The body's size is bounded where it is read (``JOBFAIR_MAX_BODY_BYTES``, app.api.parsing).

A request httptools cannot parse (a NUL or control character in a header, a space in the
target, TLS on the plain port) is answered 400 as problem+json too, where uvicorn would
answer in plain text.  Every refusal here carries a request id, in its ``X-Request-Id``,
its body and the warning logged, as a 500 does (app.api.tracing).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.tracing import HEADER as REQUEST_ID_HEADER
from app.api.tracing import new_request_id
from app.config import Settings

log = logging.getLogger("jobfair.http")

# How long a refused request's connection goes on discarding what the client sends.
LINGER_S = 2.0

# status: (reason phrase, problem type, problem title)
ANSWERS = {
    400: (b"Bad Request", "urn:jobfair:invalid-argument", "INVALID_ARGUMENT"),
    408: (b"Request Timeout", "urn:jobfair:request-timeout", "REQUEST_TIMEOUT"),
    431: (
        b"Request Header Fields Too Large",
        "urn:jobfair:request-header-fields-too-large",
        "REQUEST_HEADER_FIELDS_TOO_LARGE",
    ),
}


@dataclass(frozen=True)
class RequestLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_headers: int

    @classmethod
    def of(cls, settings: Settings) -> RequestLimits:
        return cls(
            header_timeout_s=settings.request_header_timeout_ms / 1000,
            body_timeout_s=settings.request_body_timeout_ms / 1000,
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
        )


class _HeadersTooLarge(Exception):
    """Raised in a parser callback to stop parsing; httptools wraps it in an
    HttpParserCallbackError, which uvicorn answers through send_400_response."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    limits: RequestLimits  # set by bounded_protocol

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = False  # between a request's first byte and its headers' end
        self._head_bytes = 0  # raw bytes received while in the head
        self._header_bytes = 0  # request line and header names and values, parsed
        self._header_count = 0
        self._oversize = False  # set by a parser callback, answered by send_400_response
        self._answered = False  # by this class: read nothing more

    # -- the head ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:
            self._start_head()

    def _start_head(self) -> None:
        self._in_head = True
        self._head_bytes = self._header_bytes = self._header_count = 0
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return  # the connection is closing
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            # A header still incomplete is buffered by the parser, not yet counted.
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._reject(431, "the request's headers are too large")

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value), 1)
        super().on_header(name, value)

    def _count(self, size: int, headers: int) -> None:
        self._header_bytes += size
        self._header_count += headers
        limits = self.limits
        if self._header_bytes > limits.max_header_bytes or self._header_count > limits.max_headers:
            self._oversize = True
            raise _HeadersTooLarge

    def send_400_response(self, msg: str) -> None:
        if self._oversize:
            self._reject(431, "the request's headers are too large or too many")
        else:
            # httptools says no more than uvicorn's msg, "Invalid HTTP request received."
            self._reject(
                400,
                "malformed HTTP/1.1 request: its request line or a header is not valid "
                "(a control character or NUL in a header, a space in the target, TLS on a "
                "plain HTTP port?)",
            )

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.more_body:
            self._arm(self.limits.body_timeout_s, self._body_timed_out)

    def _head_timed_out(self) -> None:
        self._timer = None
        if self._in_head:
            self._reject(408, "the request's headers did not arrive in time")

    # -- the body ----------------------------------------------------------------------

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _body_timed_out(self) -> None:
        self._timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete:
            return
        if not cycle.response_started:
            self._reject(408, "the request's body did not arrive in time")
        else:
            self.transport.close()
        # The handler reading the body sees the client gone; its answer goes nowhere.
        cycle.disconnected = True
        cycle.message_event.set()

    # -- helpers -----------------------------------------------------------------------

    def eof_received(self) -> None:
        if self._answered:
            self.transport.close()  # the client has read our answer and closed its side

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, delay_s: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _reject(self, status: int, detail: str) -> None:
        """Answer ``status`` as problem+json and close the connection (once: the parser
        may have refused the same bytes already, through send_400_response)."""
        if self._answered:
            return
        self._answered = True
        self._disarm()
        if self.transport.is_closing():
            return
        reason, type_, title = ANSWERS[status]
        rid = new_request_id()
        log.warning("refused with %d: %s", status, detail, extra={"requestId": rid})
        body = orjson.dumps(
            {"type": type_, "title": title, "status": status, "detail": detail, "requestId": rid}
        )
        head = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        head += b"content-type: application/problem+json\r\n"
        head += b"%s: %s\r\n" % (REQUEST_ID_HEADER, rid.encode())
        head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        self.transport.write(head + body)
        if self.transport.can_write_eof():
            # A lingering close: closing with the client's bytes unread would reset the
            # connection, and the reset can overtake the answer.  So end our side, discard
            # what still comes, and close when the client does or after LINGER_S.
            self.transport.write_eof()
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


@functools.cache
def bounded_protocol(limits: RequestLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http`` option, with these limits."""
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})


def __getattr__(name: str) -> Any:
    # ``jobfair serve`` names the protocol by import string (its worker processes are
    # spawned): the limits come from each process's JOBFAIR_* environment.
    if name == "ServeProtocol":
        return bounded_protocol(RequestLimits.of(Settings()))
    raise AttributeError(name)
