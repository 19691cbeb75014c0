"""The embedded PostgreSQL of a server killed outright is adopted (then stopped at exit)
by the next server.  (Its restart when it dies: test_database_outage_load.)"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from tests.fixtures import ServerProcess, wait_ready


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def embedded_server(spawn_server: Callable[..., ServerProcess], data_dir: Path) -> ServerProcess:
    # An empty URL: the server starts (or joins) the embedded PostgreSQL in data_dir.
    return spawn_server(JOBFAIR_DATABASE_URL="", JOBFAIR_DATA_DIR=str(data_dir))


async def until_ready(server: ServerProcess, timeout_s: float = 60) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await asyncio.wait_for(wait_ready(client, server), timeout_s)


async def test_the_postgres_of_a_killed_server_is_adopted_and_stopped_by_the_next(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    pgdata = tmp_path / "data" / "pgdata"
    first = embedded_server(spawn_server, tmp_path / "data")
    await until_ready(first)
    postgres = postmaster_pid(pgdata)
    first.proc.kill()
    first.proc.wait()
    assert psutil.pid_exists(postgres)  # orphaned, still serving

    second = embedded_server(spawn_server, tmp_path / "data")
    await until_ready(second)
    assert postmaster_pid(pgdata) == postgres  # joined, not started anew
    assert json.loads((pgdata / ".handle_pids.json").read_text()) == [second.proc.pid]
    second.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(second.proc.wait, 30) == 0, second.log.read_text()
    await asyncio.to_thread(psutil.Process(postgres).wait, 30)  # stopped by the adopter
