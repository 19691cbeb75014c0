"""Producing and finishing jobs: the services behind the job routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn

from app import logs, scheduler
from app.activation import Activation
from app.coalescing import Coalescer
from app.db import Database, finishing, job_rows
from app.db.base import refused_input, retry_deadlock
from app.db.job_rows import ready_at_once
from app.db.rows import Ended, Inserted, JobFence, JobRow, StoredJob
from app.domain import FINISHED_STATES, MAX_LEASE_MS, JobState, job_record, tenant_of, utcnow
from app.errors import InvalidState, NotFound, StaleActivation
from app.metrics.events import COMPLETED, ERROR_THROWN, FAILED, RETRIED


@dataclass(frozen=True, slots=True)
class JobChanges:
    retries: int | None = None
    timeout_ms: int | None = None
    priority: int | None = None


class GroupCommit:
    """Single completions that arrive while one is being written go into the next write.

    Each ``POST /complete`` is one job, but a busy server receives dozens at once; writing
    them one statement and one commit each spends most of the database's time on commits.
    The first call starts a flusher at once (no added latency when idle); calls arriving
    while its statement runs wait for the next statement, which carries them all.  A key
    appears at most once per statement, so a duplicate or stale second completion of the
    same job is judged after the first one committed, exactly as if they were sequential.
    A statement that fails on one completion's values (variables or an activationCount
    the database refuses) is split until that completion fails alone (ADR 006).
    """

    def __init__(
        self,
        db: Database,
        max_batch: int = 1000,
        completed: Callable[[Sequence[Ended], datetime], None] | None = None,
    ) -> None:
        self.db = db
        self.max_batch = max_batch
        self.completed = completed  # told of the jobs each statement completed
        self._writes: Coalescer[tuple[int, int, str | None], Ended | None] = Coalescer(
            self._write,
            self._one_statement,
            spawn=lambda runner: asyncio.ensure_future(logs.unattributed(runner)),
            split=refused_input,
        )

    async def complete(self, item: tuple[int, int, str | None]) -> Ended | None:
        """The job, if this (key, activationCount) completed it."""
        return await self._writes.submit(item)

    def _one_statement(self, items: Sequence[tuple[int, int, str | None]]) -> list[bool]:
        """Each key once, and at most ``max_batch`` items."""
        keys: set[int] = set()
        chosen = []
        for key, _, _ in items:
            fits = key not in keys and len(keys) < self.max_batch
            if fits:
                keys.add(key)
            chosen.append(fits)
        return chosen

    async def _write(self, items: list[tuple[int, int, str | None]]) -> list[Ended | None]:
        now = utcnow()
        ended = await finishing.complete(self.db, items, now)
        if self.completed is not None:
            self.completed(ended, now)
        completed = {e.job_key: e for e in ended}
        return [completed.get(key) for key, _, _ in items]


def _log_completed(ended: list[Ended]) -> set[int]:
    """The keys of ``ended``, each logged ``job completed`` (DEBUG)."""
    if logs.jobs.isEnabledFor(logging.DEBUG):
        for e in ended:
            logs.job_event(logging.DEBUG, "completed", e.job_key, e.job_type, e.tenant_id)
    return {e.job_key for e in ended}


def _created(jobs: Sequence[Mapping[str, Any]], inserted: Sequence[Inserted]) -> None:
    """``job created`` (DEBUG) for each job ``inserted`` made (not those an idempotency
    key already had)."""
    if logs.jobs.isEnabledFor(logging.DEBUG):
        for job, row in zip(jobs, inserted, strict=True):
            _created_one(job, row)


def _created_one(job: Mapping[str, Any], row: Inserted | JobRow) -> None:
    if logs.jobs.isEnabledFor(logging.DEBUG) and getattr(row, "created", True):
        logs.job_event(logging.DEBUG, "created", row.job_key, job["type"], tenant_of(job))


class JobService:
    def __init__(self, db: Database, activation: Activation) -> None:
        self.db = db
        self.activation = activation
        # Every event is counted here once its statement committed (app.metrics).
        self.metrics = activation.metrics
        self.group_commit = GroupCommit(db, completed=self._completed)

    def _completed(self, jobs: Sequence[Ended], now: datetime) -> None:
        self.activation.rounds.settlements.add(jobs, now)
        self.metrics.jobs_finished(
            COMPLETED, ((e.job_type, e.tenant_id, e.activated_at) for e in jobs), now
        )

    async def create(self, jobs: Sequence[Mapping[str, Any]], now: datetime) -> list[Inserted]:
        if len(jobs) == 1:
            [job] = jobs
            if ready_at_once(job, now) and job.get("idempotencyKey") is None:
                handed = await self.activation.hand_off(job, now)
                if handed is not None:
                    _created_one(job, handed)
                    return [handed]
        await self.activation.charged(j["type"] for j in jobs)
        inserted = await job_rows.insert(self.db, jobs, now)
        self.metrics.count(
            self.metrics.created,
            ((j["type"], tenant_of(j)) for j, i in zip(jobs, inserted, strict=True) if i.created),
        )
        _created(jobs, inserted)
        return inserted

    async def create_one(
        self, job: Mapping[str, Any], now: datetime
    ) -> tuple[dict[str, Any], bool]:
        """``POST /v2/jobs``: create ``job`` and answer its record, and whether it is new
        (an idempotency key already taken answers the job holding it).  It is inserted
        by a statement that answers its record too, or, without an idempotency key,
        handed to a waiter by a claim that does."""
        keyed = job.get("idempotencyKey") is not None
        if ready_at_once(job, now) and not keyed:
            handed = await self.activation.hand_off(job, now)
            if handed is not None:
                # The record is read after the hand-off, not taken from its claim: while
                # the read runs, the waiter's answer goes out, so the job reaches its
                # worker before its producer hears back (taken from the claim, the
                # producer was answered first: pickup p50 from the producer's answer
                # 0.00 -> 0.68 ms, `python -m bench.run pickup`).
                _created_one(job, handed)
                return await self.get(handed.job_key, now), True
        await self.activation.charged([job["type"]])  # as the hand-off waits for them
        stored_job = await job_rows.insert_one(self.db, job, now)
        if stored_job is None:  # its idempotency key is taken: answer the job holding it
            [inserted] = await job_rows.insert(self.db, [job], now)
            if inserted.created:  # the holder was gone by then (retention)
                self.metrics.count_one(self.metrics.created, job["type"], tenant_of(job))
            _created_one(job, inserted)
            return await self.get(inserted.job_key, now), inserted.created
        self.metrics.count_one(self.metrics.created, job["type"], tenant_of(job))
        _created_one(job, stored_job.job)
        return self._record(stored_job, now), True

    async def idempotent(self, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """The keys of jobs already created under the idempotency keys ``jobs`` carry."""
        return await job_rows.idempotent(self.db, jobs)

    async def get(self, job_key: int, now: datetime) -> dict[str, Any]:
        found = await job_rows.get(self.db, job_key)
        if found is None:
            raise NotFound(f"job {job_key} does not exist")
        return self._record(found, now)

    def _record(self, found: StoredJob, now: datetime) -> dict[str, Any]:
        cfg = found.type_config
        aging = self.activation.resolve_aging(cfg.aging_interval_ms, cfg.aging_step)
        return job_record(found.job, now, aging)

    async def cancel(self, job_key: int, now: datetime) -> None:
        """CREATED (delayed too), ACTIVATED or FAILED -> CANCELED; an ACTIVATED job's
        worker then gets 409 for its finish."""
        ended = await finishing.cancel(self.db, job_key, now)
        if ended is None:
            row = await self._existing(job_key)
            raise InvalidState(
                f"job {job_key} is {row.state};"
                " only a CREATED, ACTIVATED or FAILED job can be canceled"
            )
        # A lease it ended held its worker until now (by worker time, ADR 029).
        self.activation.rounds.settlements.add([ended], now)
        lane = ended.job_type, ended.tenant_id
        self.metrics.count_one(self.metrics.canceled, *lane)
        if logs.jobs.isEnabledFor(logging.INFO):
            logs.job_event(logging.INFO, "canceled", job_key, *lane)

    async def complete(
        self, job_key: int, activation_count: int | None, variables: str | None
    ) -> None:
        activation_count = await self._fence(job_key, activation_count)
        ended = await self.group_commit.complete((job_key, activation_count, variables))
        if ended is None:
            await self._explain_fenced(job_key, activation_count)
        # Here, not in the group commit's task, which serves many requests: the line
        # carries this request's id.
        if logs.jobs.isEnabledFor(logging.DEBUG):
            logs.job_event(logging.DEBUG, "completed", job_key, ended.job_type, ended.tenant_id)

    async def complete_many(
        self, items: Sequence[tuple[int, int, str | None]], now: datetime
    ) -> list[tuple[int, int]]:
        """One verdict per item, in order, as if each were sent after the one before."""
        keys = [key for key, _, _ in items]
        if len(set(keys)) == len(keys):  # no job named twice: one statement, as usual
            ended = await finishing.complete(self.db, items, now)
            self._completed(ended, now)
            done = _log_completed(ended)
            completed = [key in done for key in keys]
        else:
            completed = await self._complete_in_order(items, now)
        missed = [key for key, ok in zip(keys, completed, strict=True) if not ok]
        known = await job_rows.fences(self.db, missed) if missed else {}
        return [
            (key, 204 if ok else (409 if key in known else 404))
            for key, ok in zip(keys, completed, strict=True)
        ]

    async def _complete_in_order(
        self, items: Sequence[tuple[int, int, str | None]], now: datetime
    ) -> list[bool]:
        """One statement cannot judge a job twice (its UPDATE changes a row once, and
        both namings read as done), so the n-th naming of each job goes into the n-th
        statement, after the one before committed.  A naming of a job with the same
        activationCount as an earlier one is judged without a statement, as if it came
        right after that one (namings of other jobs commute with it), where it cannot
        complete the job: the earlier one did, or found it not ACTIVATED at that count.
        So a body naming one job a thousand times costs one statement, not a thousand
        in a row."""
        statements: list[list[int]] = []  # positions in items, per statement
        namings: dict[int, int] = {}
        fences: set[tuple[int, int]] = set()
        for i, (key, count, _) in enumerate(items):
            if (key, count) in fences:
                continue  # not completed: answered 409 (or 404) with the others
            fences.add((key, count))
            n = namings.get(key, 0)
            namings[key] = n + 1
            if n == len(statements):
                statements.append([])
            statements[n].append(i)
        completed = [False] * len(items)
        for positions in statements:
            ended = await finishing.complete(self.db, [items[i] for i in positions], now)
            self._completed(ended, now)
            done = _log_completed(ended)
            for i in positions:
                completed[i] = items[i][0] in done
        return completed

    async def fail(
        self,
        job_key: int,
        activation_count: int | None,
        *,
        retries: int | None,
        error_message: str | None,
        retry_backoff_ms: int,
        variables: str | None,
        now: datetime,
    ) -> None:
        activation_count = await self._fence(job_key, activation_count)
        row = await finishing.fail(
            self.db,
            job_key,
            activation_count,
            retries=retries,
            error_message=error_message,
            run_at=scheduler.retry_at(now, retry_backoff_ms),
            variables=variables,
            now=now,
        )
        if row is None:
            await self._explain_fenced(job_key, activation_count)
            return
        self.activation.rounds.settlements.add([row], now)
        outcome = FAILED if row.state is JobState.FAILED else RETRIED
        self.metrics.jobs_finished(outcome, [(row.job_type, row.tenant_id, row.activated_at)], now)
        if logs.jobs.isEnabledFor(logging.INFO):
            logs.job_event(
                logging.INFO,
                "failed",
                job_key,
                row.job_type,
                row.tenant_id,
                activationCount=activation_count,
                # CREATED or SCHEDULED: to be retried; FAILED: no retries left.
                state=row.state.value,
                errorMessage=_bounded(error_message),
            )

    async def throw_error(
        self,
        job_key: int,
        activation_count: int | None,
        error_code: str,
        error_message: str | None,
        variables: str | None,
        now: datetime,
    ) -> None:
        activation_count = await self._fence(job_key, activation_count)
        ended = await finishing.throw_error(
            self.db, job_key, activation_count, error_code, error_message, variables, now
        )
        if ended is None:
            await self._explain_fenced(job_key, activation_count)
            return
        self.activation.rounds.settlements.add([ended], now)
        self.metrics.jobs_finished(
            ERROR_THROWN, [(ended.job_type, ended.tenant_id, ended.activated_at)], now
        )
        if logs.jobs.isEnabledFor(logging.INFO):
            logs.job_event(
                logging.INFO,
                "error thrown",
                job_key,
                ended.job_type,
                ended.tenant_id,
                activationCount=activation_count,
                errorCode=error_code,
                errorMessage=_bounded(error_message),
            )

    @retry_deadlock
    async def update(
        self, job_key: int, changes: JobChanges, activation_count: int | None, now: datetime
    ) -> None:
        """PATCH: read the job under its row lock, decide its new values, write them."""
        async with self.db.transaction() as tx:
            job = await job_rows.lock(tx, job_key)
            retries, deadline, priority, state = _patched(
                job_key, job, changes, activation_count, now
            )
            assert job is not None  # _patched refused a missing job
            await job_rows.update(
                tx,
                job,
                retries=retries,
                deadline=deadline,
                priority=priority,
                state=state,
                now=now,
            )

    async def _existing(self, job_key: int) -> JobFence:
        rows = await job_rows.fences(self.db, [job_key])
        if job_key not in rows:
            raise NotFound(f"job {job_key} does not exist")
        return rows[job_key]

    async def _fence(self, job_key: int, activation_count: int | None) -> int:
        """The activation a finish call is fenced by: the caller's, or, when it sent none
        (Camunda's clients without a lease token), the current one of an ACTIVATED job,
        the guarantee Camunda itself gives."""
        if activation_count is not None:
            return activation_count
        row = await self._existing(job_key)
        if row.state is not JobState.ACTIVATED:
            raise InvalidState(f"job {job_key} is {row.state}, not ACTIVATED")
        return row.activation_count

    async def _explain_fenced(self, job_key: int, activation_count: int) -> NoReturn:
        row = await self._existing(job_key)
        if row.activation_count != activation_count:
            raise StaleActivation(
                f"job {job_key} is at activation {row.activation_count}, not {activation_count}"
            )
        raise StaleActivation(f"job {job_key} is {row.state}, not ACTIVATED")


# A worker's error message is logged to this many characters (it may be a whole page).
LOGGED_ERROR_CHARS = 500


def _bounded(message: str | None) -> str | None:
    if message is None or len(message) <= LOGGED_ERROR_CHARS:
        return message
    return message[:LOGGED_ERROR_CHARS] + "..."


def _patched(
    job_key: int,
    job: JobRow | None,
    changes: JobChanges,
    activation_count: int | None,
    now: datetime,
) -> tuple[int, datetime | None, int, JobState]:
    """A PATCH's new (retries, deadline, priority, state) for ``job``, or the domain
    error that refuses it."""
    if job is None:
        raise NotFound(f"job {job_key} does not exist")
    if job.state in FINISHED_STATES:
        raise InvalidState(f"job {job_key} is {job.state}: it is finished")
    if activation_count is not None and job.activation_count != activation_count:
        raise StaleActivation(
            f"job {job_key} is at activation {job.activation_count}, not {activation_count}"
        )
    retries = job.retries if changes.retries is None else changes.retries
    priority = job.priority if changes.priority is None else changes.priority
    deadline = job.deadline
    state = job.state
    if changes.timeout_ms is not None:
        if state is not JobState.ACTIVATED:
            raise InvalidState(f"job {job_key} is {state}; only an ACTIVATED job has a lease")
        deadline = now + timedelta(milliseconds=min(changes.timeout_ms, MAX_LEASE_MS))
        if activation_count is None and job.deadline is not None:
            # Unfenced, the caller may not hold the lease (any worker, or a stale one): it
            # may extend the lease, never cut the holder's short.
            deadline = max(deadline, job.deadline)
    if changes.retries is not None and state is JobState.FAILED and retries > 0:
        state = JobState.CREATED  # revive an incident
    return retries, deadline, priority, state
