"""While the database is unreachable every call answers 503 RESOURCE_EXHAUSTED with
``Retry-After`` (come back later), never 500; once it is back the same server serves
again, without a restart, and nothing was lost.

The server reaches PostgreSQL through a TCP proxy here.  Cutting the proxy is the outage:
the established connections are reset and new ones refused, as when the database
restarts or the network between them fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.acceptance.test_long_polling import until_waiting
from tests.acceptance.test_streams import Events
from tests.fixtures import Live, ServerProcess, quiet_settings, serving, wait_ready
from tests.helpers import activate, assert_problem, complete
from tests.integration.test_supervisor import _until, _workers


class Proxy:
    """127.0.0.1:port -> the embedded server's Unix socket, byte for byte."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.port = 0  # the first open takes one the system gives, and keeps it after
        self.server: asyncio.Server | None = None
        self.links: set[asyncio.StreamWriter] = set()
        # Bytes that, once passed on to the database, cut the proxy: its answer is lost.
        self.cut_after: bytes | None = None

    async def open(self) -> None:
        # Not a port found free beforehand: under load another process took one between
        # the look and the bind ("address already in use" at setup, in two full runs).
        self.server = await asyncio.start_server(self._link, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        self.server = None
        for writer in self.links:
            writer.transport.abort()
        self.links.clear()

    async def _link(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_unix_connection(self.socket_path)
        self.links |= {down_w, up_w}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, up: bool) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await r.read(65536):
                    w.write(data)
                    if up and self.cut_after is not None and self.cut_after in data:
                        self.cut_after = None
                        self.cut()  # before the answer can come back
                        return
                    await w.drain()
            w.transport.abort()

        await asyncio.gather(pipe(down_r, up_w, True), pipe(up_r, down_w, False))


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[Proxy]:
    parts = urlsplit(db_url)
    socket_dir = parse_qs(parts.query)["host"][0]
    p = Proxy(f"{socket_dir}/.s.PGSQL.5432")
    await p.open()
    yield p
    if p.server is not None:
        p.cut()


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(backup_poll_ms=200)


def proxied(proxy: Proxy, db_url: str) -> str:
    database = urlsplit(db_url).path
    return f"postgresql://postgres@127.0.0.1:{proxy.port}{database}?sslmode=disable"


@pytest.fixture
async def behind_proxy(proxy: Proxy, db_url: str, settings: Settings) -> AsyncIterator[Live]:
    async with serving(create_app(settings, proxied(proxy, db_url), background=False)) as server:
        yield server


async def test_calls_during_an_outage_answer_503_and_the_server_recovers(
    behind_proxy: Live, proxy: Proxy
) -> None:
    client = behind_proxy.client
    r = await client.post("/v2/jobs", json={"type": "outage"})
    assert r.status_code == 201, r.text
    [held] = await activate(client, "outage")
    r = await client.post("/v2/jobs", json={"type": "outage"})
    waiting_key = r.json()["jobKey"]

    proxy.cut()
    key, count = held["jobKey"], held["activationCount"]
    calls = [
        ("POST", "/v2/jobs", {"type": "outage"}),
        ("POST", "/v2/jobs/batch", {"jobs": [{"type": "outage"}]}),
        (
            "POST",
            "/v2/jobs/activate",
            {"type": "outage", "maxJobs": 1, "timeout": 1000, "requestTimeout": -1},
        ),
        (
            "POST",
            "/v2/jobs/activate",
            {"type": "outage", "maxJobs": 1, "timeout": 1000, "requestTimeout": 500},
        ),
        ("POST", f"/v2/jobs/{key}/complete", {"activationCount": count}),
        ("POST", f"/v2/jobs/{key}/fail", {"activationCount": count, "retries": 1}),
        ("POST", f"/v2/jobs/{key}/error", {"activationCount": count, "errorCode": "E"}),
        ("POST", "/v2/jobs/complete", {"jobs": [{"jobKey": key, "activationCount": count}]}),
        ("PATCH", f"/v2/jobs/{key}", {"activationCount": count, "changeset": {"retries": 5}}),
        ("GET", f"/v2/jobs/{key}", None),
        ("POST", f"/v2/jobs/{waiting_key}/cancel", None),
        ("GET", "/v2/stats", None),
        ("PUT", "/v2/tenants/t1", {"weight": 2}),
        ("GET", "/v2/job-types/outage", None),
        ("GET", "/readyz", None),
    ]
    for method, path, body in calls:
        r = await client.request(method, path, json=body)
        assert_problem(r, 503, "RESOURCE_EXHAUSTED")
        assert int(r.headers["Retry-After"]) >= 1, (method, path)

    await proxy.open()
    # The held job kept its lease, and the waiting one is still there to take.
    assert (await complete(client, held)).status_code == 204
    [again] = await activate(client, "outage")
    assert again["jobKey"] == waiting_key
    assert (await client.get("/readyz")).status_code == 200


async def test_streams_and_waiting_polls_outlast_an_outage_and_get_jobs_after_it(
    behind_proxy: Live, proxy: Proxy
) -> None:
    """A stream is a subscription: one that was open when the database went away, and one
    opened while it was away, both deliver the jobs created once it is back.  A long poll
    that was waiting stays queued through it and gets a job too."""
    client = behind_proxy.client
    path = "/v2/jobs/stream?type=outage-s&maxJobs=1&timeout=60000"
    async with client.stream("GET", path) as before:
        early = Events(before)
        r = await client.post("/v2/jobs", json={"type": "outage-s"})
        first = await early.next_job()
        assert first["jobKey"] == r.json()["jobKey"]
        poll = asyncio.create_task(
            client.post(
                "/v2/jobs/activate",
                json={
                    "type": "outage-s",
                    "maxJobs": 1,
                    "timeout": 60_000,
                    "requestTimeout": 20_000,
                },
            )
        )
        await until_waiting(client, 1)  # the poll (the stream has no credit left)

        proxy.cut()
        # The stream's credit comes back while the database is away: its check and its
        # next activation fail, and it must keep going.
        assert (await complete(client, first)).status_code == 503
        async with client.stream("GET", path) as during:
            assert during.status_code == 200
            late = Events(during)
            await asyncio.sleep(0.5)  # several of the streams' backup checks fail meanwhile
            await proxy.open()
            assert (await complete(client, first)).status_code == 204
            keys = set()
            for _ in range(3):
                r = await client.post("/v2/jobs", json={"type": "outage-s"})
                assert r.status_code == 201, r.text
                keys.add(r.json()["jobKey"])
            got = {(await early.next_job())["jobKey"], (await late.next_job())["jobKey"]}
            polled = await poll
            assert polled.status_code == 200, polled.text
            got |= {j["jobKey"] for j in polled.json()["jobs"]}
            assert got == keys


async def test_sigterm_while_the_database_is_away_answers_the_waiters_and_exits_0(
    proxy: Proxy, db_url: str, spawn_server: Callable[..., ServerProcess]
) -> None:
    server = spawn_server(JOBFAIR_DATABASE_URL=proxied(proxy, db_url))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await wait_ready(client, server)
        body = {"type": "outage-t", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 30_000}
        poll = asyncio.create_task(client.post("/v2/jobs/activate", json=body))
        await until_waiting(client, 1)
        async with client.stream(
            "GET", "/v2/jobs/stream?type=outage-t&maxJobs=1&timeout=60000"
        ) as s:
            assert s.status_code == 200
            proxy.cut()
            server.proc.send_signal(signal.SIGTERM)
            answered = await poll
            assert answered.status_code == 200, answered.text
            assert answered.json() == {"jobs": []}
        code = await asyncio.wait_for(asyncio.to_thread(server.proc.wait), timeout=20)
    assert code == 0, server.log.read_text()


async def _until_logged(server: ServerProcess, text: str, timeout_s: float = 20) -> None:
    """Polls the server's log (another process: no event to wait on); fails if it exits."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while text not in server.log.read_text():
        assert server.proc.poll() is None, server.log.read_text()
        assert asyncio.get_running_loop().time() < deadline, server.log.read_text()
        await asyncio.sleep(0.1)


async def test_background_work_outlasts_an_outage_and_resumes_after_it(
    proxy: Proxy, db_url: str, spawn_server: Callable[..., ServerProcess]
) -> None:
    """With the sweepers and the stats sampler on their timers, an outage is logged and
    waited out: the process keeps serving (503s), and once the database is back an
    expired lease is swept again."""
    server = spawn_server(
        JOBFAIR_DATABASE_URL=proxied(proxy, db_url), JOBFAIR_LEASE_SWEEP_INTERVAL_MS="100"
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await wait_ready(client, server)
        proxy.cut()
        await _until_logged(server, "stats-sampler: database unavailable")
        assert_problem(await client.get("/readyz"), 503, "RESOURCE_EXHAUSTED")
        await proxy.open()
        await wait_ready(client, server)
        r = await client.post("/v2/jobs", json={"type": "outage-b"})
        assert r.status_code == 201, r.text
        body = {"type": "outage-b", "maxJobs": 1, "timeout": 200, "requestTimeout": -1}
        [first] = (await client.post("/v2/jobs/activate", json=body)).json()["jobs"]
        # The lease sweeper gives it back once its 200 ms lease has expired.
        again = await client.post("/v2/jobs/activate", json={**body, "requestTimeout": 10_000})
        [second] = again.json()["jobs"]
        assert second["jobKey"] == first["jobKey"]
        assert second["activationCount"] == first["activationCount"] + 1
    assert server.proc.poll() is None


async def test_a_server_started_while_the_database_is_away_waits_for_it(
    proxy: Proxy, db_url: str, spawn_server: Callable[..., ServerProcess]
) -> None:
    proxy.cut()
    server = spawn_server(JOBFAIR_DATABASE_URL=proxied(proxy, db_url))
    await _until_logged(server, "start-up: database unreachable")
    await proxy.open()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await wait_ready(client, server)


async def test_a_replacement_process_that_cannot_start_leaves_the_others_serving(
    proxy: Proxy, db_url: str, spawn_server: Callable[..., ServerProcess]
) -> None:
    """With --workers 2, one process dies while the database is away, and its
    replacement gives up waiting for it (after 1 s here).  The supervisor starts another
    later; the healthy process keeps serving meanwhile, and both serve once it is back."""
    server = spawn_server(
        JOBFAIR_DATABASE_URL=proxied(proxy, db_url),
        JOBFAIR_WORKERS="2",
        JOBFAIR_DB_STARTUP_WAIT_S="1",
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await wait_ready(client, server)
        victim, survivor = _workers(server)
        proxy.cut()
        victim.kill()
        await _until_logged(server, "failed to start; trying again")
        assert survivor.is_running()
        assert_problem(await client.get("/readyz"), 503, "RESOURCE_EXHAUSTED")
        await proxy.open()
        await _until(
            lambda: len(_workers(server)) == 2 and b"has started" in server.log.read_bytes()
        )
        await wait_ready(client, server)
        assert survivor.is_running()


async def test_a_call_whose_commit_went_unanswered_says_its_outcome_is_unknown(
    behind_proxy: Live, proxy: Proxy
) -> None:
    """The COMMIT of a creation reaches PostgreSQL and its answer is lost: the job exists,
    but the server cannot know it.  It answers 503 OUTCOME_UNKNOWN without Retry-After
    (not RESOURCE_EXHAUSTED, whose retry is always safe): sent again without an
    idempotency key, the call would create a second job."""
    client = behind_proxy.client
    proxy.cut_after = b"COMMIT"
    r = await client.post("/v2/jobs", json={"type": "outage-u"})
    problem = assert_problem(r, 503, "OUTCOME_UNKNOWN")
    assert problem["type"] == "urn:jobfair:outcome-unknown"
    assert "Retry-After" not in r.headers
    # A call that failed before its commit is plainly unavailable: safe to send again.
    r = await client.post("/v2/jobs", json={"type": "outage-u"})
    assert_problem(r, 503, "RESOURCE_EXHAUSTED")
    assert r.headers["Retry-After"] == "1"
    await proxy.open()
    found = await client.post("/v2/jobs/search", json={"filter": {"type": "outage-u"}})
    assert found.status_code == 200, found.text
    assert len(found.json()["items"]) == 1  # the first one committed
