"""A body over JOBFAIR_MAX_BODY_BYTES gets its 413 at the limit, even sent in chunks
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


async def _post_raw(
    url: str, path: str, headers: str, parts: list[bytes], pause_s: float = 0
) -> bytes:
    """POSTs to ``path`` on a fresh connection: ``headers`` (each ending in CRLF), then
    ``parts`` written ``pause_s`` apart.  The response's status code."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
        writer.write((head + headers + "\r\n").encode())
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause_s)
        status = await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()  # else a server still reading would hold the test's shutdown
    return status.split()[1]


def _chunked(pieces: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]


@pytest.mark.parametrize("path", ["/v2/jobs/batch", "/v2/jobs/1/complete"])
async def test_a_chunked_body_that_never_ends_is_refused_at_the_limit(live, store, path):
    pieces = [b'{"jobs": [' + b" " * 1014]
    pieces += [b" " * 1024] * (2 * LIMIT // 1024 - 1)  # twice the limit, and no last chunk
    status = await _post_raw(live.url, path, "Transfer-Encoding: chunked\r\n", _chunked(pieces))
    assert status == b"413"
    assert await store.fetchval("SELECT count(*) FROM jobs") == 0


async def test_a_declared_length_over_the_limit_is_refused_before_the_body_arrives(live, store):
    declared = f"Content-Length: {LIMIT * 1000}\r\n"
    status = await _post_raw(live.url, "/v2/jobs", declared, [b'{"type": "big"'])  # no more
    assert status == b"413"
    assert await store.fetchval("SELECT count(*) FROM jobs") == 0


async def test_a_body_sent_in_several_chunks_is_read_whole(live, store):
    pieces = [b'{"type": "chunk', b'ed", "variables": {"n"', b": 3}}"]
    # Pauses between the pieces, as a slow client makes: the server reads them as they
    # come, in several messages, not as one buffered body.
    chunks = _chunked(pieces) + [b"0\r\n\r\n"]
    status = await _post_raw(
        live.url, "/v2/jobs", "Transfer-Encoding: chunked\r\n", chunks, pause_s=0.05
    )
    assert status == b"201"
    row = await store.fetchrow("SELECT job_type, variables FROM jobs")
    assert row["job_type"] == "chunked"
    assert row["variables"] == {"n": 3}
