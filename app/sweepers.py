"""Background work: lease expiry, promotion of due jobs, retention, stats sampling, and
writing the workers seen.

Leader-only tasks run on one process at a time across replicas: the holder of a
session-level advisory lock on a dedicated connection.  Every task is safe to run twice
(each statement re-checks the state it changes) and has ``run_once(now)`` for tests.
A database that is away (``StoreUnavailable``: unreachable, restarting, out of connection
slots, a connection that died mid-call) is transient: each loop logs it once, backs off,
retries, and logs again when it recovers.  Anything else is a bug and stops the process
(``on_fatal``): half-alive is worse than restarted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import asyncpg

from app import logs
from app.activation.charging import Settlements
from app.config import Settings
from app.db import Database, StoreUnavailable, maintenance, operating
from app.db.leader import LeaderLock
from app.db.rows import Ended
from app.db.store import Store
from app.domain import JobState, utcnow
from app.metrics.events import Metrics, multiprocess_dir
from app.metrics.loops import LabelRefresher, ProcessSync, TenantRanker
from app.metrics.otlp import MetricsPush
from app.stats import StatsService
from app.workers import SEEN_WINDOW, WorkerSightings

log = logging.getLogger(__name__)

BATCH = 1000
# Back-off of a loop whose database is away: doubling from its interval up to this.
RETRY_MAX_S = 5.0


async def _in_batches(step: Callable[[], Awaitable[int]]) -> int:
    """Repeat a bounded batch until one comes back short; short transactions keep locks
    and dead tuples small, and one pass still catches up a backlog."""
    total = 0
    while (n := await step()) > 0:
        total += n
        if n < BATCH:
            break
    return total


class LeaseSweeper:
    """Expired ACTIVATED -> CREATED, retries unchanged; each counted as a lease expiry.

    While the jobs table is degraded (ADR 036) the index of leases keeps an entry for every
    lease that ended since the horizon was held, and a sweep from its start walked them
    all, each second.  Then a sweep starts SINCE_SLACK before the instant of the last
    sweep that found every expired lease, and every FULL_EVERY_S one starts from the
    first: a lease whose claim committed more than SINCE_SLACK after its own deadline
    expires by that one."""

    name = "lease-sweeper"
    SINCE_SLACK = timedelta(seconds=5)
    FULL_EVERY_S = 30.0

    def __init__(self, db: Database, interval_ms: int, metrics: Metrics | None = None) -> None:
        self.db = db
        self.interval_ms = interval_ms
        self.metrics = metrics
        self.clock = time.monotonic
        self._swept_to: datetime | None = None  # the instant of the last whole sweep
        self._full_at = -math.inf
        # An expired lease held its worker until now, by worker time (ADR 029): settled
        # before the sweep ends (its writer tasks are awaited, not spawned apart).
        self.store = Store(db)
        self.settlements = Settlements(self.store, lambda task, what: None)

    def _since(self) -> datetime | None:
        """Where this sweep starts (None: from the first lease)."""
        if (
            not self.store.degraded
            or self._swept_to is None
            or self.clock() - self._full_at >= self.FULL_EVERY_S
        ):
            return None
        return self._swept_to - self.SINCE_SLACK

    async def run_once(self, now: datetime) -> int:
        since = self._since()

        async def batch() -> int:
            expired = await maintenance.release_expired(self.db, now, BATCH, since)
            self.settlements.add(
                (
                    Ended(
                        j.job_key,
                        j.job_type,
                        j.tenant_id,
                        JobState.CREATED,
                        j.activated_at,
                        j.fairness_key,
                        j.charged,
                        j.lane_charge,
                        j.key_charge,
                    )
                    for j in expired
                ),
                now,
            )
            if self.metrics is not None:
                self.metrics.count(
                    self.metrics.lease_expired, ((j.job_type, j.tenant_id) for j in expired)
                )
            if logs.jobs.isEnabledFor(logging.INFO):
                for job in expired:
                    logs.job_event(
                        logging.INFO,
                        "lease expired",
                        job.job_key,
                        job.job_type,
                        job.tenant_id,
                        activationCount=job.activation_count,
                        worker=job.worker,
                    )
            return len(expired)

        expired = await _in_batches(batch)
        self._swept_to = now  # every lease that ended before now and since is expired
        if since is None:
            self._full_at = self.clock()
        await self.settlements.written()
        return expired


class Promoter:
    """SCHEDULED (delayed, backing off) -> CREATED once ``runAt`` has come."""

    name = "promoter"

    def __init__(self, db: Database, interval_ms: int) -> None:
        self.db = db
        self.interval_ms = interval_ms

    async def run_once(self, now: datetime) -> int:
        return await _in_batches(lambda: maintenance.promote_scheduled(self.db, now, BATCH))


class RetentionSweeper:
    """Deletes terminal jobs older than the retention period, in bounded batches (their
    history with them), and worker names not seen for a day."""

    name = "retention"

    def __init__(self, db: Database, interval_ms: int, retention_s: int) -> None:
        self.db = db
        self.interval_ms = interval_ms
        self.retention_s = retention_s

    async def run_once(self, now: datetime) -> int:
        before = now - timedelta(seconds=self.retention_s)
        pruned = await _in_batches(lambda: maintenance.prune_terminal(self.db, before, BATCH))
        await maintenance.prune_workers(self.db, now - SEEN_WINDOW)
        return pruned


class KeyHoldSweeper:
    """Releases the held fairness keys that have room under their caps (ADR 040), a
    transaction of at most KEY_RELEASE_CHUNK at a time: a backstop (a hold is only a
    shortcut: the next claim of a key counts again).  During a rolling upgrade from a
    server older than alembic 0016, whose finishes do not release key holds, it bounds how
    long a key stays held with room: one interval.  Each look counts the held keys' jobs
    (one probe each), so it looks twice a minute."""

    name = "key holds"
    interval_ms = 30_000

    def __init__(self, db: Database) -> None:
        self.db = db

    async def run_once(self, now: datetime) -> int:
        try:
            return await operating.release_held_keys(self.db)
        except asyncpg.PostgresError as exc:  # a backstop: its failure stops nothing else
            log.warning("releasing held keys with room failed: %r", exc)
            return 0


class StatsSampler:
    name = "stats-sampler"

    def __init__(self, stats: StatsService) -> None:
        self.stats = stats
        self.interval_ms = int(stats.sample_interval_s * 1000)

    async def run_once(self, now: datetime) -> int:
        await self.stats.sample()
        return 0


# autovacuum_naptime beyond which the jobs table carries many dead versions between two
# autovacuum runs (at 1,000 jobs/s about 2,000 a second): said once, at start.
NAPTIME_WARN_S = 15


class DeadRowsWatch:
    """Every process: the job table's dead row versions that each vacuum of it leaves
    behind, counted into the pool's claim hints (ADR 036), which work around them while
    there are many.  Between two vacuums dead versions pile up whatever holds the
    horizon (autovacuum_naptime is a minute by default), so only what a vacuum could not
    remove is counted."""

    name = "dead-rows"
    interval_ms = 2000

    def __init__(self, db: Database) -> None:
        self.db = db
        self._vacuums: int | None = None

    async def _check_settings(self) -> None:
        naptime_s, autovacuum = await maintenance.vacuum_settings(self.db)
        if not autovacuum:
            log.warning("autovacuum is off: the jobs table's dead row versions pile up")
        elif naptime_s > NAPTIME_WARN_S:
            log.warning(
                "autovacuum_naptime is %g s: between two autovacuum runs the jobs table "
                "carries every job version that died meanwhile; 5 s keeps it small "
                "(docs/reliability.md)",
                naptime_s,
            )

    async def run_once(self, now: datetime) -> int:
        hints = self.db.claim_hints
        if hints is None or self.db.shard_map is not None:  # on Citus: the nodes' own
            return 0
        if self._vacuums is None:
            await self._check_settings()
        dead, vacuums = await maintenance.dead_rows(self.db)
        vacuumed = self._vacuums is not None and vacuums != self._vacuums
        self._vacuums = vacuums
        if not vacuumed:
            return dead
        was = hints.degraded
        hints.observe(dead)
        if hints.degraded != was:
            if hints.degraded:
                log.warning(
                    "the jobs table holds %d dead row versions (is a transaction holding "
                    "the xmin horizon?): claims start past the jobs they took (ADR 036)",
                    dead,
                )
            else:
                log.info("the jobs table's dead row versions are down to %d", dead)
        return dead


Task = (
    DeadRowsWatch
    | LeaseSweeper
    | KeyHoldSweeper
    | Promoter
    | RetentionSweeper
    | StatsSampler
    | LabelRefresher
    | ProcessSync
    | TenantRanker
    | WorkerSightings
    | MetricsPush
)


class Background:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        session_url: str,
        stats: StatsService,
        on_fatal: Callable[[BaseException], None],
        enabled: bool = True,
        metrics: Metrics | None = None,
        workers: WorkerSightings | None = None,
    ) -> None:
        self.db = db
        self.on_fatal = on_fatal
        self.enabled = enabled
        self.lease = LeaseSweeper(db, settings.lease_sweep_interval_ms, metrics)
        self.promoter = Promoter(db, settings.promote_interval_ms)
        self.retention = RetentionSweeper(
            db, settings.retention_sweep_interval_ms, settings.retention_s
        )
        self.sampler = StatsSampler(stats)
        self.leader_tasks: list[Task] = [
            self.lease,
            self.promoter,
            self.retention,
            KeyHoldSweeper(db),
        ]
        # Every process: its state into the shared metrics files (multiprocess mode) and
        # the labelled tenants read; the leader decides those (app.metrics).
        self.process_tasks: list[Task] = [self.sampler, DeadRowsWatch(db)]
        if workers is not None:  # every process writes the worker names it saw
            self.process_tasks.append(workers)
        self.labels: LabelRefresher | None = None
        self.ranker: TenantRanker | None = None
        if metrics is not None:
            self.labels = LabelRefresher(db, metrics.labels)
            self.ranker = TenantRanker(
                db,
                stats,
                metrics.labels,
                settings.metrics_top_tenants,
                settings.metrics_top_tenants_interval_ms,
            )
            self.process_tasks.append(self.labels)
            self.leader_tasks.append(self.ranker)
            if multiprocess_dir() is not None:
                self.process_tasks.append(ProcessSync(metrics))
        self.is_leader = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # The leader lock is session-level: its connection comes from the session URL.
        self._leader = LeaderLock(session_url)

    async def start(self) -> None:
        if not self.enabled:
            return
        self._spawn(self._leadership())
        for task in self.process_tasks:
            self._spawn(self._loop(task, leader_only=False))
        for task in self.leader_tasks:
            self._spawn(self._loop(task, leader_only=True))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._leader.close()
        self.is_leader.clear()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(self._supervise)
        self._tasks.append(task)

    def _supervise(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("background task died: %r; stopping the process", exc, exc_info=exc)
            self.on_fatal(exc)

    async def _leadership(self) -> None:
        """Hold the leader lock while its connection lives; re-contend when it dies."""
        while True:
            try:
                if await self._leader.hold():
                    if not self.is_leader.is_set():
                        log.info("this process leads the background work")
                        self.is_leader.set()
                elif self.is_leader.is_set():
                    # The lock's session died between two passes, and another process
                    # took the lock before this one reconnected: it leads now, not us.
                    log.warning("this process no longer leads: another took the leader lock")
                    self.is_leader.clear()
            except StoreUnavailable as exc:
                if self.is_leader.is_set():
                    log.warning("leader connection lost: %r", exc.__cause__ or exc)
                self.is_leader.clear()
            await asyncio.sleep(1.0 + random.random())

    async def _loop(self, task: Task, *, leader_only: bool) -> None:
        interval_s = task.interval_ms / 1000.0
        delay_s = interval_s
        failing = False
        while True:
            if leader_only:
                await self.is_leader.wait()
            try:
                await task.run_once(utcnow())
            except StoreUnavailable as exc:
                if not failing:  # once per outage: every pass fails until it ends
                    log.warning("%s: database unavailable, backing off: %r", task.name, exc)
                failing = True
                delay_s = min(max(delay_s, 0.1) * 2, max(RETRY_MAX_S, interval_s))
            else:
                if failing:
                    log.info("%s: database back; carrying on", task.name)
                failing = False
                delay_s = interval_s
            # Jitter keeps replicas and tasks from beating in step.
            await asyncio.sleep(delay_s * (0.9 + 0.2 * random.random()))
