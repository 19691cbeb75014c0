"""``jobfair serve --ssl-certfile --ssl-keyfile``: HTTPS from a real server process (and
from every process of ``--workers 2``), with API keys required, its certificate verified
against the test's own CA; plain HTTP on its port gets no answer."""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from app.db import Database
from app.keys import KeyService, Role
from tests.fixtures import ServerProcess, Tls, wait_ready


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def https_server(spawn_server, tls: Tls, *args: str) -> ServerProcess:
    server = spawn_server(*tls.args, *args, JOBFAIR_AUTH="required")
    assert server.url.startswith("https://")
    async with httpx.AsyncClient(base_url=server.url, verify=tls.client_context()) as c:
        # Bounded: a server that answered plain HTTP would never be ready over HTTPS.
        await asyncio.wait_for(wait_ready(c, server), timeout=60)
    return server


async def round_trip(url: str, tls: Tls, store: Database) -> None:
    """Create, activate and complete a job over HTTPS, each call with its key."""
    keys = KeyService(store)
    _, producer = await keys.create(Role.PRODUCER, ["acme"], None, None, None, "test")
    _, worker = await keys.create(Role.WORKER, ["acme"], None, None, None, "test")
    async with httpx.AsyncClient(base_url=url, verify=tls.client_context(), timeout=30) as c:
        r = await c.post("/v2/jobs", json={"type": "mail", "tenantId": "acme"})
        assert r.status_code == 401, r.text  # keys are required over TLS too
        r = await c.post(
            "/v2/jobs",
            json={"type": "mail", "tenantId": "acme", "variables": {"to": "a@b"}},
            headers=bearer(producer),
        )
        assert r.status_code == 201, r.text
        key = r.json()["jobKey"]
        act = {"type": "mail", "maxJobs": 1, "timeout": 60000, "requestTimeout": 5000}
        r = await c.post("/v2/jobs/activate", json=act, headers=bearer(worker))
        [job] = r.json()["jobs"]
        assert job["jobKey"] == key and job["variables"] == {"to": "a@b"}
        r = await c.post(
            f"/v2/jobs/{key}/complete",
            json={"activationCount": job["activationCount"], "variables": {"sent": True}},
            headers=bearer(worker),
        )
        assert r.status_code == 204, r.text
        done = (await c.get(f"/v2/jobs/{key}", headers=bearer(producer))).json()
        assert done["state"] == "COMPLETED" and done["variables"] == {"to": "a@b", "sent": True}


async def assert_no_plain_http(url: str) -> None:
    plain = url.replace("https://", "http://", 1)
    async with httpx.AsyncClient(timeout=10) as c:
        with pytest.raises(httpx.TransportError):
            await c.get(f"{plain}/healthz")


async def assert_unverified_is_refused(url: str) -> None:
    """The system's trust store does not know the test's CA: the check is real."""
    async with httpx.AsyncClient(timeout=10) as c:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await c.get(f"{url}/healthz")


async def test_one_process_serves_https_with_keys(spawn_server, tls: Tls, store: Database):
    server = await https_server(spawn_server, tls)
    await round_trip(server.url, tls, store)
    await assert_no_plain_http(server.url)
    await assert_unverified_is_refused(server.url)


def _workers(server: ServerProcess) -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process(server.proc.pid).children()
        if "spawn_main" in " ".join(child.cmdline())
    ]


async def test_every_process_of_workers_2_serves_https(spawn_server, tls: Tls, store: Database):
    server = await https_server(spawn_server, tls, "--workers", "2")
    workers = {p.pid: p for p in _workers(server)}
    assert len(workers) == 2
    await round_trip(server.url, tls, store)
    await assert_no_plain_http(server.url)
    # New connections until each process has completed a handshake and answered on one
    # (the kernel spreads connections over the processes by their address hash).
    u = urlsplit(server.url)
    context = tls.client_context()
    served: set[int] = set()
    for _ in range(64):
        reader, writer = await asyncio.open_connection(
            u.hostname, u.port, ssl=context, server_hostname="127.0.0.1"
        )
        assert isinstance(writer.get_extra_info("ssl_object"), ssl.SSLObject)
        local_port = writer.get_extra_info("sockname")[1]
        # The handshake is done: the process that made it holds the connection.
        [owner] = [
            pid
            for pid, p in workers.items()
            if any(c.raddr and c.raddr.port == local_port for c in p.net_connections("tcp"))
        ]
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        served.add(owner)
        await reader.read()  # to the server's close
        writer.close()
        await writer.wait_closed()
        if served == set(workers):
            break
    assert served == set(workers)
