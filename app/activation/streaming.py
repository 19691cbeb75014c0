"""SSE job streams with credit-based flow control.

A stream holds ``maxJobs`` credits: at most that many of its jobs are ACTIVATED and
unfinished at once.  It waits for work as a long poll does (a waiter in the job type's
FIFO queue, so streams and long polls take turns through the same scheduler), and gets a
credit back when one of its jobs is completed, failed, errored or times out: from NOTIFY
``jobfair_done`` (any replica), or from its own jittered check of its outstanding jobs.

Delivered means written: the jobs of one claim go out together, in writes of at most
WRITE_BYTES (an ``event: job`` each), and count as the client's once their write was
handed to the connection while the connection was up.  The jobs of a write that failed
or was cut (the stream closed while it was being sent, or the connection already gone,
so the server dropped the write) return to CREATED at once, as do jobs activated but not
yet written.
What the server cannot know is whether the client read what was written: events in the
socket buffers when the connection breaks keep their lease until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

import orjson

from app import logs
from app.activation.ports import ActivateRequest, Caller
from app.activation.rounds import Rounds
from app.activation.waiting import Waiter, WaiterHub, jittered_s
from app.db.rows import JobRow
from app.db.store import Store
from app.domain import JobState, job_record, utcnow
from app.errors import ResourceExhausted, StoreUnavailable
from app.scheduler import Aging

log = logging.getLogger(__name__)

# A claim's jobs go out together, in writes of at most this much data (a job at least):
# one write of a whole claim was taken into the server's buffer at once, whatever its
# size, and so counted as delivered to a client that had read none of it (a review of
# 7cc294a: forty 200 KB jobs held until their leases ended, the event loop stalled
# 0.8 s encoding a hundred 1 MB ones).  A write that waits for the client to read is one
# that a disconnect cuts, and this bounds what it holds.  The transport's own high-water
# mark is 64 KiB.
WRITE_BYTES = 64 * 1024


class StreamRegistry:
    """Which stream holds which job, so a finished job's credit finds its stream."""

    def __init__(self) -> None:
        self.by_key: dict[int, Stream] = {}
        self.streams: set[Stream] = set()
        self.shutdown = asyncio.Event()

    def credit(self, job_keys: Sequence[int]) -> None:
        for key in job_keys:
            stream = self.by_key.pop(key, None)
            if stream is not None:
                stream.returned(key)


class Stream:
    def __init__(
        self,
        req: ActivateRequest,
        hub: WaiterHub,
        registry: StreamRegistry,
        store: Store,
        rounds: Rounds,
        caller: Caller,
        *,
        check_ms: int,
        fetch_variables: Sequence[str] | None = None,
    ) -> None:
        self.req = dataclasses.replace(req, via_stream=True)
        # Asked whether its key is still live before jobs are written (and on every
        # wake-up: a revoked or expired key ends the stream, its jobs given back), told of
        # the jobs activated before they are written, and asked whether it is gone after
        # each write.
        self.caller = caller
        self.hub = hub
        self.registry = registry
        self.store = store
        self.rounds = rounds
        self.check_ms = check_ms
        self.fetch_variables = fetch_variables
        self.outstanding: dict[int, int] = {}  # jobKey -> activationCount we hold
        self.credit_back = asyncio.Event()
        self.waiter: Waiter | None = None
        self.undelivered: list[JobRow] = []

    @property
    def credit(self) -> int:
        return self.req.max_jobs - len(self.outstanding)

    def returned(self, key: int) -> None:
        if self.outstanding.pop(key, None) is not None:
            self.credit_back.set()

    async def events(self) -> AsyncGenerator[list[dict[str, Any]]]:
        """The stream's writes: the events (``event: job``) of the jobs one claim got,
        together in writes of at most WRITE_BYTES (not one per job: the worker reads
        them at once and finishes them together, and the server checks its connection
        once a write)."""
        self.registry.streams.add(self)
        try:
            while not self.registry.shutdown.is_set():
                if not await self.caller.still_live():
                    return
                try:
                    rows = await self._next_jobs()
                except ResourceExhausted:
                    # The database is unreachable, the pool busy, or every waiter place
                    # taken (StoreUnavailable is one of these).  A stream is a
                    # subscription: it stays open and asks again one check later.
                    await self._pause()
                    continue
                if rows is None:
                    continue
                logs.jobs_activated(rows)  # in the stream's task: with its request's id
                self.undelivered = list(rows)
                if not await self.caller.still_live():
                    return  # revoked while it waited: the jobs go back (_close)
                self.caller.seen(self.req.job_type, self.req.worker, True)
                self.caller.received(rows)
                aging = await self.rounds.recent_aging(self.req.job_type)
                for row in rows:
                    # Counted ours before the write, so that a credit for it (the client
                    # may finish it as soon as it is written) finds this stream.
                    self.outstanding[row.job_key] = row.activation_count
                    self.registry.by_key[row.job_key] = self
                for write in self._writes(rows, utcnow(), aging):
                    # Closed at this yield: the write failed or was cut, and its rows are
                    # still undelivered (released by _close), with those after it.
                    yield write
                    if await self._gone():
                        return  # the server dropped the write: its rows are released too
                    del self.undelivered[: len(write)]  # written: they keep their leases
        finally:
            await self._close()

    def _writes(
        self, rows: Sequence[JobRow], now: datetime, aging: Aging
    ) -> Iterator[list[dict[str, Any]]]:
        """The events of ``rows`` in writes of at most WRITE_BYTES of data, a job at
        least, each encoded only when the one before it was written (a claim of a
        thousand large jobs is not built whole, nor in one go)."""
        write: list[dict[str, Any]] = []
        size = 0
        for row in rows:
            record = job_record(row, now, aging, self.fetch_variables)
            event = {"event": "job", "id": str(row.job_key), "data": orjson.dumps(record).decode()}
            if write and size + len(event["data"]) > WRITE_BYTES:
                yield write
                write, size = [], 0
            write.append(event)
            size += len(event["data"])
        if write:
            yield write

    async def _gone(self) -> bool:
        """Whether the connection was lost before the event just yielded was written:
        uvicorn drops a write to a lost connection without an error, and the response
        asks for the next event at once, before its own disconnect listener has run."""
        return await self.caller.is_gone()

    async def _next_jobs(self) -> list[JobRow] | None:
        """Jobs for the free credit, or None when there is nothing yet (woken by a
        returned credit, the periodic check or shutdown)."""
        if self.credit > 0 and self.waiter is None:
            request = self._request()
            if not self.hub.has_waiters(request.job_type) and not self.hub.known_dry(request):
                rows = await self.hub.activate_owed(request)
                if rows:
                    return rows
            self.waiter = self.hub.enqueue(self._request())  # credit may have come back
        waits: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self.credit_back.wait()),
            asyncio.ensure_future(self.registry.shutdown.wait()),
        ]
        if self.waiter is not None:
            waits.append(self.waiter.future)
        # The periodic check backs up lost credit notifications; with nothing
        # outstanding there is nothing to check (the waiter queue has its own backup).
        timeout = None
        if self.outstanding:
            timeout = jittered_s(self.check_ms)
        try:
            done, _ = await asyncio.wait(
                waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits[:2]:
                w.cancel()
        self.credit_back.clear()
        if self.waiter is not None and self.waiter.future.done():
            waiter, self.waiter = self.waiter, None
            return waiter.future.result() if not waiter.future.cancelled() else None
        if not done and not self.registry.shutdown.is_set():
            await self._check_outstanding()  # the timer ran out: nothing else woke us
        return None

    async def _pause(self) -> None:
        """One jittered check interval, or less if the server shuts down."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.registry.shutdown.wait(), jittered_s(self.check_ms))

    def _request(self) -> ActivateRequest:
        return dataclasses.replace(self.req, max_jobs=self.credit)

    async def _check_outstanding(self) -> None:
        """The backup for a lost ``jobfair_done``: credits of jobs no longer ours."""
        if not self.outstanding:
            return
        states = await self.store.fences(list(self.outstanding))
        for key, count in list(self.outstanding.items()):
            row = states.get(key)
            if row is None or row.state is not JobState.ACTIVATED or row.activation_count != count:
                self.registry.by_key.pop(key, None)
                self.outstanding.pop(key, None)

    async def _close(self) -> None:
        if self.waiter is not None:
            self.waiter.future.cancel()  # the dispatcher releases anything it got for us
        for row in self.undelivered:
            self.outstanding.pop(row.job_key, None)
            self.registry.by_key.pop(row.job_key, None)
        for key in self.outstanding:
            self.registry.by_key.pop(key, None)
        if not self.undelivered:
            self.registry.streams.discard(self)
            return
        # Activated for us but never written: back to the queue now, not at timeout.  The
        # release finishes even if the response's task is cancelled meanwhile (a client
        # gone cancels it at every await), and the stream stays in the registry until it
        # has: once a stream leaves the registry, what it released is back.
        rows, self.undelivered = self.undelivered, []
        release = asyncio.ensure_future(self.rounds.release(rows))
        release.add_done_callback(lambda task: self._released(task, len(rows)))
        with contextlib.suppress(StoreUnavailable):  # logged by _released
            await asyncio.shield(release)

    def _released(self, release: asyncio.Future[int], count: int) -> None:
        self.registry.streams.discard(self)
        exc = None if release.cancelled() else release.exception()
        if isinstance(exc, StoreUnavailable):
            log.warning("%d undelivered jobs return at their lease expiry", count)
        elif exc is not None:  # a bug; logged here too, as nobody may be awaiting it
            log.error("releasing %d undelivered jobs failed", count, exc_info=exc)


def keep_alive_factory() -> Callable[[], Any]:
    from sse_starlette import ServerSentEvent

    return lambda: ServerSentEvent(comment="keep-alive")
