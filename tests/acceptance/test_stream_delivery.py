"""Issue 20 §4: a stream counts a job delivered only once the write carrying its event
was handed to the connection (a claim's jobs go out in one write, ADR 037).

The jobs of a write the server was still making when the connection broke (the client
reset it while the buffers were full) return to CREATED at once, with the jobs not yet
written.  What was written before the break keeps its lease: the server cannot know
whether the client read it (the window README's "Streams" paragraph describes).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from urllib.parse import urlsplit

import pytest

from app.config import Settings
from tests.fixtures import quiet_settings
from tests.helpers import enqueue

# An event larger than the socket buffers (4 MB at most here, tcp_wmem) and the response's
# write buffer can hold, so that the next event's write waits for the client to read.
BLOB_BYTES = 5 * 1024 * 1024


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(max_payload_bytes=2 * BLOB_BYTES)


async def _stalled_stream(url: str, query: str) -> socket.socket:
    """A stream request from a client that reads nothing, with a tiny receive buffer."""
    u = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (u.hostname, u.port))
    request = f"GET /v2/jobs/stream?{query} HTTP/1.1\r\nHost: {u.netloc}\r\n\r\n"
    await asyncio.get_running_loop().sock_sendall(sock, request.encode())
    return sock


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST, unread data discarded


async def _until(condition, timeout_s: float = 20) -> None:
    """Waits for a condition of the server's stream registry, which has no event."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - nothing to await but the condition
            await asyncio.sleep(0.01)


async def test_a_job_whose_write_was_cut_by_a_reset_returns_at_once(live):
    blob = {"blob": "x" * BLOB_BYTES}
    await enqueue(live.client, "cut", "acme", 1, variables=blob)
    sock = await _stalled_stream(live.url, "type=cut&maxJobs=3&timeout=600000")
    try:
        registry = live.services.activation.streams
        # The first job's write is handed over (it fills the buffers) and the stream waits
        # for more with its two credits left.
        await _until(lambda: any(s.waiter is not None for s in registry.streams))
        [stream] = registry.streams
        assert len(stream.outstanding) == 1
        # The next two go out together, a write that waits for the client to read.
        await enqueue(live.client, "cut", "acme", 2, variables=blob)
        await _until(lambda: len(stream.outstanding) == 3 and stream.waiter is None)
        assert len(stream.undelivered) == 2
    finally:
        _reset(sock)
    await _until(lambda: not registry.streams)
    rows = await live.services.db.fetch(
        "SELECT state, count(*) FROM jobs WHERE job_type = 'cut' GROUP BY state"
    )
    # The cut write's two are back; the first, written into buffers the client may or
    # may not have read, keeps its lease.
    assert dict(rows) == {"ACTIVATED": 1, "CREATED": 2}


async def test_a_client_that_reads_only_the_head_gets_back_what_never_left(live):
    """A claim's jobs go out in writes of WRITE_BYTES, not all in one: a client that
    resets after the response head holds only what the buffers took (a review of
    7cc294a: with one write per claim, all forty of these stayed ACTIVATED until their
    leases ended, though 5 of their 8 MB never left the server)."""
    n, size = 40, 200 * 1024
    for _ in range(0, n, 10):
        await enqueue(live.client, "head", "acme", 10, variables={"blob": "x" * size})
    sock = await _stalled_stream(live.url, f"type=head&maxJobs={n}&timeout=600000")
    try:
        head = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1024), 10)
        assert head.startswith(b"HTTP/1.1 200")
        registry = live.services.activation.streams
        # Claimed, and writing until the buffers are full: the stream waits in a write.
        await _until(lambda: any(len(s.outstanding) == n for s in registry.streams))
        [stream] = registry.streams
        await _until(lambda: stream.undelivered and stream.waiter is None)
    finally:
        _reset(sock)
    await _until(lambda: not registry.streams)
    rows = await live.services.db.fetch(
        "SELECT state, count(*) FROM jobs WHERE job_type = 'head' GROUP BY state"
    )
    states = dict(rows)
    # What loopback's buffers hold at most (the server's send buffer, 4 MB here): the
    # rest never left, and is back.
    assert states.get("ACTIVATED", 0) * size < 5 * 1024 * 1024, states
    assert states["CREATED"] == n - states.get("ACTIVATED", 0)
