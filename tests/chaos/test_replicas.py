"""Three ``jobfair serve`` processes on one database, the chaos load spread over them
(tests/chaos/ledger_load.py): every job is completed exactly once, by an accepted finish,
and the tenants' and types' caps hold across the processes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.chaos.ledger_load import LedgerLoad, Servers, start_servers
from tests.fixtures import ServerProcess


async def replicas_under_load(
    spawn_server: Callable[..., ServerProcess], db_url: str, jobs: int, scenario: str
) -> None:
    servers = await start_servers(spawn_server, 3)
    load = LedgerLoad(Servers([s.url for s in servers]), lambda: db_url, jobs=jobs)
    await load.run()
    figures = await load.verify(scenario)
    # The clients were spread: every server accepted finishes.
    assert set(figures.answered_by) == {s.url for s in servers}, figures.answered_by


async def test_three_replicas_on_one_database_finish_every_job_exactly_once(
    spawn_server: Callable[..., ServerProcess], db_url: str
) -> None:
    await replicas_under_load(spawn_server, db_url, 500, "three replicas")


@pytest.mark.chaos
async def test_three_replicas_finish_fifty_thousand_jobs_exactly_once(
    spawn_server: Callable[..., ServerProcess], db_url: str
) -> None:
    await replicas_under_load(spawn_server, db_url, 50_000, "three replicas, 50,000 jobs")
