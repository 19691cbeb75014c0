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
