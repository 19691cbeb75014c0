"""The client retries back pressure (503 + Retry-After) and sends its API key."""

from __future__ import annotations

import asyncio
import socket

import pytest
from jobfair_client import AsyncJobfair, Backoff, InvalidArgument, ResourceExhausted

from tests.fixtures import quiet_settings


@pytest.fixture
def settings():
    return quiet_settings(max_waiters=1)  # a second waiting long poll is refused with 503


async def hold_the_waiter_slot(live, ms: int) -> asyncio.Task:
    """A long poll on an empty type that takes the only waiter slot for ``ms``; returns
    once the server holds it (it exposes a counter, not an event)."""
    holder = asyncio.create_task(
        live.client.post(
            "/v2/jobs/activate",
            json={"type": "idle", "maxJobs": 1, "timeout": 1000, "requestTimeout": ms},
        )
    )
    while live.services.activation.waiters.waiting < 1:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return holder


async def test_a_503_is_retried_after_retry_after(live):
    c = live.client
    holder = await hold_the_waiter_slot(live, 1500)
    async with AsyncJobfair(live.url) as jf:
        # A long poll now is refused (503, Retry-After: 1) and retried until the slot frees;
        # the job it then waits for is created only after the holder has gone.
        later = asyncio.create_task(jf.activate("later", request_timeout_ms=10_000))
        assert (await holder).json() == {"jobs": []}
        await c.post("/v2/jobs", json={"type": "later"})
        jobs = await later
        assert len(jobs) == 1 and jobs[0].type == "later"
        assert jf.retried >= 1


async def test_back_pressure_surfaces_once_attempts_run_out(live):
    holder = await hold_the_waiter_slot(live, 3000)
    async with AsyncJobfair(live.url, max_attempts=1) as jf:
        with pytest.raises(ResourceExhausted) as refused:
            await jf.activate("other", request_timeout_ms=5000)
    assert refused.value.status == 503 and refused.value.retry_after_s == 1
    await holder


async def test_other_4xx_are_not_retried(live):
    async with AsyncJobfair(live.url) as jf:
        with pytest.raises(InvalidArgument):
            await jf.activate("bad type!")
        assert jf.retried == 0


async def test_the_api_key_is_sent_as_a_bearer_token():
    """Jobfair's own auth is not built yet, so a plain socket server records the header."""
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(
                b":"
            )[1]
        )
        await reader.readexactly(length)
        body = b'{"jobs": []}'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, AsyncJobfair(f"http://127.0.0.1:{port}", api_key="jf_secret") as jf:
        assert await jf.activate("t", request_timeout_ms=-1) == []
    assert b"authorization: Bearer jf_secret" in seen[0].lower().replace(b"bearer", b"Bearer")


async def test_connection_errors_are_retried_until_the_server_is_up():
    """Nothing listens at first; the server comes up after the client's first failures."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(
                b":"
            )[1]
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n"
        )
        writer.write(b'{"jobs": []}')
        await writer.drain()
        writer.close()

    async with AsyncJobfair(f"http://127.0.0.1:{port}", backoff=Backoff(base_ms=100)) as jf:
        call = asyncio.create_task(jf.activate("t", request_timeout_ms=-1))
        while jf.retried < 1:  # noqa: ASYNC110 - the client's counter; there is no event
            await asyncio.sleep(0.01)
        server = await asyncio.start_server(answer, "127.0.0.1", port)
        async with server:
            assert await call == []
    assert jf.retried >= 1
