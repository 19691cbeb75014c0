"""jobfair_client.transport against a small HTTP/1.1 server written here, in the shapes a
real server takes: keep-alive and ``Connection: close``, chunked answers, answers larger
than what the transport buffers, a connection the server closes while idle or cuts
mid-answer, an answer that never comes, a port nobody listens on."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from jobfair_client.client import AsyncJobfair, Backoff
from jobfair_client.transport import PAUSE_AT_BYTES, FastTransport

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # False: close after it


class Server:
    """Reads requests (head + Content-Length body) and lets ``answer`` write each
    answer; records the requests and how many connections it accepted."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.answer(request, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> Server:
        s = Server(answer)
        listener = await asyncio.start_server(s.handle, "127.0.0.1", 0)
        servers.append(listener)
        s.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        return s

    yield start
    for listener in servers:
        listener.close()
        await listener.wait_closed()


def fixed(body: bytes, *headers: bytes) -> Answer:
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(
            h + b"\r\n" for h in headers
        )
        writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return b"Connection: close" not in headers

    return answer


def client(url: str, **options: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, transport=FastTransport(), timeout=5, **options)  # type: ignore[arg-type]


async def test_a_connection_is_kept_and_reused(serve):
    server = await serve(fixed(b'{"ok": 1}'))
    async with client(server.url) as http:
        for i in range(5):
            r = await http.post("/v2/x", json={"i": i}, params={"a": "b c"})
            assert r.status_code == 200 and r.json() == {"ok": 1}
    assert server.connections == 1 and len(server.requests) == 5
    head, body = server.requests[0].split(b"\r\n\r\n")
    assert head.startswith(b"POST /v2/x?a=b+c HTTP/1.1\r\n")
    assert b"\r\nContent-Length: %d" % len(body) in head and b'"i"' in body


async def test_connection_close_is_honoured(serve):
    server = await serve(fixed(b"{}", b"Connection: close"))
    async with client(server.url) as http:
        for _ in range(3):
            assert (await http.get("/")).status_code == 200
    assert server.connections == 3


async def test_a_chunked_answer_is_decoded(serve):
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b'{"a"', b": [1, 2", b", 3]}"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        return True

    server = await serve(answer)
    async with client(server.url) as http:
        assert (await http.get("/")).json() == {"a": [1, 2, 3]}
        assert (await http.get("/")).json() == {"a": [1, 2, 3]}
    assert server.connections == 1


async def test_a_body_without_a_length_ends_where_the_connection_closes(serve):
    async def until_close(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        for part in (b'{"a": ', b"[1, 2]}"):
            writer.write(part)
            await writer.drain()
        return False  # the handler closes: that is the body's end

    server = await serve(until_close)
    async with client(server.url) as http:
        for _ in range(2):
            assert (await http.get("/")).json() == {"a": [1, 2]}
    assert server.connections == 2


async def test_an_answer_larger_than_the_buffer_streams_whole(serve):
    body = bytes(range(256)) * (3 * PAUSE_AT_BYTES // 256)
    server = await serve(fixed(body))
    async with client(server.url) as http:
        async with http.stream("GET", "/") as r:
            got = bytearray()
            async for chunk in r.aiter_bytes():
                got += chunk
                await asyncio.sleep(0)  # a slow reader: the transport pauses and resumes
        assert bytes(got) == body
        assert (await http.get("/")).content == body  # and the connection is reusable
    assert server.connections == 1


async def test_an_idle_connection_the_server_closed_is_not_reused(serve):
    close_now = asyncio.Event()

    async def then_close(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await fixed(b"{}")(request, writer)
        await close_now.wait()  # as uvicorn's keep-alive timeout, on the test's signal
        return False

    server = await serve(then_close)
    transport = FastTransport()
    async with httpx.AsyncClient(base_url=server.url, transport=transport) as http:
        assert (await http.post("/v2/jobs", json={})).status_code == 200
        [idle] = [c for conns in transport._idle.values() for c in conns]
        close_now.set()
        await asyncio.wait_for(idle.lost, timeout=5)  # the client saw the server go
        close_now.clear()
        # A request that must not be sent twice goes out on a new connection.
        assert (await http.post("/v2/jobs", json={})).status_code == 200
    assert server.connections == 2 and len(server.requests) == 2


async def test_a_connection_that_speaks_unasked_is_not_reused(serve):
    async def chatty(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await fixed(b"{}")(request, writer)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"x":1}')  # unasked
        await writer.drain()
        return True

    server = await serve(chatty)
    transport = FastTransport()
    async with httpx.AsyncClient(base_url=server.url, transport=transport) as http:
        assert (await http.get("/")).json() == {}
        # The extra answer came with the first or just after it: either way the
        # connection is closed, not kept for the next request.
        [conn] = transport._open or [None]
        if conn is not None:
            await asyncio.wait_for(conn.lost, timeout=5)
        assert (await http.get("/")).json() == {}  # not the stale {"x": 1}
    assert server.connections == 2


async def test_an_interim_answer_is_skipped(serve):
    async def early_hints(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
        await writer.drain()
        await fixed(b'{"a": 1}')(request, writer)
        return True

    server = await serve(early_hints)
    async with client(server.url) as http:
        for _ in range(2):
            r = await http.get("/")
            assert r.status_code == 200 and r.json() == {"a": 1} and "link" not in r.headers
    assert server.connections == 1


async def test_a_body_left_unread_does_not_stall_the_next_request(serve):
    big = b"x" * (PAUSE_AT_BYTES + 10)

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await fixed(big if b"GET /big" in request else b"{}")(request, writer)
        return True

    server = await serve(answer)
    async with client(server.url) as http:
        async with http.stream("GET", "/big") as r:
            assert r.status_code == 200  # and closed unread, its reading paused
        small = await http.get("/small", timeout=httpx.Timeout(5, read=2))
        assert small.json() == {}


async def test_a_header_that_would_split_the_request_is_refused(serve):
    server = await serve(fixed(b"{}"))
    async with client(server.url) as http:
        for bad in ("k\r\nX-Injected: yes", "k\nX: y", "k\x00"):
            with pytest.raises(httpx.LocalProtocolError):
                await http.get("/", headers={"Authorization": f"Bearer {bad}"})
    assert server.requests == []


async def test_headers_beyond_64_kib_are_refused(serve):
    async def huge(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 100_000 + b"\r\n")
        writer.write(b"Content-Length: 2\r\n\r\n{}")
        await writer.drain()
        return False

    server = await serve(huge)
    async with client(server.url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_a_cut_answer_is_a_read_error_and_is_retried_only_if_safe(serve):
    async def cut(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        return False

    server = await serve(cut)
    async with client(server.url) as http:
        with pytest.raises(httpx.ReadError):
            await http.get("/")
    fast = Backoff(base_ms=1, max_ms=1)
    async with AsyncJobfair(
        server.url, backoff=fast, max_attempts=3, idempotent_creates=False
    ) as jf:
        before = len(server.requests)
        with pytest.raises(httpx.ReadError):
            await jf.create_job("t")  # no idempotency key: sent once
        assert len(server.requests) == before + 1
        with pytest.raises(httpx.ReadError):
            await jf.complete(("1", 1))  # fenced: safe to send again, three attempts
        assert len(server.requests) == before + 4
    async with AsyncJobfair(server.url, backoff=fast, max_attempts=3) as jf:
        before = len(server.requests)
        with pytest.raises(httpx.ReadError):
            await jf.create_job("t")  # a key of the client's own: safe, three attempts
        assert len(server.requests) == before + 3


async def test_no_answer_is_a_read_timeout(serve):
    async def silent(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.Event().wait()
        return False

    server = await serve(silent)
    async with client(server.url) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/", timeout=httpx.Timeout(5, read=0.2))


async def test_nobody_listening_is_a_connect_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        async with client(f"http://127.0.0.1:{port}") as http:
            with pytest.raises(httpx.ConnectError):
                await http.get("/")


async def test_a_malformed_answer_is_a_protocol_error(serve):
    async def garbage(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 abc nonsense\r\n\r\n")
        return False

    server = await serve(garbage)
    async with client(server.url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")
