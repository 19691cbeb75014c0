"""A minimal HTTP/1.1 keep-alive client for load generation.

httpx costs ~3 ms of CPU per request on this 2-core machine, more than the server spends
answering; a benchmark of the server must not be a benchmark of its client.  This client
speaks just what Jobfair's answers need (Content-Length bodies, keep-alive), one request
at a time per connection.  ``Connection`` is an asyncio protocol that parses each answer
as its bytes arrive: in a drain of 32 workers it spent ~65 µs of CPU per job where asyncio
streams (a readline per header) spent ~80, CPU the server and PostgreSQL share on this
machine.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import orjson


class Response:
    __slots__ = ("status", "body", "retry_after")

    def __init__(self, status: int, body: bytes, retry_after: str | None = None) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after  # a 503's Retry-After, as sent

    def json(self) -> Any:
        return orjson.loads(self.body)


class _Answers(asyncio.Protocol):
    """Reads one answer per request: a status line, headers, a Content-Length body."""

    def __init__(self) -> None:
        self.buffer = b""
        self.waiter: asyncio.Future[Response] | None = None
        self.lost: BaseException | None = None
        self.gone = asyncio.get_running_loop().create_future()  # set once the socket is shut

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            self.buffer = buffer
            return
        head = buffer[:end]
        length = _content_length(head)
        whole = end + 4 + length
        if len(buffer) < whole:
            self.buffer = buffer
            return
        self.buffer = buffer[whole:]
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():  # not a request given up meanwhile
            status = int(head[9:12])
            retry_after = _header(head, b"retry-after:") if status == 503 else None
            waiter.set_result(Response(status, buffer[end + 4 : whole], retry_after))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = exc or ConnectionResetError("the server closed the connection")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)
        if not self.gone.done():
            self.gone.set_result(None)


def _content_length(head: bytes) -> int:
    at = head.find(b"content-length:")  # uvicorn's spelling; others may capitalise
    if at < 0:
        at = head.lower().find(b"content-length:")
        if at < 0:
            return 0
    stop = head.find(b"\r\n", at)
    return int(head[at + 15 : stop if stop >= 0 else len(head)])


def _header(head: bytes, name: bytes) -> str | None:
    """A header's value (``name`` in lower case, with its colon), or None."""
    at = head.lower().find(name)
    if at < 0:
        return None
    stop = head.find(b"\r\n", at)
    return head[at + len(name) : stop if stop >= 0 else len(head)].strip().decode()


def _auth(base: str) -> str:
    """The Authorization header line (after a CRLF) for a key given as the URL's user."""
    key = urlsplit(base).username
    return f"\r\nAuthorization: Bearer {key}" if key else ""


class Connection:
    def __init__(self, transport: asyncio.Transport, answers: _Answers, host: bytes) -> None:
        self.transport = transport
        self.answers = answers
        self.host = host  # the Host header's value, and any header lines after it
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, base: str) -> Connection:
        """``base``: ``http://host:port``, or ``http://<api key>@host:port`` to send the
        key as a Bearer token on every request."""
        u = urlsplit(base)
        loop = asyncio.get_running_loop()
        host, port = u.hostname or "127.0.0.1", u.port or 80
        transport, answers = await loop.create_connection(_Answers, host, port)
        return cls(transport, answers, f"{host}:{port}{_auth(base)}".encode())

    async def request(self, method: str, path: str, body: Any = None) -> Response:
        if self.answers.lost is not None:
            raise self.answers.lost
        payload = b"" if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: ".encode()
            + self.host
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
        )
        waiter = self.answers.waiter = self.loop.create_future()
        self.transport.write(head + payload)
        return await waiter

    async def post(self, path: str, body: Any = None) -> Response:
        return await self.request("POST", path, body)

    async def close(self) -> None:
        """Close, and wait until the socket is shut: a transport's close only schedules
        that, and a loop ended before it runs leaves an open socket for the garbage
        collector to warn about (a ResourceWarning that failed a test once)."""
        self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.answers.gone), 5)
        except TimeoutError:
            self.transport.abort()


class EventStream:
    """Reads ``event: job`` records from a chunked text/event-stream response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = b""

    @classmethod
    async def open(cls, base: str, path: str) -> EventStream:
        u = urlsplit(base)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        head = f"GET {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}{_auth(base)}\r\n\r\n"
        writer.write(head.encode())
        status = int((await reader.readline()).split(b" ", 2)[1])
        if status != 200:
            raise RuntimeError(f"stream answered {status}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        return cls(reader, writer)

    async def next_job(self) -> dict[str, Any]:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                end = self.buffer.find(b"\n\n")
            if end >= 0:
                block, self.buffer = self.buffer[:end], self.buffer[end:].lstrip(b"\r\n")
                for line in block.splitlines():
                    if line.startswith(b"data:"):
                        return orjson.loads(line[5:])  # type: ignore[no-any-return]
                continue
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                raise EOFError("stream ended")
            self.buffer += await self.reader.readexactly(size + 2)
            self.buffer = self.buffer[:-2] if self.buffer.endswith(b"\r\n") else self.buffer

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
