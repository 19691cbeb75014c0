"""An httpx transport for HTTP/1.1 keep-alive connections straight on asyncio.

The clients keep httpx's API (requests, responses, timeouts, errors, ``http=`` to bring
your own ``AsyncClient``), but not its default transport, httpcore: measured on this
project's machine, httpcore and anyio cost a request about 1.3 ms of CPU, six times what
httpx's own layer costs and more than the server spends answering it, and its pool
checks every connection it holds on every request (``has_expired`` → ``getpeername``),
so fifty requests in flight cost each of them fifty system calls.  A worker makes two
requests per batch of jobs and a producer one per job: that cost was the client's rate.
``docs/adr/020-the-clients-own-http-transport-and-batched-completions.md`` has the
measurements.

What is here: a connection per request in flight, kept open and reused when the answer
says so; TLS through ``ssl``; answers parsed by httptools (llhttp, the parser uvicorn
runs), their bodies framed by Content-Length, chunks or the connection's close, and
streamed to the caller (SSE) with back pressure; httpx's connect, read and pool
timeouts; failures raised as httpx's exceptions (a connection that could not be opened
is ``ConnectError``; one that broke after the request was written is ``ReadError``), so
the retry policy reads them as before.  What is not: proxies, HTTP/2, ``Expect:
100-continue``.  ``AsyncJobfair(transport="httpcore")`` goes back to httpx's own
transport for those.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httptools
import httpx

PAUSE_AT_BYTES = 1 << 20  # a streamed answer the caller has not read: stop reading there
MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and headers, at most (httpcore's too)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the answer it is reading."""

    def __init__(self, pool: set[_Connection]) -> None:
        self.pool = pool  # the transport's open connections; this one leaves it when lost
        self.lost = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.usable = True  # False once closed, broken, or left mid-answer
        self.failure: Exception | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._more: asyncio.Event = asyncio.Event()
        self.complete = False
        self._interim = False
        self._head_bytes = 0
        self.status = 0
        self.keep_alive = True

    # -- asyncio ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pool.add(self)

    def data_received(self, data: bytes) -> None:
        if self._head is None or self.complete:  # bytes nobody asked for: not reusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        if self._head is not None and self._head.done() and not self._delimited():
            self.complete = True  # a body without a length or chunks ends at the close
            self._more.set()
        self._fail(httpx.ReadError("the server closed the connection"))
        return False

    def _delimited(self) -> bool:
        """Whether the answer said where its body ends (else it ends at the close)."""
        return any(n.lower() in (b"content-length", b"transfer-encoding") for n, _ in self._headers)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(httpx.ReadError(f"connection lost: {exc or 'closed'}"))
        self.pool.discard(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self.usable = False
        if self.complete or self.failure is not None:
            return
        if self._head is None:  # idle: nothing waits
            return
        self.failure = exc
        if not self._head.done():
            self._head.set_exception(exc)
        self._more.set()

    # -- httptools -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request: the connection is not sane
            self.usable = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self._headers.append((name, value))
            self._head_bytes += len(name) + len(value) + 4
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(httpx.RemoteProtocolError("the answer's headers are too large"))
                self.close()

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        if 100 <= self.parser.get_status_code() < 200:  # 103 Early Hints and the like
            self._interim = True
            self._headers = []
            return
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self._chunks.append(body)
        self._buffered += len(body)
        self._more.set()
        if self._buffered > PAUSE_AT_BYTES and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.complete:
            return
        if self._interim:  # the final answer is still to come
            self._interim = False
            return
        self.complete = True
        self._more.set()

    # -- one exchange ----------------------------------------------------------------

    async def exchange(self, data: bytes, read_timeout: float | None) -> None:
        """Send a request; return once the answer's status and headers are in."""
        assert self.transport is not None
        self._head = asyncio.get_running_loop().create_future()
        self._headers, self._chunks, self._buffered = [], deque(), 0
        self.complete, self.failure, self._interim, self._head_bytes = False, None, False, 0
        self.transport.write(data)
        try:
            async with asyncio.timeout(read_timeout):
                await self._head
        except TimeoutError:
            raise httpx.ReadTimeout("no answer within the read timeout") from None

    def headers(self) -> list[tuple[bytes, bytes]]:
        return self._headers

    async def body(self, read_timeout: float | None) -> AsyncIterator[bytes]:
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered <= PAUSE_AT_BYTES // 2 and self.transport is not None:
                    self.transport.resume_reading()
                yield chunk
            if self.complete:
                return
            if self.failure is not None:
                raise self.failure
            self._more.clear()
            try:
                async with asyncio.timeout(read_timeout):
                    await self._more.wait()
            except TimeoutError:
                raise httpx.ReadTimeout("the answer stopped within the read timeout") from None

    def reusable(self) -> bool:
        """Read to its end, the server keeping it open: a body left unread (its reading
        perhaps paused) would stall the next answer."""
        return self.usable and self.complete and self.keep_alive and not self._chunks

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    def __init__(self, pool: FastTransport, key: Any, conn: _Connection, timeout: float | None):
        self.pool, self.key, self.conn, self.timeout = pool, key, conn, timeout
        self.released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.conn.body(self.timeout):
            yield chunk

    async def aclose(self) -> None:
        if not self.released:
            self.released = True
            self.pool.release(self.key, self.conn)


class FastTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=FastTransport(verify=...))``: see the module."""

    def __init__(
        self,
        *,
        verify: bool | ssl.SSLContext = True,
        max_connections: int = 200,
        max_idle_per_host: int = 50,
    ) -> None:
        self._ssl = (
            verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify)
        )
        self._idle: dict[Any, list[_Connection]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._max_idle = max_idle_per_host
        self._open: set[_Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        url = request.url
        tls = url.scheme == "https"
        key = (url.scheme, url.host, url.port or (443 if tls else 80))
        data = _encode(request, await request.aread())
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("no connection free within the pool timeout") from None
        conn: _Connection | None = None
        try:
            conn = self._idle_connection(key) or await self._connect(key, tls, timeouts)
            await conn.exchange(data, timeouts.get("read"))
        except BaseException:
            if conn is not None:
                conn.close()
            self._slots.release()
            raise
        return httpx.Response(
            conn.status,
            headers=conn.headers(),
            stream=_Body(self, key, conn, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    def _idle_connection(self, key: Any) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
        return None

    async def _connect(self, key: Any, tls: bool, timeouts: dict[str, float | None]) -> _Connection:
        _, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._open),
                    host,
                    port,
                    ssl=self._ssl if tls else None,
                    server_hostname=host if tls else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"could not connect to {host}:{port} in time") from None
        except OSError as exc:  # refused, unreachable, or the TLS handshake failed
            raise httpx.ConnectError(f"could not connect to {host}:{port}: {exc}") from exc
        return conn  # (asyncio sets TCP_NODELAY on its TCP connections)

    def release(self, key: Any, conn: _Connection) -> None:
        """An answer is read (or abandoned): keep its connection for the next request."""
        self._slots.release()
        idle = self._idle.setdefault(key, [])
        if conn.reusable() and len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        """Close every connection and wait (a moment at most) until each is closed: a TLS
        connection's closing takes the event loop a few turns."""
        self._idle.clear()
        closing = list(self._open)
        for conn in closing:
            conn.close()
        if closing:
            await asyncio.wait([c.lost for c in closing], timeout=2)


_FRAMING = (b"content-length", b"transfer-encoding")
_UNSAFE = re.compile(rb"[\r\n\x00]")


def _encode(request: httpx.Request, body: bytes) -> bytes:
    """The request's bytes; LocalProtocolError for a header that would split the request
    (CR, LF or NUL in it: an API key read with its newline, say)."""
    for name, value in request.headers.raw:
        if _UNSAFE.search(name) or _UNSAFE.search(value):
            raise httpx.LocalProtocolError(f"illegal header {name!r}: CR, LF or NUL in it")
    url = request.url
    target = url.raw_path  # path and query, percent-encoded
    lines = [request.method.encode(), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        if name.lower() not in _FRAMING:
            lines += [name, b": ", value, b"\r\n"]
    if body or request.method in ("POST", "PUT", "PATCH"):
        # The body was read whole: it is sent with its length, never chunked.
        lines += [b"Content-Length: ", str(len(body)).encode(), b"\r\n"]
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)
