"""Fixtures: one embedded PostgreSQL per test session, a migrated template database,
and a fresh clone of it (CREATE DATABASE ... TEMPLATE) for every test."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from app import embedded, migrations
from app.config import Settings
from app.main import Services, create_app
from app.store import Store

TEMPLATE = "jobfair_template"
_counter = itertools.count()


@dataclass
class Postgres:
    server: object
    root: Path

    def psql(self, sql: str) -> str:
        return self.server.psql(sql)  # type: ignore[attr-defined]

    def url(self, database: str) -> str:
        return embedded.asyncpg_url(self.server.get_uri(database))  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    root = Path(os.environ.get("JOBFAIR_TEST_DATA_DIR") or tmp_path_factory.mktemp("pg"))
    server, _ = embedded.start(root)
    pg = Postgres(server, root)
    pg.psql(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE);')
    pg.psql(f'CREATE DATABASE "{TEMPLATE}";')
    migrations.upgrade(pg.url(TEMPLATE))
    yield pg
    server.cleanup()


@pytest.fixture
def db_url(postgres: Postgres) -> Iterator[str]:
    name = f"test_{os.getpid()}_{next(_counter)}"
    postgres.psql(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}";')
    yield postgres.url(name)
    postgres.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);')


@pytest.fixture
def settings() -> Settings:
    # Long intervals: tests drive background work through run_once, not timers.
    return Settings(
        lease_sweep_interval_ms=3_600_000,
        promote_interval_ms=3_600_000,
        retention_sweep_interval_ms=3_600_000,
        db_pool_size=30,
    )


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    s = await Store.connect(db_url, size=30)
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
async def live(db_url: str, settings: Settings) -> AsyncIterator[Live]:
    app = create_app(settings, db_url, background=False)
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", loop="asyncio"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        yield Live(url, app, client)
    server.should_exit = True
    await task
