"""A rolling upgrade under load (issue 45 §1), as docs/upgrading.md tells an operator to
do it: servers of the previous release -- built from its commit, in a virtualenv of their
own -- serve the chaos load (tests/chaos/ledger_load.py) on a database they migrated;
the new release's ``jobfair migrate`` expands the schema while they serve; servers of
the new release join them; the old ones are stopped (SIGTERM) one by one; the new
``jobfair migrate`` runs again (the contract step: nothing of the old is left).  The
ledger shows every job completed exactly once, caps held, and no 500: a client meets at
most a 503 or a refused connection, and goes on to the next server.

The previous release is ``PREVIOUS`` (alembic 0016, before FIFO keys, minimums and
job keys drawn one at a time: 0017-0019 expand).  A checkout without that commit (a
shallow clone) skips, saying so."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import asyncpg
import httpx
import pytest

from app import migrations
from tests.chaos.ledger_load import SERVER_ENV, LedgerLoad, Servers, start_servers, until_ready
from tests.fixtures import Postgres, ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS = "d284b9a"  # alembic 0016
PREVIOUS_HEAD = "0016"

pytestmark = pytest.mark.chaos


def _run(*command: str, cwd: Path | None = None, timeout: float = 600) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release installed as an operator installs it: its source from git, in
    a virtualenv of its own, on the dependencies the lock pins; its ``jobfair`` command."""
    exists = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], capture_output=True
    )
    if exists.returncode != 0:
        pytest.skip(f"the previous release's commit {PREVIOUS} is not in this checkout")
    where = tmp_path_factory.mktemp("previous")
    source = where / "src"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    venv = where / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    pip = str(venv / "bin" / "pip")
    _run(pip, "install", "--quiet", "--require-hashes", "-r", str(ROOT / "requirements/serve.txt"))
    _run(pip, "install", "--quiet", "--no-deps", str(source))
    jobfair = venv / "bin" / "jobfair"
    assert "0.1.0" in _run(str(jobfair), "--version")
    return jobfair


def _serve_previous(jobfair: Path, url: str, log_dir: Path) -> ServerProcess:
    port = free_port()
    log_path = log_dir / f"previous-{port}.log"
    env = {
        **os.environ,
        **SERVER_ENV,
        "JOBFAIR_DATABASE_URL": url,
        "JOBFAIR_MIGRATE_ON_START": "false",
    }
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(jobfair), "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=log_dir,  # not this checkout: its own code only
        )
    return ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)


async def _revisions(url: str) -> tuple[str, str]:
    conn = await asyncpg.connect(url)
    try:
        return (
            await conn.fetchval("SELECT version_num FROM alembic_version"),
            await conn.fetchval("SELECT oldest_server FROM schema_compat"),
        )
    finally:
        await conn.close()


async def test_a_rolling_upgrade_under_load_loses_nothing_and_finishes_nothing_twice(
    previous_release: Path,
    postgres: Postgres,
    spawn_server: Callable[..., ServerProcess],
    tmp_path: Path,
) -> None:
    postgres.psql('DROP DATABASE IF EXISTS "upgrade" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "upgrade";')
    url = postgres.url("upgrade")
    _run(str(previous_release), "migrate", "--database-url", url, cwd=tmp_path)
    assert (await _revisions(url))[0] == PREVIOUS_HEAD
    old = [_serve_previous(previous_release, url, tmp_path) for _ in range(2)]
    try:
        await asyncio.gather(*(until_ready(s) for s in old))
        servers = Servers([s.url for s in old])
        load = LedgerLoad(servers, lambda: url, jobs=3_000, rate_per_s=300)
        steps: list[str] = []

        async def upgrade(load: LedgerLoad) -> None:
            await load.until_created(300)
            # 1. Expand, while the previous release serves.
            await asyncio.to_thread(
                _run, sys.executable, "-m", "app.cli", "migrate", "--database-url", url
            )
            head, oldest = await _revisions(url)
            assert head == migrations.head_revision() and oldest <= PREVIOUS_HEAD, (head, oldest)
            async with httpx.AsyncClient(timeout=5) as http:
                for s in old:  # still ready, on a schema that still serves them
                    ready = (await http.get(s.url + "/readyz")).json()
                    assert ready["status"] == "ready", ready
            steps.append(f"expanded to {head} under {len(load.created)} jobs")
            # 2. The new release joins.
            new = await start_servers(spawn_server, 2, JOBFAIR_DATABASE_URL=url)
            servers.urls = [old[0].url, new[0].url, old[1].url, new[1].url]
            await load.until_created(len(load.created) + 300)
            # 3. The old ones leave, one by one, as a rollout replaces them.
            for s in old:
                s.proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(s.proc.wait, 60) == 0, s.log.read_text()
                servers.urls = [u for u in servers.urls if u != s.url]
                await load.until_created(len(load.created) + 200)
            # 4. Contract: no server of the previous release is left.
            await asyncio.to_thread(
                _run, sys.executable, "-m", "app.cli", "migrate", "--database-url", url
            )
            steps.append(f"old servers stopped; contract run under {len(load.created)} jobs")

        await load.run(upgrade)
        figures = await load.verify("rolling upgrade from " + PREVIOUS)
        print(steps)
        # Both releases accepted finishes: the jobs flowed through the old and the new.
        assert {old[0].url, old[1].url} & set(figures.answered_by), figures.answered_by
        assert set(figures.answered_by) - {old[0].url, old[1].url}, figures.answered_by
    finally:
        for s in old:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
