"""LISTEN/NOTIFY: one listening connection per process, reconnecting by itself.

Channels (payloads are sent by the storage modules' statements, once per statement):

* ``jobfair``       — a job type whose jobs became activatable (created, released,
                      promoted, retried: "type n", n of them) or whose capacity was
                      freed ("type").  At most 149 bytes: a job type is at most 128
                      ASCII characters (JOB_TYPE_RE, checked wherever a job is made).
* ``jobfair_done``  — comma-separated keys of stream-activated jobs that finished or
                      whose lease expired: each returns one credit to its stream.  A
                      statement ending more of them sends several, of at most
                      ``CREDIT_KEYS_PER_NOTIFY`` keys each (PostgreSQL refuses a payload
                      of 8,000 bytes).

NOTIFY alone is never trusted (a notification is lost while the connection is down):
waiters and streams also poll on a jittered timer, and after a reconnect every type is
woken once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

import asyncpg

# The channels and the payload bounds are shared with the statements that notify
# (app/db/sql, as {{NOTIFY_CHANNEL}} ...), so they are written in app.db.bounds.
from app.db.bounds import CREDIT_KEYS_PER_NOTIFY as CREDIT_KEYS_PER_NOTIFY
from app.db.bounds import DONE_CHANNEL, NOTIFY_CHANNEL
from app.db.bounds import NOTIFY_PAYLOAD_MAX_BYTES as NOTIFY_PAYLOAD_MAX_BYTES
from app.db.connect import connect

log = logging.getLogger(__name__)

HEALTH_CHECK_S = 2.0
# A check unanswered this long is a connection lost (its host gone without a word).
HEALTH_CHECK_TIMEOUT_S = 5.0


class Notifier:
    def __init__(
        self,
        database_url: str,
        on_ready: Callable[[str, int | None], None],
        on_done: Callable[[list[int]], None],
        on_reconnect: Callable[[], None],
    ) -> None:
        self.database_url = database_url
        self.on_ready = on_ready
        self.on_done = on_done
        self.on_reconnect = on_reconnect
        self.connected = asyncio.Event()
        self.connections = 0  # how many times a LISTEN connection was established
        self.conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="notifier")
        # Serve without waiting forever for LISTEN: the backup poll covers the gap.
        try:
            await asyncio.wait_for(self.connected.wait(), timeout=5)
        except TimeoutError:
            log.warning("LISTEN connection not up yet; relying on the backup poll")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.conn is not None and not self.conn.is_closed():
            await self.conn.close()

    def _ready(self, conn: object, pid: int, channel: str, payload: str) -> None:
        job_type, _, count = payload.partition(" ")  # a job type has no space
        self.on_ready(job_type, int(count) if count else None)

    def _done(self, conn: object, pid: int, channel: str, payload: str) -> None:
        self.on_done([int(k) for k in payload.split(",") if k])

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                self.conn = await connect(self.database_url)
                await self.conn.add_listener(NOTIFY_CHANNEL, self._ready)
                await self.conn.add_listener(DONE_CHANNEL, self._done)
                self.connections += 1
                self.connected.set()
                if self.connections > 1:
                    log.info("LISTEN connection re-established")
                    self.on_reconnect()  # anything may have happened while we were away
                delay = 0.1
                while True:
                    await asyncio.sleep(HEALTH_CHECK_S)
                    # Bounded: a host lost without a word never answers, and the
                    # connection would wait on it, deaf, for as long as TCP does.
                    await self.conn.fetchval("SELECT 1", timeout=HEALTH_CHECK_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: drop the connection and reconnect
                self.connected.clear()
                log.warning("LISTEN connection lost (%r); reconnecting", exc)
                if self.conn is not None:
                    self.conn.terminate()
                    self.conn = None
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)
