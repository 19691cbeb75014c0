"""deploy/compose.yaml's topology without containers: Debian's HAProxy, run as an
unprivileged user with deploy/haproxy/haproxy.cfg unchanged (a byte-for-byte copy that
user can read; its addresses come from the environment), in front of two `jobfair serve`
processes on one database.  Jobs drain through it from both replicas, streams and long
polls pass through it unbuffered and uncut, and a replica's 503 reaches the client as the
replica wrote it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.routes import OPERATIONS
from app.cli.main import IDLE_CONNECTION_TIMEOUT_S
from app.config import Settings
from app.domain import MAX_REQUEST_TIMEOUT_MS
from tests.acceptance.test_streams import Events
from tests.fixtures import TEMPLATE, Postgres, free_port
from tests.helpers import assert_problem, complete, enqueue

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
# Per replica, so that the 503 test can fill both with a few long polls.
MAX_WAITERS = 4
DEADLINE_S = 20.0
# Start-up on a loaded machine (four test runs at once, two cores) takes its time.
START_S = 90.0


@dataclass
class Replica:
    name: str  # its `server` name in haproxy.cfg
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


@dataclass
class Topology:
    url: str  # the balancer
    stats_url: str  # its Prometheus exporter
    replicas: list[Replica]
    haproxy: subprocess.Popen[bytes]
    haproxy_log: Path


def _haproxy() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.skip("haproxy is not installed (make test installs Debian's haproxy)")
    return found


def _unprivileged() -> dict[str, str]:
    """Run as nobody when the tests run as root: the config must need no privilege."""
    return {"user": "nobody", "group": "nogroup"} if os.geteuid() == 0 else {}


def _readable_copy(folder: Path) -> Path:
    """haproxy.cfg, byte for byte, where any user may read it (a checkout under /root, or
    pytest's own temporary folders, are closed to nobody)."""
    folder.chmod(0o755)
    copy = folder / CONFIG.name
    shutil.copyfile(CONFIG, copy)
    copy.chmod(0o644)
    assert copy.read_bytes() == CONFIG.read_bytes()
    return copy


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _started(check, what: str, log: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + START_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {START_S} s:\n{log.read_text()}")
        time.sleep(0.05)


def samples(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """A /metrics sample by its labels."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(url: str, name: str, **labels: str) -> float:
    return sum(
        v
        for key, v in samples(url, name).items()
        if all(dict(key).get(k) == want for k, want in labels.items())
    )


def server_up(topology: Topology, server: str) -> bool:
    status = samples(topology.stats_url, "haproxy_server_status")
    return status.get((("proxy", "jobfair"), ("server", server), ("state", "UP"))) == 1


@pytest.fixture(scope="module")
def topology(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    haproxy = _haproxy()
    root = tmp_path_factory.mktemp("topology")
    database = f"topology_{os.getpid()}"
    postgres.psql(f'CREATE DATABASE "{database}" TEMPLATE "{TEMPLATE}";')
    env = {
        **os.environ,
        "JOBFAIR_DATABASE_URL": postgres.url(database),
        "JOBFAIR_MAX_WAITERS": str(MAX_WAITERS),
        "JOBFAIR_KEEP_ALIVE_S": "0.5",
        "JOBFAIR_DB_POOL_SIZE": "10",
        "JOBFAIR_DB_POOL_MIN_SIZE": "2",
    }
    replicas: list[Replica] = []
    files = []
    balancer = None
    shared = Path(tempfile.mkdtemp(prefix="jobfair-haproxy-"))
    try:
        for name in ("jobfair-1", "jobfair-2"):
            port = free_port()
            log = root / f"{name}.log"
            files.append(out := open(log, "wb"))  # noqa: SIM115 - closed at teardown
            cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
            replicas.append(Replica(name, proc, f"http://127.0.0.1:{port}", log))
        for r in replicas:
            _started(lambda r=r: _ready(r), f"{r.name} ready", r.log)
        lb_port, stats_port = free_port(), free_port()
        haproxy_log = root / "haproxy.log"
        files.append(out := open(haproxy_log, "wb"))  # noqa: SIM115
        config = _readable_copy(shared)
        balancer = subprocess.Popen(
            [haproxy, "-db", "-f", str(config)],
            env={
                "PATH": os.environ.get("PATH", ""),
                "LB_BIND": f"127.0.0.1:{lb_port}",
                "LB_STATS_BIND": f"127.0.0.1:{stats_port}",
                "LB_SERVER_1": replicas[0].url.removeprefix("http://"),
                "LB_SERVER_2": replicas[1].url.removeprefix("http://"),
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            **_unprivileged(),  # type: ignore[arg-type]
        )
        topology = Topology(
            f"http://127.0.0.1:{lb_port}",
            f"http://127.0.0.1:{stats_port}",
            replicas,
            balancer,
            haproxy_log,
        )

        def both_up() -> bool:
            assert balancer.poll() is None, haproxy_log.read_text()
            try:
                return all(server_up(topology, r.name) for r in replicas)
            except httpx.TransportError:
                return False

        _started(both_up, "both replicas UP in HAProxy", haproxy_log)
        yield topology
    finally:
        if balancer is not None:
            _stop(balancer)
        for r in replicas:
            _stop(r.proc)
        for f in files:
            f.close()
        shutil.rmtree(shared)
        postgres.psql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE);')


def _ready(replica: Replica) -> bool:
    assert replica.proc.poll() is None, replica.log.read_text()
    try:
        return httpx.get(f"{replica.url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
async def lb(topology: Topology) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=topology.url, timeout=30) as client:
        yield client


# -- the configuration ---------------------------------------------------------------------


def directives(name: str) -> list[str]:
    """The arguments of every ``name`` line of haproxy.cfg (comments left out)."""
    out = []
    for line in CONFIG.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words[: len(name.split())] == name.split():
            out.append(" ".join(words[len(name.split()) :]))
    return out


def seconds(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)?", value).groups()  # type: ignore[union-attr]
    return int(number) * {"ms": 0.001, None: 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def test_haproxy_finds_the_config_valid_without_a_warning():
    env = {"LB_SERVER_1": "127.0.0.1:1", "LB_SERVER_2": "127.0.0.1:2", "PATH": ""}
    r = subprocess.run(
        [_haproxy(), "-c", "-f", str(CONFIG)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_balancer_waits_longer_than_the_longest_long_poll_and_streams_unbuffered():
    longest_s = MAX_REQUEST_TIMEOUT_MS / 1000
    [client], [server] = directives("timeout client"), directives("timeout server")
    assert seconds(client) > longest_s and seconds(server) > longest_s
    # A stream is never quieter than its keep-alive period, far below either.
    assert Settings().keep_alive_s < seconds(server)
    defaults = Settings()
    [headers] = directives("timeout http-request")
    assert seconds(headers) == defaults.request_header_timeout_ms / 1000
    [idle] = directives("timeout http-keep-alive")
    assert seconds(idle) == IDLE_CONNECTION_TIMEOUT_S
    # A reload waits for what the old process holds, at least as long as a long poll.
    [hard_stop] = directives("hard-stop-after")
    assert seconds(hard_stop) > longest_s
    # Small SSE events go out at once (without this, ~200 ms later than direct, measured),
    # and a client that leaves closes the replica's side (its waiter is freed: the 503
    # test below depends on it).
    options = directives("option")
    assert "http-no-delay" in options and "abortonclose" in options, options
    # Nothing buffers or compresses a response, nor caps or buffers a request body.
    text = CONFIG.read_text()
    for buffering in ("compression", "http-buffer-request", "req.body_size", "filter"):
        assert not any(buffering in line.split("#", 1)[0] for line in text.splitlines()), buffering


def test_the_health_check_asks_a_readiness_route_of_the_app():
    [send] = directives("http-check send")
    path = send.split("uri", 1)[1].split()[0]
    routes = {(op.method, op.path) for op in OPERATIONS}
    assert ("GET", path) in routes and path == "/readyz"
    assert directives("http-check expect") == ["status 200"]
    assert all("check" in d.split() for d in directives("default-server"))


# -- through the balancer ------------------------------------------------------------------


async def test_jobs_drain_through_the_balancer_and_both_replicas_activate_them(topology, lb):
    n = 200
    keys = set(await enqueue(lb, "drain", "acme", n))
    done: list[str] = []

    async def worker(i: int) -> None:
        # One connection per worker, as a real worker process has.
        async with httpx.AsyncClient(base_url=topology.url, timeout=30) as c:
            while len(done) < n:
                body = {"type": "drain", "maxJobs": 8, "timeout": 60_000, "requestTimeout": 500}
                r = await c.post("/v2/jobs/activate", json=body)
                assert r.status_code == 200, r.text
                for job in r.json()["jobs"]:
                    assert (await complete(c, job)).status_code == 204
                    done.append(job["jobKey"])

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(4))), 30)
    assert sorted(done) == sorted(keys)  # each exactly once
    activated = [
        total(r.url, "jobfair_jobs_activated_total", type="drain") for r in topology.replicas
    ]
    assert sum(activated) == n and all(a > 0 for a in activated), activated
    # HAProxy kept its connections to the replicas alive: far fewer than the requests.
    made = total(topology.stats_url, "haproxy_server_connection_attempts_total")
    reused = total(topology.stats_url, "haproxy_server_connection_reuses_total")
    assert reused > 0 and made < n / 10, (made, reused)


async def test_a_stream_through_the_balancer_delivers_a_job_created_after_it_opened(topology, lb):
    async with lb.stream("GET", "/v2/jobs/stream?type=later&maxJobs=1&timeout=60000") as r:
        assert r.status_code == 200
        events = Events(r)
        # Bytes pass while the response goes on: a keep-alive comment (every 0.5 s here).
        await _until(lambda: events.comments, "a keep-alive comment through the balancer")
        # The job is created on the replica that does not hold the stream: its NOTIFY
        # crosses PostgreSQL, its event the balancer.
        holding = [total(x.url, "jobfair_streams") for x in topology.replicas]
        assert sorted(holding) == [0, 1], holding
        other = topology.replicas[holding.index(0)]
        async with httpx.AsyncClient(base_url=other.url) as direct:
            [key] = await enqueue(direct, "later", "acme", 1)
        job = await events.next_job(wait_s=5)
        assert job["jobKey"] == key
        assert not r.is_closed


async def test_a_long_poll_through_the_balancer_waits_quietly_then_gets_a_job(topology, lb):
    body = {"type": "quiet", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 30_000}
    started = time.monotonic()
    poll = asyncio.create_task(lb.post("/v2/jobs/activate", json=body))
    await _until(
        lambda: sum(total(x.url, "jobfair_waiters") for x in topology.replicas) == 1, "a waiter"
    )
    # Nothing crosses the connection meanwhile: a balancer that cut quiet requests early
    # would answer 504 here.
    await asyncio.sleep(3)
    [key] = await enqueue(lb, "quiet", "acme", 1)
    r = await asyncio.wait_for(poll, 10)
    assert r.status_code == 200, r.text
    assert [j["jobKey"] for j in r.json()["jobs"]] == [key]
    assert time.monotonic() - started >= 3


async def test_a_long_poll_through_the_balancer_ends_empty_at_its_request_timeout(lb):
    body = {"type": "never", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 2_000}
    started = time.monotonic()
    r = await lb.post("/v2/jobs/activate", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"jobs": []}
    assert time.monotonic() - started >= 2


async def test_a_replicas_503_reaches_the_client_with_its_retry_after(topology, lb):
    # MAX_WAITERS per replica: one more long poll than both hold cannot wait anywhere.
    body = {"type": "full", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 20_000}
    polls = [
        asyncio.create_task(lb.post("/v2/jobs/activate", json=body))
        for _ in range(2 * MAX_WAITERS + 1)
    ]
    try:
        done, _ = await asyncio.wait(polls, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert done, "every long poll waited: no replica refused one"
        r = done.pop().result()
        assert_problem(r, 503)
        assert r.headers["retry-after"] == "1"
        assert "waiting" in r.json()["detail"]
    finally:
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
    refused = [
        total(x.url, "jobfair_http_503_answers_total", reason="resource_exhausted")
        for x in topology.replicas
    ]
    assert sum(refused) >= 1, refused
    # The clients that left freed their places on the replicas (the balancer closed its
    # side too), so the next test's long polls find room.
    await _until(
        lambda: sum(total(x.url, "jobfair_waiters") for x in topology.replicas) == 0,
        "the abandoned long polls gone from the replicas",
    )


async def test_a_body_above_the_proxys_usual_default_passes_to_the_app(lb):
    # nginx's default cap is 1 MiB; here only the app's own (16 MiB) applies.
    jobs = [{"type": "big", "variables": {"blob": "x" * 1000}} for _ in range(2_000)]
    r = await lb.post("/v2/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    assert len(r.json()["jobKeys"]) == 2_000


async def test_a_body_above_the_apps_limit_gets_the_apps_413_through_the_balancer(lb):
    body = b'{"jobs": [' + b" " * (Settings().max_body_bytes + 1) + b"]}"
    r = await lb.post("/v2/jobs/batch", content=body, headers={"content-type": "application/json"})
    assert_problem(r, 413)


async def test_a_replica_that_dies_is_taken_out_and_the_other_answers_for_it(topology, lb):
    # Last in the module: it stops jobfair-2 for good.
    victim = topology.replicas[1]
    _stop(victim.proc)
    for _ in range(20):  # refused connections are tried again on jobfair-1
        r = await lb.get("/v2/stats")
        assert r.status_code == 200, r.text
    await _until(lambda: not server_up(topology, victim.name), "jobfair-2 marked DOWN")
    assert server_up(topology, topology.replicas[0].name)


async def _until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE_S
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"{what} within {DEADLINE_S} s"
        await asyncio.sleep(0.05)
