"""A background task that dies stops the process; connection trouble does not.

The loop runs over the real ``Database`` (its error boundary is what is under test),
on a stand-in for asyncpg's pool whose connections fail every statement as told."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.config import Settings
from app.db import Database
from app.db.pool import unavailable
from app.errors import StoreUnavailable
from app.stats import StatsService
from app.sweepers import Background


class _Connection:
    def __init__(self, pool: _Pool) -> None:
        self.pool = pool

    async def fetch(self, query, *args):  # the stats sampler's only call
        self.pool.calls += 1
        raise self.pool.exc

    def is_closed(self) -> bool:
        return True  # as a connection the server died under

    def terminate(self) -> None:
        pass


class _Pool:
    """Stands in for asyncpg's pool: only the failure its connections raise matters."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    def get_idle_size(self) -> int:
        return 1

    async def acquire(self, **_):
        return _Connection(self)

    async def release(self, conn) -> None:
        pass


async def _run(exc: BaseException) -> tuple[list[BaseException], int]:
    store = _Pool(exc)
    db = Database(store, timeout_s=1.0)  # type: ignore[arg-type]
    died: list[BaseException] = []
    fatal = asyncio.Event()

    def on_fatal(e: BaseException) -> None:
        died.append(e)
        fatal.set()

    stats = StatsService(db, sample_interval_s=0.01)
    bg = Background(db, Settings(), "postgresql://unused", stats, on_fatal)
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
        StoreUnavailable("the database is unavailable; retry later", retry_after_s=1),
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


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.PostgresConnectionError("gone"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.InternalClientError("cannot perform operation: another operation is in progress"),
        asyncpg.InterfaceError("cannot perform operation: connection is closed"),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
        # Citus, a worker node gone mid-statement (make citus's node-restart drain).
        asyncpg.InternalServerError("failure on connection marked as essential: w1:5432"),
        asyncpg.InternalServerError("connection to the remote node postgres@w1:5432 failed"),
        asyncpg.PostgresIOError("failed to COPY to shard 0 on 127.0.0.1:37145"),
        asyncpg.InternalServerError("server closed the connection unexpectedly"),
        asyncpg.InternalServerError("SSL SYSCALL error: EOF detected"),  # at a COMMIT
    ],
    ids=lambda e: f"{type(e).__name__}: {e}"[:60],
)
def test_every_guise_of_an_unavailable_database_is_one_storage_error(exc):
    """What start-up, the leader lock and the pool classify with ``unavailable``: the one
    list of the driver's transient errors."""
    assert isinstance(unavailable(exc), StoreUnavailable)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.DataError("invalid input"),
        asyncpg.UniqueViolationError("dup"),
        KeyError("bug"),
        asyncpg.InternalServerError("could not create distributed plan"),  # a bug of ours
        asyncpg.PostgresIOError("could not read file"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_refused_value_or_a_bug_is_not_a_storage_error(exc):
    assert unavailable(exc) is None
