"""DESIGN §4: a background task that dies stops the process; connection trouble does not."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.config import Settings
from app.errors import ResourceExhausted
from app.operators import StatsService
from app.sweepers import Background


class _Store:
    """Stands in for the store: only the failure it raises matters here."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    async def lane_totals(self):  # the stats sampler's only call
        self.calls += 1
        raise self.exc


async def _run(exc: BaseException) -> tuple[list[BaseException], int]:
    store = _Store(exc)
    died: list[BaseException] = []
    fatal = asyncio.Event()

    def on_fatal(e: BaseException) -> None:
        died.append(e)
        fatal.set()

    stats = StatsService(store, sample_interval_s=0.01)  # type: ignore[arg-type]
    bg = Background(store, Settings(), "postgresql://unused", stats, on_fatal)  # type: ignore[arg-type]
    bg._spawn(bg._loop(bg.sampler, leader_only=False))
    try:
        await asyncio.wait_for(fatal.wait(), timeout=0.5)
    except TimeoutError:
        pass
    await bg.stop()
    return died, store.calls


async def test_an_unexpected_error_stops_the_process():
    died, _ = await _run(ZeroDivisionError("bug"))
    assert len(died) == 1 and isinstance(died[0], ZeroDivisionError)


async def test_a_lost_connection_is_retried_not_fatal():
    died, calls = await _run(asyncpg.PostgresConnectionError("gone"))
    assert died == [] and calls >= 2


@pytest.mark.parametrize(
    "exc",
    [
        ResourceExhausted("the database is unavailable; retry later", retry_after_s=1),
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        asyncpg.InternalClientError("cannot perform operation: another operation is in progress"),
        asyncpg.InterfaceError("cannot perform operation: connection is closed"),
        ConnectionRefusedError(111, "Connection refused"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_an_unavailable_database_is_waited_out_in_every_guise(exc):
    """What the sampler met when the postmaster was killed (the pool's 503), and what a
    restarting PostgreSQL or a connection torn down under a call raise."""
    died, calls = await _run(exc)
    assert died == [] and calls >= 2
