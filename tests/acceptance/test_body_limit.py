"""A body over JOBFAIR_MAX_BODY_BYTES gets its 400 at the limit, even sent in chunks
without a Content-Length, however long the client goes on sending."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from app.config import Settings
from tests.fixtures import quiet_settings

LIMIT = 4096


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(max_body_bytes=LIMIT)


@pytest.mark.parametrize("path", ["/v2/jobs/batch", "/v2/jobs/1/complete"])
async def test_a_chunked_body_that_never_ends_is_refused_at_the_limit(live, store, path):
    u = urlsplit(live.url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
        writer.write(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b'{"jobs": [' + b" " * 1014
        for _ in range(2 * LIMIT // len(chunk)):  # twice the limit, and no last chunk
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            chunk = b" " * 1024
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()  # else a server still reading would hold the test's shutdown
    assert status.split()[1] == b"400"
    assert await store.pool.fetchval("SELECT count(*) FROM jobs") == 0


async def _post_raw(url: str, head: str, parts: list[bytes], pause_s: float = 0) -> bytes:
    """Sends ``head`` and ``parts`` on a fresh connection, ``pause_s`` apart; the
    response's status line."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        writer.write(head.replace("{host}", u.netloc).encode())
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause_s)
        return await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()


async def test_a_declared_length_over_the_limit_is_refused_before_the_body_arrives(live, store):
    head = (
        "POST /v2/jobs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {LIMIT * 1000}\r\n\r\n"
    )
    status = await _post_raw(live.url, head, [b'{"type": "big"'])  # the rest never comes
    assert status.split()[1] == b"400"
    assert await store.pool.fetchval("SELECT count(*) FROM jobs") == 0


async def test_a_body_sent_in_several_chunks_is_read_whole(live, store):
    head = (
        "POST /v2/jobs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    pieces = [b'{"type": "chunk', b'ed", "variables": {"n"', b": 3}}"]
    # Pauses between the pieces, as a slow client makes: the server reads them as they
    # come, in several messages, not as one buffered body.
    chunks = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
    status = await _post_raw(live.url, head, chunks, pause_s=0.05)
    assert status.split()[1] == b"201"
    row = await store.pool.fetchrow("SELECT job_type, variables FROM jobs")
    assert row["job_type"] == "chunked"
    assert row["variables"] == {"n": 3}
