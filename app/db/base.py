"""What every storage module is written against: where statements run, and the rules
for running them again.

A statement runs on ``Queries``: the ``Database`` itself (each statement on a pooled
connection of its own, in autocommit) or a connection a caller holds, inside a
transaction it opened with ``Database.transaction()``.  So a service that must count,
decide and claim under one set of locks opens the transaction and passes it along; a
single statement needs no ceremony.  The few operations that shape their own
transactions (a park's two tries, an insert followed by its idempotency lookup) take a
``Sessions``: something that hands out connections and transactions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, ParamSpec, Protocol, TypeVar

import asyncpg

log = logging.getLogger(__name__)


class Queries(Protocol):
    """Where a statement runs: asyncpg's four calls."""

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...

    async def fetchrow(self, query: str, *args: Any) -> Any: ...

    async def fetchval(self, query: str, *args: Any) -> Any: ...

    async def execute(self, query: str, *args: Any) -> str: ...


class Sessions(Queries, Protocol):
    """A database that also lends a connection, bare or inside a transaction."""

    def connection(self) -> AbstractAsyncContextManager[Any]: ...

    def transaction(self, first: str | None = None) -> AbstractAsyncContextManager[Any]: ...


@contextlib.asynccontextmanager
async def transaction_on(conn: asyncpg.Connection, first: str | None = None) -> AsyncIterator[None]:
    """A transaction on ``conn``, committed when the block ends and rolled back if it
    raises.  ``first``: a statement without parameters (locks) run first, sent with the
    BEGIN in one round trip (the simple protocol takes both; asyncpg's own transaction
    sends its BEGIN alone, a round trip of a single create's five)."""
    if first is None:
        async with conn.transaction():
            yield
        return
    await conn.execute("BEGIN; " + first)
    try:
        yield
    except BaseException:
        # Left in a transaction by a failed statement, or cancelled: undo it now (the
        # pool's reset would, on release, if this cannot).
        if not conn.is_closed() and conn.is_in_transaction():
            with contextlib.suppress(Exception):
                await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


P = ParamSpec("P")
R = TypeVar("R")
DEADLOCK_RETRIES = 3


def retry_deadlock(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Re-run a whole transaction that PostgreSQL aborted as a deadlock victim.

    Lanes are locked in key order on every path, so a deadlock needs a rare three-way
    race (a lane parked and woken while an activator holds its neighbour); the victim's
    transaction rolled back completely, so running it again is safe.  Put it on the
    function that opens the transaction, whichever layer that is.
    """

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(DEADLOCK_RETRIES):
            try:
                return await fn(*args, **kwargs)
            except asyncpg.DeadlockDetectedError:
                if attempt == DEADLOCK_RETRIES - 1:
                    raise
                log.warning("deadlock in %s; retrying", fn.__name__)
        raise AssertionError("unreachable")

    return wrapper


def refused_input(exc: Exception) -> bool:
    """Whether a statement failed on a value it was given rather than on the database or
    the statement itself: a data exception (SQLSTATE class 22: a NUL in text or JSON, an
    integer beyond its column, a date out of range; asyncpg raises the same class for an
    argument it cannot encode), or a deadline beyond the dates Python can represent.
    Where callers share a statement, such a failure is one caller's (see Coalescer's
    ``split``), and rerunning the others without it is safe: the statement was undone."""
    return isinstance(exc, asyncpg.DataError | OverflowError)
