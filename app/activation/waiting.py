"""Long-poll waiters: woken by work, not by a timer, and without a stampede.

(One timer: waiters that only rate limits keep from jobs wake when the next token is
due, ``Rounds.token_due``.)

Each job type has a FIFO queue of waiters (long polls and streams with credit) and one
dispatcher task.  A wake-up (NOTIFY, an in-process event, or the jittered backup poll)
makes the dispatcher activate for the waiter at the head of the queue: if it gets jobs
they are handed over and (there may be more) the next waiter is tried; if it gets
nothing, the dispatcher goes back to sleep.  So one new job costs one activation query
(two when the type's count of announced jobs is not known) however many requests wait,
waiters are served in arrival order, and every hand-out goes through the same scheduler
as an immediate activation.

A request that finds the type known to be dry (see ``WaiterHub.known_dry``) queues
without asking the database at all.

A waiter that comes back empty for a tenant filter is not the last word for waiters with
another filter: each distinct filter is tried once per wake-up (bounded by the number of
distinct filters waiting).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app import logs
from app.activation.ports import ActivateRequest, TenantFilter
from app.activation.rounds import Rounds
from app.db.base import refused_input
from app.db.rows import JobRow
from app.errors import ResourceExhausted

log = logging.getLogger(__name__)


def jittered_s(period_ms: int) -> float:
    """A backup-poll period in seconds, ±25 %, so that processes and streams polling on
    the same period do not query in step."""
    return period_ms / 1000 * (0.75 + 0.5 * random.random())


Rows = list[JobRow]
# Waiters served at once by one dispatcher while a backlog lasts.
MAX_PARALLEL = 8
# A dispatcher waiting for a rate limit's next token wakes this long after it is due: the
# bucket's instant is the database's clock, a moment behind this process's by the time
# the answer arrives, and a wake-up a hair early would find no whole token and wait again.
TOKEN_SLACK_S = 0.002


@dataclass(eq=False)
class Waiter:
    req: ActivateRequest
    future: asyncio.Future[Rows] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # Taken by a create that claims for it (WaiterHub.take_head): the dispatcher passes
    # it by until the create is done.
    reserved: bool = False


@dataclass
class _Tally:
    """Jobs of a type announced (NOTIFY counts) and activated in this process since
    the type was last known dry.  Once as many were activated as were announced, the
    type is dry again without a read to prove it (the dispatcher's trailing "next
    waiter" read, one per job of a trickle).  A job activated here before its own
    announcement arrived can end the count early; that announcement then wakes the type
    and it is read as usual."""

    announced: int = 0
    activated: int = 0

    def all_out(self, activated_now: int) -> bool:
        """Count ``activated_now`` more jobs activated: are all announced ones out?"""
        self.activated += activated_now
        return self.activated >= self.announced


class _TypeQueue:
    def __init__(self) -> None:
        self.waiters: deque[Waiter] = deque()
        # Waiters still waiting (futures not done); kept by callbacks so the checks on
        # every long poll are O(1) however many wait.
        self.live = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.serving = False  # the dispatcher is handing out jobs (in _serve)


class WaiterHub:
    def __init__(
        self,
        activation: Rounds,
        release: Callable[[Sequence[JobRow]], Awaitable[int]],
        *,
        max_waiters: int,
        backup_poll_ms: int,
    ) -> None:
        self.activation = activation
        self.release = release
        self.max_waiters = max_waiters
        self.backup_poll_ms = backup_poll_ms
        self.queues: dict[str, _TypeQueue] = {}
        self.metrics = activation.metrics
        self.wake_queries = 0  # activation queries made by dispatchers (for /metrics)
        self.backup_polls = 0  # dispatcher wake-ups by the backup poll (for /metrics)
        self.token_wakes = 0  # dispatcher wake-ups when a rate limit's token was due
        self.live = 0  # waiters still waiting, across job types
        self.closed = False
        # Dry marks: when an activation last found no ready job for a type and filter.
        # Valid until the next wake-up of the type (or of all types), and for at most a
        # backup poll interval, which bounds what a lost notification can cost.  A
        # request that would wait anyway then joins the queue without asking again.
        self._dry: dict[str, dict[TenantFilter, float]] = {}
        # Wake-ups seen, of any type: only an activation that saw none while it ran may
        # leave a dry mark.
        self._wakes = 0
        # Per type since its last unfiltered dry mark, while every wake-up said how many
        # jobs it announced (see _Tally).
        self._tally: dict[str, _Tally] = {}

    @property
    def waiting(self) -> int:
        return self.live

    @property
    def wakeups(self) -> int:
        """Wake-ups seen: notifications and reconnects (for /metrics)."""
        return self._wakes

    def notify(self, job_type: str, count: int | None = None) -> None:
        """Jobs of ``job_type`` became activatable (``count`` of them, if known) or its
        capacity was freed."""
        self._wakes += 1
        self._dry.pop(job_type, None)
        tally = self._tally.get(job_type)
        if tally is not None:
            if count is None:
                del self._tally[job_type]
            else:
                tally.announced += count
        q = self.queues.get(job_type)
        if q is not None:
            q.wake.set()

    def notify_all(self) -> None:
        self._wakes += 1
        self._dry.clear()
        self._tally.clear()
        for q in self.queues.values():
            q.wake.set()

    async def activate(self, req: ActivateRequest) -> Rows:
        """Rounds.activate, remembering whether it found the type dry."""
        return await self._remember(req, self.activation.activate)

    async def activate_owed(self, req: ActivateRequest, *, one_pick: bool = False) -> Rows:
        """Rounds.activate_owed (or activate_one_pick), remembering whether it
        found the type dry."""
        how = self.activation.activate_one_pick if one_pick else self.activation.activate_owed
        return await self._remember(req, how)

    async def activate_owed_together(self, reqs: Sequence[ActivateRequest]) -> list[Rows]:
        """Rounds.activate_owed_together (``reqs``: one type, tenant filter and
        via_stream), remembering whether it found the type dry."""
        wakes = self._wakes
        per_req, dry = await self.activation.activate_owed_together(reqs)
        self._after(reqs[0], sum(len(rows) for rows in per_req), dry, wakes)
        return per_req

    async def _remember(
        self, req: ActivateRequest, how: Callable[[ActivateRequest], Awaitable[tuple[Rows, bool]]]
    ) -> Rows:
        """Activate with ``how``, and remember whether that found the type dry for the
        request's filter."""
        wakes = self._wakes
        rows, dry = await how(req)
        self._after(req, len(rows), dry, wakes)
        return rows

    def _after(self, req: ActivateRequest, activated: int, dry: bool, wakes: int) -> None:
        """Remember what an activation for ``req``'s type and filter found: ``activated``
        jobs, and whether the type was dry, as of ``wakes`` wake-ups seen when it began."""
        job_type, key = req.job_type, req.tenant_filter
        tally = self._tally.get(job_type)
        if tally is not None and tally.all_out(activated):
            dry, key = True, None  # dry for every filter, without a read to prove it
        marks = self._dry.get(job_type)
        if dry and wakes == self._wakes:  # no wake-up since the read began
            if marks is None:
                marks = self._dry[job_type] = {}
            marks[key] = time.monotonic()
            if key is None:
                self._tally[job_type] = _Tally()
        elif marks is not None:
            marks.pop(key, None)

    def one_expected(self, job_type: str) -> bool:
        """Was the type dry, and has exactly one job been announced since that is not
        out yet?  Then a waiter's activation is one stride pick."""
        tally = self._tally.get(job_type)
        return tally is not None and tally.announced - tally.activated == 1

    def known_dry(self, req: ActivateRequest) -> bool:
        """Did the latest activation for this type and filter find nothing, with no
        wake-up since?  Then a new request that is willing to wait need not ask."""
        # Every lane empty (no filter) is every filter's lanes empty.
        return self._known_dry(req.job_type, req.tenant_filter) or self._known_dry(
            req.job_type, None
        )

    def _known_dry(self, job_type: str, key: TenantFilter) -> bool:
        at = self._dry.get(job_type, {}).get(key)
        return at is not None and time.monotonic() - at < self.backup_poll_ms / 1000

    def admit(self) -> None:
        """ResourceExhausted (503, Retry-After) if a new waiter would be refused now: a
        stream asks before it opens, since after its 200 a refusal can only be an error."""
        if self.closed:
            raise ResourceExhausted("the server is shutting down", retry_after_s=1)
        if self.waiting >= self.max_waiters:
            raise ResourceExhausted(
                f"more than {self.max_waiters} requests are waiting in this process",
                retry_after_s=1,
            )

    def enqueue(self, req: ActivateRequest) -> Waiter:
        self.admit()
        q = self.queues.get(req.job_type)
        if q is None:
            q = self.queues[req.job_type] = _TypeQueue()
        waiter = Waiter(req)
        q.waiters.append(waiter)
        q.live += 1
        self.live += 1
        waiter.future.add_done_callback(lambda _: self._left(q))
        if q.task is None or q.task.done():
            q.task = asyncio.create_task(logs.unattributed(self._dispatch(req.job_type, q)))
        if not self.known_dry(req):
            q.wake.set()
        return waiter

    def _left(self, q: _TypeQueue) -> None:
        """A waiter was served, timed out or went away."""
        q.live -= 1
        self.live -= 1

    async def long_poll(
        self,
        req: ActivateRequest,
        timeout_s: float,
        gone: asyncio.Event,
        on_wait: Callable[[], None] | None = None,
    ) -> Rows:
        """Activate now if nobody waits ahead; else (or if nothing was there) wait up to
        ``timeout_s`` for the dispatcher to hand this request jobs.  Returns [] on timeout
        or when ``gone`` (the client disconnected) is set first; ``on_wait()`` once it
        joins the queue.  Counted and timed in the metrics (requests, empty answers,
        latency, the wait)."""
        started = time.perf_counter()
        rows: Rows = []
        waited = False
        try:
            rows, waited = await self._long_poll(req, timeout_s, gone, on_wait)
        finally:
            self.metrics.activate_request(
                req.job_type, time.perf_counter() - started, waited=waited, empty=not rows
            )
        # Logged here, in the caller's own task, so that the lines carry its request's id:
        # the claim may have run in the dispatcher's or a shared activation's task.
        logs.jobs_activated(rows)
        return rows

    async def _long_poll(
        self,
        req: ActivateRequest,
        timeout_s: float,
        gone: asyncio.Event,
        on_wait: Callable[[], None] | None,
    ) -> tuple[Rows, bool]:
        """long_poll's jobs, and whether it waited in the queue."""
        if timeout_s <= 0:
            # Not waiting: ask now, unless others wait that could take what it could
            # (they are owed what there is).
            if self.owed_first(req):
                return [], False
            return await self.activate(req), False
        if not self.has_waiters(req.job_type) and not self.known_dry(req):
            rows = await self.activate(req)
            if rows:
                return rows, False
        waiter = self.enqueue(req)
        if on_wait is not None:
            on_wait()
        enqueued = time.perf_counter()
        gone_task: asyncio.Future[Any] = asyncio.ensure_future(gone.wait())
        pending: set[asyncio.Future[Any]] = {waiter.future, gone_task}
        outcome = "error"
        try:
            await asyncio.wait(pending, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if waiter.future.done() and not waiter.future.cancelled():
                if waiter.future.exception() is None:
                    rows = waiter.future.result()
                    outcome = "jobs" if rows else "closed"
                    return rows, True
                return waiter.future.result(), True  # raises its error
            outcome = "gone" if gone.is_set() else "timeout"
            waiter.future.cancel()  # the dispatcher skips it, or releases what it got for it
            return [], True
        finally:
            gone_task.cancel()
            self.metrics.waited(req.job_type, time.perf_counter() - enqueued, outcome)

    def take_head(self, job_type: str, tenant: str) -> Waiter | None:
        """The waiter a job of ``job_type`` and ``tenant`` being created now may go to in
        the creating transaction (a hand-off, ADR 012), reserved for that create; then
        ``handed`` must follow.  Only while the type's dispatcher sleeps (it found the
        type dry, and no wake-up is pending), and only the head of the queue, if its
        tenant filter admits the job: waiters are served in arrival order."""
        q = self.queues.get(job_type)
        if self.closed or q is None or q.serving or q.wake.is_set():
            return None
        for w in q.waiters:
            if w.future.done() or w.reserved:
                continue
            if w.req.tenant_ids is not None and tenant not in w.req.tenant_ids:
                return None
            w.reserved = True
            return w
        return None

    async def handed(self, w: Waiter, rows: Rows) -> None:
        """What a hand-off claimed for ``w`` (nothing, if the scheduler's pick was not to
        be had: the waiter is served as usual by its dispatcher)."""
        w.reserved = False
        q = self.queues.get(w.req.job_type)
        if rows and not w.future.done():
            if q is not None and w in q.waiters:
                q.waiters.remove(w)
            w.future.set_result(rows)
            return
        if rows:  # the client left while its job was being claimed: give the job back
            await self.release(rows)
        if q is not None:
            q.wake.set()  # a wake-up may have passed it by while it was reserved

    def fail(self, w: Waiter, exc: Exception) -> None:
        """``w``'s own values failed a statement made for it (a hand-off's claim, its
        dispatcher's activation): it leaves the queue with that error, so the waiters
        behind it and the creates that would be handed to it go on without it."""
        w.reserved = False
        q = self.queues.get(w.req.job_type)
        if q is not None:
            if w in q.waiters:
                q.waiters.remove(w)
            q.wake.set()  # what it was offered may go to the next waiter
        if not w.future.done():
            w.future.set_exception(exc)

    def owed_first(self, req: ActivateRequest) -> bool:
        """Whether a request of ``req``'s type waits here that could be given a job
        ``req`` could take: their tenant filters meet (no filter meets every one).  A
        caller that does not wait gets nothing then; one asking only for tenants no waiter
        asks for is not held back by them (found from outside: it was)."""
        q = self.queues.get(req.job_type)
        if q is None or q.live == 0:
            return False
        mine = req.tenant_ids
        for w in q.waiters:
            if w.future.done():
                continue
            theirs = w.req.tenant_ids
            if mine is None or theirs is None or not set(mine).isdisjoint(theirs):
                return True
        return False

    def has_waiters(self, job_type: str) -> bool:
        q = self.queues.get(job_type)
        return q is not None and q.live > 0

    async def close(self) -> None:
        """Shutdown: every waiter is answered with what it has (nothing)."""
        self.closed = True
        for q in self.queues.values():
            for w in q.waiters:
                if not w.future.done():
                    w.future.set_result([])
            q.waiters.clear()
            if q.task is not None:
                q.task.cancel()
        await asyncio.gather(
            *(q.task for q in self.queues.values() if q.task), return_exceptions=True
        )

    async def _dispatch(self, job_type: str, q: _TypeQueue) -> None:
        while q.waiters:
            backup_s = jittered_s(self.backup_poll_ms)
            # Waiters that rate limits left without jobs are owed a look when the next
            # token is due (ADR 028): a timer from the bucket, not a poll of it.
            due_s = self.activation.token_due(job_type)
            wait_s = backup_s if due_s is None else min(backup_s, due_s + TOKEN_SLACK_S)
            try:
                await asyncio.wait_for(q.wake.wait(), timeout=wait_s)
            except TimeoutError:
                if wait_s == backup_s:
                    # The backup poll: covers a lost NOTIFY or a dead LISTEN connection.
                    self.backup_polls += 1
                else:
                    self.token_wakes += 1
            q.wake.clear()
            q.serving = True
            try:
                await self._serve(job_type, q)
            except Exception as exc:
                # The database failed this round (pool exhausted, connection lost): the
                # waiters stay queued for the next wake-up or backup poll.  A dispatcher
                # that died here would strand them, and a stream's waiter for good.
                log.warning("serving the waiters of %r failed: %r", job_type, exc)
            finally:
                q.serving = False
        # No await since the loop test: no waiter can have slipped in.
        if self.queues.get(job_type) is q:
            del self.queues[job_type]

    async def _serve(self, job_type: str, q: _TypeQueue) -> None:
        """Hand out jobs to waiters in arrival order until a filter's lanes run dry.

        The first round activates for the head waiter alone, so a single new job costs
        one query.  A waiter's activation stops at its first round that claims anything
        (its jobs go out now), so one that got some but not all may leave more behind:
        the next waiter is tried until one gets nothing, or until the type is known to
        be dry again (every job announced since it was last dry is out).  While waiters
        keep coming back with all they asked for there is a backlog, and rounds serve
        more waiters at once (1, 1, 2, 4, ... up to MAX_PARALLEL).
        """
        dry: set[TenantFilter] = set()  # filters whose lanes gave a waiter nothing
        parallel, full_rounds = 1, 0
        while None not in dry:
            batch: list[Waiter] = []
            for w in list(q.waiters):
                if w.future.done() and not w.reserved:  # timed out or left while queued
                    q.waiters.remove(w)
                elif w.reserved:
                    continue  # a create is claiming for it (take_head)
                elif w.req.tenant_filter not in dry and len(batch) < parallel:
                    batch.append(w)
            if not batch:
                return
            self.wake_queries += len(batch)
            groups: dict[tuple[TenantFilter, bool], list[Waiter]] = {}
            for w in batch:
                groups.setdefault((w.req.tenant_filter, w.req.via_stream), []).append(w)
            answers = await asyncio.gather(*(self._serve_group(q, ws) for ws in groups.values()))
            got = [n for answer in answers for n in answer]
            batch = [w for ws in groups.values() for w in ws]
            for ws, answer in zip(groups.values(), answers, strict=True):
                if not any(answer):  # the whole group got nothing: its filter is dry
                    dry.add(ws[0].req.tenant_filter)
            if self._known_dry(job_type, None):
                return
            full = all(
                n is not None and n >= w.req.max_jobs for w, n in zip(batch, got, strict=True)
            )
            full_rounds = full_rounds + 1 if full else 0
            if full_rounds >= 2:
                parallel = min(parallel * 2, MAX_PARALLEL)

    async def _serve_group(self, q: _TypeQueue, ws: list[Waiter]) -> list[int | None]:
        """Activate for waiters of one tenant filter and via_stream together -- one
        claim, shared out in their order, so that a capped type's cap lock is waited for
        once per batch rather than once per waiter -- and hand each its jobs.  How many
        each got (None: the database refused its own values, and it alone was failed)."""
        if len(ws) == 1:
            return [await self._serve_one(q, ws[0])]
        try:
            per_waiter = await self.activate_owed_together([w.req for w in ws])
        except Exception as exc:
            if not refused_input(exc):
                raise
            # One of them sent what the database refused: each alone finds which.
            return list(await asyncio.gather(*(self._serve_one(q, w) for w in ws)))
        for w, rows in zip(ws, per_waiter, strict=True):
            await self._hand(q, w, rows)
        return [len(rows) for rows in per_waiter]

    async def _hand(self, q: _TypeQueue, w: Waiter, rows: Rows) -> None:
        """Give ``w`` the jobs activated for it, or give them back if it left meanwhile."""
        if not rows:
            return
        if w.future.done():
            # The client left while we were activating: give the jobs back now.
            await self.release(rows)
            q.wake.set()
        else:
            q.waiters.remove(w)
            w.future.set_result(rows)

    async def _serve_one(self, q: _TypeQueue, w: Waiter) -> int | None:
        """Activate for one waiter and hand its jobs over the moment they are claimed (not
        when the round's slowest activation is done).  How many it got, or None if the
        database refused the waiter's own values (then it alone is failed)."""
        # A waiter's first round for one job is one stride pick; so is any round when the
        # type was dry and one job came (the rest of a backlog needs the full rounds).
        lead = w.req.max_jobs == 1 or self.one_expected(w.req.job_type)
        try:
            rows = await self.activate_owed(w.req, one_pick=lead)
        except Exception as exc:
            # Its worker name, lease or tenants: the statement held nobody else's values.
            # Left queued, it would fail every round of its type from the head.
            if not refused_input(exc):
                raise
            self.fail(w, exc)
            return None
        await self._hand(q, w, rows)
        return len(rows)
