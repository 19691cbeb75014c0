"""Issue 20 §3: a slow or oversized request cannot hold the server.

A request's headers must arrive within JOBFAIR_REQUEST_HEADER_TIMEOUT_MS and its body
within JOBFAIR_REQUEST_BODY_TIMEOUT_MS (408), its headers are bounded in size and count
(431), and a client that goes away mid-body is not an error.  Timeouts are 1 s here.
"""

from __future__ import annotations

import asyncio
import resource
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from app.config import Settings
from tests.fixtures import quiet_settings, wait_ready

LIMITS = {"request_header_timeout_ms": 1000, "request_body_timeout_ms": 1000}
ENV = {f"JOBFAIR_{k.upper()}": str(v) for k, v in LIMITS.items()}


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(**LIMITS)


async def _open(url: str, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and the rest, read to the end: the server closes the connection.
    Status 0: closed without an answer (a process at its descriptor limit sheds new
    connections: libuv accepts and closes them)."""
    try:
        raw = await asyncio.wait_for(reader.read(), timeout=10)
    except ConnectionResetError:
        return 0, b""
    head, _, body = raw.partition(b"\r\n\r\n")
    return (int(head.split()[1]) if head else 0), body


async def _honest_request(client: httpx.AsyncClient) -> httpx.Response:
    """GET /v2/stats as a client that retries a refused connection would, for 5 s."""
    async with asyncio.timeout(5):
        while True:
            try:
                return await client.get("/v2/stats", headers={"connection": "close"})
            except httpx.TransportError:
                await asyncio.sleep(0.1)


async def test_slow_clients_are_answered_408_and_cannot_exhaust_descriptors(spawn_server):
    # A server process allowed 256 descriptors, facing 300 connections that each send
    # half a request: without a header timeout they hold its descriptors for good, and
    # an honest request is never accepted.
    server = spawn_server(**ENV, JOBFAIR_DB_POOL_SIZE="4")
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
        await wait_ready(client, server)
        resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (256, 256))
        slow = [
            await _open(server.url, b"GET /v2/stats HTTP/1.1\r\nHost: x\r\n") for _ in range(300)
        ]
        try:
            assert (await _honest_request(client)).status_code == 200
            answers = await asyncio.gather(*(_answer(reader) for reader, _ in slow))
        finally:
            for _, writer in slow:
                writer.close()
    accepted = [status for status, _ in answers if status]
    assert accepted and set(accepted) == {408}
    assert b"Traceback" not in server.log.read_bytes()


async def _raw_status(url: str, data: bytes) -> tuple[int, bytes]:
    status, body, _ = await _raw_answer(url, data)
    return status, body


async def _raw_answer(url: str, data: bytes) -> tuple[int, bytes, bytes]:
    """The status, body and head of the server's answer to ``data``."""
    reader, writer = await _open(url, data)
    try:
        raw = await asyncio.wait_for(reader.read(), timeout=10)
    except ConnectionResetError:
        return 0, b"", b""
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return (int(head.split()[1]) if head else 0), body, head


async def test_a_trickled_body_is_answered_408(live):
    head = b"POST /v2/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    status, body = await _raw_status(live.url, head + b"Content-Length: 100\r\n\r\n{")
    assert status == 408
    assert b"REQUEST_TIMEOUT" in body


async def test_a_megabyte_of_headers_is_answered_431(live):
    huge = b"GET /v2/stats HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1024 * 1024 + b"\r\n\r\n"
    status, body = await _raw_status(live.url, huge)
    assert status == 431
    assert b"urn:jobfair:request-header-fields-too-large" in body


async def test_ten_thousand_headers_are_answered_431(live):
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(10_000))
    status, _ = await _raw_status(
        live.url, b"GET /v2/stats HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n"
    )
    assert status == 431


async def test_requests_within_the_limits_are_served(live):
    headers = {f"x-h{i}": "v" * 200 for i in range(90)}
    r = await live.client.get("/v2/stats", headers=headers)
    assert r.status_code == 200


async def test_a_client_gone_mid_body_is_not_an_unhandled_error(spawn_server):
    server = spawn_server(**ENV)
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
        await wait_ready(client, server)
        head = b"POST /v2/jobs/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        for path in (b"/v2/jobs/batch", b"/v2/jobs/1/complete", b"/v2/tenants/acme"):
            data = head.replace(b"/v2/jobs/batch", path) + b"Content-Length: 1000\r\n\r\n{"
            if path.startswith(b"/v2/tenants"):
                data = data.replace(b"POST", b"PUT")
            reader, writer = await _open(server.url, data)
            writer.close()
            await reader.read()  # the server closes too
        # One honest request after them, so that the server has handled what went before.
        assert (await client.get("/v2/stats")).status_code == 200
    log = server.log.read_text()
    assert "Traceback" not in log and "unhandled error" not in log, log


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /v2/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\x00b\r\n\r\n",
        b"GET /v2/stats HTTP/1.1\r\nHost: x\r\nX-Bad\x01Name: v\r\n\r\n",
        b"GET /v2/st ats HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",  # a TLS hello on the plain port
    ],
    ids=["nul-in-a-header", "control-in-a-name", "space-in-the-target", "tls-on-http"],
)
async def test_a_malformed_request_is_answered_400_problem_json_with_a_request_id(
    live, raw, caplog
):
    """httptools refuses these before any route sees them; the answer is still a problem
    a client can read, with an id to find the server's log line by."""
    status, body, head = await _raw_answer(live.url, raw)
    assert status == 400
    assert b"content-type: application/problem+json" in head.lower()
    problem = orjson.loads(body)
    assert problem["title"] == "INVALID_ARGUMENT" and problem["detail"].startswith("malformed")
    rid = problem["requestId"]
    assert f"x-request-id: {rid}".encode() in head.lower()
    assert any(getattr(r, "requestId", None) == rid for r in caplog.records), caplog.text


async def test_a_refused_slow_request_carries_a_request_id_too(live):
    head = b"POST /v2/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    status, body, answer_head = await _raw_answer(live.url, head + b"Content-Length: 100\r\n\r\n{")
    assert status == 408
    rid = orjson.loads(body)["requestId"]
    assert f"x-request-id: {rid}".encode() in answer_head.lower()


async def test_headers_too_large_in_one_read_are_refused_once_and_log_no_error(live, caplog):
    """The parser refuses them (431 through send_400_response) and the byte count of the
    same read did too: the second answer was written after the first had ended the
    stream, and asyncio logged a traceback for each such request."""
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    status, _ = await _raw_status(live.url, big)
    assert status == 431
    refusals = [r for r in caplog.records if r.getMessage().startswith("refused with")]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
