"""Fixtures for every test in the repository, loaded with ``-p tests.fixtures`` (pyproject):
one embedded PostgreSQL per test session, a migrated template database, and a fresh clone
of it (CREATE DATABASE ... TEMPLATE) for every test."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import certifi
import httpx
import pytest
import trustme
import uvicorn
from fastapi import FastAPI

from app import embedded, migrations
from app.api.context import Services
from app.cli.main import IDLE_CONNECTION_TIMEOUT_S
from app.config import Settings
from app.db import Database
from app.infra.http import RequestLimits, bounded_protocol
from app.main import create_app

TEMPLATE = "jobfair_template"
_counter = itertools.count()
# JOBFAIR_TEST_CITUS=1 (make citus): every test's database is one Citus cluster's (a
# coordinator and two workers, tests/citus/cluster.py), migrated and distributed once and
# emptied before each test, instead of a clone of the embedded PostgreSQL's template.
CITUS = os.environ.get("JOBFAIR_TEST_CITUS") == "1"
# On Citus a pool connection's first statement on each worker node opens a connection
# there (200 to 300 ms each, measured: docs/scaling.md), and the tests' pools open their
# connections as calls need them: a burst waits seconds for them.  A test asserts what
# is done, not how fast; `jobfair serve` opens its pool whole at start.
ACQUIRE_TIMEOUT_MS = 30_000 if CITUS else 5_000
# And on Citus a burst of new connections crawls: each one's first statements (asyncpg's
# type introspection among them) queued on the coordinator's lock manager, seconds each
# with sixteen at once.  So a test's pool there is opened whole at start, and small.
CITUS_POOL = 10 if CITUS else 0


@dataclass
class Postgres:
    server: object
    root: Path

    def psql(self, sql: str) -> str:
        """``sql`` through the server's psql.  A spawn the kernel refuses for a moment is
        tried again: a fresh clone's CI failed once at the session's end when spawning
        /bin/sh for the last drop returned EFAULT, with every test passed.  (Holding one
        connection for the clones instead made a chaos scenario under a slow database
        strand jobs: tests/chaos/test_network.py's many-spikes run failed on it and
        passes without it, for a reason not found.)"""
        for attempt in range(3):
            try:
                return self.server.psql(sql)  # type: ignore[attr-defined]
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    def url(self, database: str) -> str:
        return embedded.asyncpg_url(self.server.get_uri(database))  # type: ignore[attr-defined]


class Clones:
    """Fresh clones of the template: the next one made while a test runs, and each used
    one dropped after it, on a thread of their own, so that no test waits for either
    (a clone and its drop took 0.3 s together here, for each of some 600 tests)."""

    def __init__(self, postgres: Postgres) -> None:
        self.postgres = postgres
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clones")
        self._dropped: list[concurrent.futures.Future[str]] = []
        self._next = self._thread.submit(self._clone)

    def _clone(self) -> str:
        name = f"test_{os.getpid()}_{next(_counter)}"
        self.postgres.psql(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}";')
        return name

    def take(self) -> str:
        """A database no test has used (its name)."""
        name = self._next.result()
        self._next = self._thread.submit(self._clone)
        return name

    def drop(self, name: str) -> None:
        sql = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);'
        self._dropped = [f for f in self._dropped if not f.done() or f.exception() is not None]
        self._dropped.append(self._thread.submit(self.postgres.psql, sql))

    def close(self) -> None:
        """Drop the clone made ahead, and fail on any drop that failed."""
        self.drop(self._next.result())
        self._thread.shutdown(wait=True)
        for dropped in self._dropped:
            dropped.result()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    given = os.environ.get("JOBFAIR_TEST_DATA_DIR")
    # With pytest-xdist, each worker process runs a session, and a PostgreSQL of its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    root = Path(given) / worker if given else tmp_path_factory.mktemp("pg")
    server, _ = embedded.start(root)
    pg = Postgres(server, root)
    pg.psql(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE);')
    pg.psql(f'CREATE DATABASE "{TEMPLATE}";')
    migrations.upgrade(pg.url(TEMPLATE))
    yield pg
    server.cleanup()


@pytest.fixture(scope="session")
def clones(postgres: Postgres) -> Iterator[Clones]:
    made = Clones(postgres)
    yield made
    made.close()


@pytest.fixture
def db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if CITUS:
        cluster = request.getfixturevalue("citus")
        cluster.empty()
        yield cluster.url()
        return
    postgres: Postgres = request.getfixturevalue("postgres")
    clones: Clones = request.getfixturevalue("clones")
    name = clones.take()
    yield postgres.url(name)
    clones.drop(name)


@pytest.fixture(scope="session")
def citus() -> Iterator[Any]:
    """The session's Citus cluster (make citus), migrated and distributed."""
    from app.db import citus as on_citus
    from tests.citus.cluster import NOT_INSTALLED, citus_cluster, installed

    if not installed():
        pytest.fail(NOT_INSTALLED)
    with citus_cluster() as cluster:
        migrations.upgrade(cluster.url())
        asyncio.run(on_citus.distribute_at(cluster.url()))
        yield cluster


def quiet_settings(**overrides: object) -> Settings:
    """Long intervals: tests drive background work through run_once, not timers."""
    values: dict[str, object] = {
        "lease_sweep_interval_ms": 3_600_000,
        "promote_interval_ms": 3_600_000,
        "retention_sweep_interval_ms": 3_600_000,
        "db_pool_size": CITUS_POOL or 30,
        # Connections open (and warm up) as a test needs them, not 30 at every start.
        "db_pool_min_size": CITUS_POOL or 2,
        # An in-process client sends its whole burst before the server, on the same event
        # loop, runs any of it: admission is tested where a test sets it (test_back_pressure,
        # tests/chaos/test_load_shed.py, and every `jobfair serve` a test spawns).
        "max_in_flight": 0,
        "db_acquire_timeout_ms": ACQUIRE_TIMEOUT_MS,
    }
    return Settings(**{**values, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def settings() -> Settings:
    return quiet_settings()


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Database]:
    s = await Database.connect(
        db_url,
        size=CITUS_POOL or 30,
        min_size=CITUS_POOL or 2,
        acquire_timeout_s=ACQUIRE_TIMEOUT_MS / 1000,
    )
    yield s
    await s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Live:
    """A real Jobfair server on a loopback port, in this test's event loop."""

    url: str
    app: FastAPI
    client: httpx.AsyncClient

    @property
    def services(self) -> Services:
        return self.app.state.services  # type: ignore[no-any-return]


@pytest.fixture
def background() -> bool:
    """Whether ``live`` runs the sweepers on their timers (a module may override this)."""
    return False


@pytest.fixture
async def live(db_url: str, settings: Settings, background: bool) -> AsyncIterator[Live]:
    async with serving(create_app(settings, db_url, background=background)) as server:
        yield server


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[Live]:
    """``app`` under uvicorn on a free loopback port, in this event loop."""
    async with _uvicorn(app, lifespan="on") as port:
        url = f"http://127.0.0.1:{port}"
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(
            base_url=url, timeout=30, limits=limits, verify=_default_tls()
        ) as client:
            yield Live(url, app, client)


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """httpx's default context, made once: loading the CA bundle took 55 ms a client, for
    a client on plain HTTP."""
    return ssl.create_default_context(cafile=certifi.where())


@contextlib.asynccontextmanager
async def _uvicorn(app: FastAPI, lifespan: str, **options: Any) -> AsyncIterator[int]:
    """``app`` under uvicorn, as `jobfair serve` configures it, on a free loopback port
    (yielded) in this event loop; stopped at exit."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan=lifespan,
        loop="asyncio",
        timeout_keep_alive=IDLE_CONNECTION_TIMEOUT_S,  # as `jobfair serve`
        http=bounded_protocol(RequestLimits.of(app.state.settings)),  # as `jobfair serve`
        **options,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.stop()
        await task


class _Server(uvicorn.Server):
    """uvicorn's server, told to stop by an event rather than seeing a flag at its next
    0.1 s tick: a test's server stops 50 ms sooner on average, some 600 times a run."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self.should_exit = True
        self._stopping.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # also what a tick does: the date header
            counter += 10  # a second, in ticks
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)


@pytest.fixture
async def live_tls(live: Live, tls: Tls) -> AsyncIterator[str]:
    """``live``'s app served over HTTPS as well, on another loopback port (its start-up
    and shut-down are ``live``'s): the https URL, certificate issued by ``tls``'s CA."""
    tls_files = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    async with _uvicorn(live.app, lifespan="off", **tls_files) as port:
        yield f"https://127.0.0.1:{port}"


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


@dataclass(frozen=True)
class Tls:
    """A certificate authority of this test session, and a server certificate it issued
    for 127.0.0.1 and localhost, as PEM files."""

    ca: Path
    cert: Path
    key: Path

    @property
    def args(self) -> tuple[str, ...]:
        """``jobfair serve``'s options to serve HTTPS with the certificate."""
        return ("--ssl-certfile", str(self.cert), "--ssl-keyfile", str(self.key))

    def client_context(self) -> ssl.SSLContext:
        """Trusts the CA alone (not the system's): what a verified client sees."""
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    root = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = Tls(root / "ca.pem", root / "cert.pem", root / "key.pem")
    ca.cert_pem.write_to_path(str(files.ca))
    leaf.private_key_pem.write_to_path(str(files.key))
    with open(files.cert, "wb") as chain:
        for blob in leaf.cert_chain_pems:
            chain.write(blob.bytes())
    return files


@pytest.fixture
def spawn_server(db_url: str, tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start ``jobfair serve`` processes on this test's database (killed at teardown):
    ``spawn(*options, **environment)``; with ``--ssl-certfile`` its url is https."""
    started: list[ServerProcess] = []
    files = []

    def spawn(*args: str, **env_overrides: str) -> ServerProcess:
        port = free_port()
        log_path = tmp_path / f"server-{port}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed at teardown
        files.append(log)
        env = {**os.environ, "JOBFAIR_DATABASE_URL": db_url, **env_overrides}
        if "JOBFAIR_DB_POOL_SIZE" not in env_overrides:
            # Two connections opened and warmed at start, not all 20 (as quiet_settings);
            # a test that sizes the pool gets the pool's own start.
            env.setdefault("JOBFAIR_DB_POOL_MIN_SIZE", "2")
        if CITUS:
            env.setdefault("JOBFAIR_DB_ACQUIRE_TIMEOUT_MS", str(ACQUIRE_TIMEOUT_MS))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--port",
                str(port),
                *args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        scheme = "https" if "--ssl-certfile" in args else "http"
        server = ServerProcess(proc, f"{scheme}://127.0.0.1:{port}", log_path)
        started.append(server)
        return server

    yield spawn
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    for f in files:
        f.close()


async def wait_ready(client: httpx.AsyncClient, server: ServerProcess) -> None:
    while True:
        assert server.proc.poll() is None, server.log.read_text()
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
