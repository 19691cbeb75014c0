"""An idle keep-alive connection outlives the clients' own idle expiry (app.cli)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httpx

from tests.fixtures import wait_ready

# httpx's (and so Camunda's Python SDK's) idle expiry, plus a margin.
CLIENT_IDLE_S = 5.0 + 1.0


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: jobfair\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return head.split(b"\r\n")[0]


async def test_a_connection_idle_as_long_as_a_client_keeps_one_is_still_open(spawn_server):
    server = spawn_server()
    async with httpx.AsyncClient(base_url=server.url) as c:
        await wait_ready(c, server)
    url = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        assert await _get(reader, writer) == b"HTTP/1.1 200 OK"
        # The scenario is the idle time itself: a client reuses its connection after it.
        await asyncio.sleep(CLIENT_IDLE_S)
        assert not reader.at_eof()
        assert await _get(reader, writer) == b"HTTP/1.1 200 OK"
    finally:
        writer.close()
