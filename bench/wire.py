"""A minimal HTTP/1.1 keep-alive client for load generation.

httpx costs ~3 ms of CPU per request on this 2-core machine, more than the server spends
answering; a benchmark of the server must not be a benchmark of its client.  This client
speaks just what Jobfair's answers need (Content-Length bodies, keep-alive) over asyncio
streams, one request at a time per connection.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import orjson


class Response:
    __slots__ = ("status", "body")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)


class Connection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.host = host.encode()

    @classmethod
    async def open(cls, base: str) -> Connection:
        u = urlsplit(base)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        return cls(reader, writer, f"{u.hostname}:{u.port}")

    async def request(self, method: str, path: str, body: Any = None) -> Response:
        payload = b"" if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: ".encode()
            + self.host
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
        )
        self.writer.write(head + payload)
        status_line = await self.reader.readline()
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        data = await self.reader.readexactly(length) if length else b""
        return Response(status, data)

    async def post(self, path: str, body: Any = None) -> Response:
        return await self.request("POST", path, body)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


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
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n\r\n".encode())
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
