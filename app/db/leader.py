"""The leader lock: one process of all those on a database runs the sweepers.

A session-level advisory lock held on a connection of its own: it is held exactly as
long as that connection lives, so a process that dies or loses its connection hands
leadership on without anyone having to notice.
"""

from __future__ import annotations

import logging

import asyncpg

from app.db import sql
from app.db.connect import connect
from app.db.locks import LEADER_LOCK_KEY
from app.db.pool import unavailable

log = logging.getLogger(__name__)

# A check unanswered this long is a connection lost (its host gone without a word): the
# lock is dropped with it, rather than held on to by a process that cannot know.
CHECK_TIMEOUT_S = 5.0

SQL = sql.load("leader")  # app/db/sql/leader.sql


class LeaderLock:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._conn: asyncpg.Connection | None = None
        self._held = False

    async def hold(self) -> bool:
        """Whether this process holds the lock now: connects if it has no connection,
        tries the lock if it does not hold it, else checks the connection that holds
        it.  A failure drops the connection (and with it the lock) and raises
        ``StoreUnavailable``; the next call starts afresh."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._held = False
                self._conn = await connect(self.database_url)
            if not self._held:
                self._held = bool(
                    await self._conn.fetchval(
                        *SQL["try_leader_lock"].bind(key=LEADER_LOCK_KEY), timeout=CHECK_TIMEOUT_S
                    )
                )
            else:
                await self._conn.fetchval(*SQL["check"].bind(), timeout=CHECK_TIMEOUT_S)
        except Exception as exc:
            error = unavailable(exc)
            if error is None:
                raise
            self._drop()
            raise error from exc
        return self._held

    def _drop(self) -> None:
        self._held = False
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self._held = False
