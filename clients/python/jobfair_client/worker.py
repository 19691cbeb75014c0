"""Job workers: a handler per job, bounded concurrency, over long polling or an SSE stream.

The handler's return value completes the job (a dict becomes the job's variables); an
exception fails it with ``retries - 1`` and an exponential back-off; a ``BusinessError``
(returned or raised) throws a job error.  A 409 on finishing means this worker's
activation is no longer current: it is logged and dropped, never retried.  Long handlers
keep their lease by heartbeat.  ``stop()`` stops activating, lets handlers finish for
``shutdown_grace_s`` and releases the jobs of those that do not.

Completions are sent together (``batch_completion``, on by default): the handlers that
finish while a batch is on its way are completed by the next one, each still fenced by
its activation count and each with its own verdict.  One request per job would cost a
worker more than the job: with fifty handlers, fifty requests in flight at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from jobfair_client import tracing
from jobfair_client.client import AsyncJobfair, Backoff, Jobfair, completion_item
from jobfair_client.errors import Conflict, InvalidArgument, JobfairError, NotFound
from jobfair_client.models import BusinessError, Job

log = logging.getLogger("jobfair_client")

STOP_ABORT_DELAY_S = 0.25
# What an answer the client did not expect raises (not JSON, a field missing or odd).
UNEXPECTED = (ValueError, KeyError, TypeError)
# At shutdown, how long a job whose handler returned may wait for its verdict.
FINISH_WAIT_S = 60.0
# A batch of completions: at most this many jobs (the server's limit) and about this many
# bytes (a handler's variables can be large; the server's body limit is 16 MiB).
BATCH_MAX_JOBS = 1_000
BATCH_MAX_BYTES = 1 << 20
Result = dict[str, Any] | BusinessError | None
AsyncHandler = Callable[[Job], Awaitable[Result]]
SyncHandler = Callable[[Job], Result]


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    errors_thrown: int = 0
    conflicts: int = 0
    released: int = 0


class _Completions:
    """A worker's completions, sent together: whatever is queued when the previous batch
    comes back goes in the next one, so a batch grows with the load and a lone
    completion goes at once.  Each queued job gets its own verdict (204, 404 or 409), or
    the exception that failed its batch."""

    def __init__(self, client: AsyncJobfair) -> None:
        self.client = client
        self._queue: list[tuple[bytes, asyncio.Future[int]]] = []
        self._sender: asyncio.Task[None] | None = None

    def complete(self, job: Job, variables: dict[str, Any] | None) -> asyncio.Future[int]:
        """Queue ``job``'s completion (ValueError or TypeError, at once, when its variables
        cannot be sent as JSON); the future is its verdict."""
        item = completion_item(job, variables)
        verdict: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((item, verdict))
        if self._sender is None:
            # A task, not a call now: handlers finishing in this turn of the loop join in.
            self._sender = asyncio.create_task(self._send())
        return verdict

    async def flushed(self) -> None:
        if self._sender is not None:
            await asyncio.shield(self._sender)

    async def _send(self) -> None:
        try:
            while self._queue:
                await self._send_batch(self._take())
        finally:
            self._sender = None

    async def _send_batch(self, batch: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        try:
            verdicts = await self.client.send_completions([item for item, _ in batch])
        except InvalidArgument as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            # One job's values refused the whole batch (the server checks the whole body
            # first): each is sent again alone, so only the bad one is refused.
            for entry in batch:
                await self._send_batch([entry])
            return
        except Exception as exc:  # each job's finish fails as a single call would
            failure = (
                exc
                if isinstance(exc, JobfairError | httpx.HTTPError)
                else JobfairError(f"completing a batch failed: {exc!r}")
            )
            _fail(batch, failure)
            return
        for (_, verdict), status in zip(batch, verdicts, strict=True):
            if not verdict.done():
                verdict.set_result(status)

    def _take(self) -> list[tuple[bytes, asyncio.Future[int]]]:
        size, n = 0, 0
        for item, _ in self._queue:
            if n == BATCH_MAX_JOBS or (n and size + len(item) > BATCH_MAX_BYTES):
                break
            size += len(item) + 1
            n += 1
        batch, self._queue = self._queue[:n], self._queue[n:]
        return batch


def _fail(batch: list[tuple[bytes, asyncio.Future[int]]], exc: Exception) -> None:
    for _, verdict in batch:
        if not verdict.done():
            verdict.set_exception(exc)


class AsyncWorker:
    def __init__(
        self,
        client: AsyncJobfair,
        job_type: str,
        handler: AsyncHandler,
        *,
        concurrency: int = 4,
        mode: Literal["poll", "stream"] = "poll",
        timeout_ms: int = 60_000,
        request_timeout_ms: int | None = None,
        name: str | None = None,
        tenant_ids: Sequence[str] | None = None,
        fail_backoff: Backoff | None = None,
        heartbeat: bool = True,
        shutdown_grace_s: float = 30.0,
        batch_completion: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.job_type = job_type
        self.handler = handler
        self.concurrency = concurrency
        self.mode = mode
        self.timeout_ms = timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.name = name
        self.tenant_ids = tenant_ids
        self.fail_backoff = fail_backoff or Backoff(base_ms=1_000, factor=2, max_ms=300_000)
        self.heartbeat = heartbeat
        self.shutdown_grace_s = shutdown_grace_s
        self._completions = _Completions(client) if batch_completion else None
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._inflight: dict[asyncio.Task[None], Job] = {}  # from activation to verdict
        self._handling = 0  # of those, the ones whose handler is running
        self._in_handler: set[asyncio.Task[Any]] = set()

    def stop(self) -> None:
        """Stop activating; ``run()`` returns once in-flight jobs are finished or released."""
        self._stopping.set()
        self._slot_freed.set()

    async def run(self) -> None:
        feed = self._poll() if self.mode == "poll" else self._stream()
        feeder = asyncio.create_task(feed)
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({feeder, stopping}, return_when=asyncio.FIRST_COMPLETED)
            # An activation answered this instant carries jobs the server counts as
            # delivered: cutting the connection then would strand them until their lease
            # ends.  So a request in flight gets a moment to come back (its jobs are then
            # handled); one still waiting after that is cut, and the server releases what
            # it activates for us meanwhile.
            await asyncio.wait({feeder}, timeout=STOP_ABORT_DELAY_S)
        finally:
            feeder.cancel()
            stopping.cancel()
            try:
                await feeder
            except asyncio.CancelledError:
                pass
            except Exception:  # a bug, or an answer nobody foresaw: the jobs held first
                log.exception("the feeder of %s failed; draining", self.job_type)
            await self._drain()
            if self._completions is not None:
                await self._completions.flushed()

    # -- feeding -------------------------------------------------------------------------

    async def _poll(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            # A handler's slot is free once it returns: the next activation goes out while
            # its completion is on its way.  Jobs waiting for their verdicts are bounded
            # too, so a slow server slows the worker down instead of piling up its jobs.
            # (Two activations in flight, each for half the slots, drained a backlog
            # slower: 2,077-2,461 jobs/s against 2,626-3,249 in alternating runs.)
            free = min(
                self.concurrency - self._handling, 2 * self.concurrency - len(self._inflight)
            )
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            try:
                jobs = await self.client.activate(
                    self.job_type,
                    max_jobs=free,
                    timeout_ms=self.timeout_ms,
                    request_timeout_ms=self.request_timeout_ms,
                    worker=self.name,
                    tenant_ids=self.tenant_ids,
                )
                failures = 0
            except (JobfairError, httpx.HTTPError, *UNEXPECTED) as exc:
                failures += 1
                log.warning("activating %s failed (%r); backing off", self.job_type, exc)
                await asyncio.sleep(self.client.backoff.delay_s(min(failures, 8)))
                continue
            for job in jobs:
                self._start(job)

    async def _stream(self) -> None:
        failures = 0
        while True:
            try:
                async for job in self.client.stream(
                    self.job_type,
                    credit=self.concurrency,
                    timeout_ms=self.timeout_ms,
                    worker=self.name,
                    tenant_ids=self.tenant_ids,
                ):
                    failures = 0
                    self._start(job)
                    if self._stopping.is_set():
                        return
            except (JobfairError, httpx.HTTPError, *UNEXPECTED) as exc:
                log.warning("stream of %s broke (%r); reconnecting", self.job_type, exc)
            failures += 1
            await asyncio.sleep(self.client.backoff.delay_s(min(failures, 8)))

    def _start(self, job: Job) -> None:
        task = asyncio.create_task(self._handle(job))
        self._inflight[task] = job
        self._handling += 1
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
        self._slot_freed.set()

    # -- one job -------------------------------------------------------------------------

    async def _handle(self, job: Job) -> None:
        # In the span of the job's trace (jobfair_client.tracing; nothing without
        # OpenTelemetry): the handler, and the finish sent from it.
        with tracing.handling(job):
            await self._handle_in_span(job)

    async def _handle_in_span(self, job: Job) -> None:
        outcome = await self._run_handler(job)
        if isinstance(outcome, BusinessError):
            try:
                call = self.client.throw_error(
                    job, outcome.code, outcome.message, outcome.variables
                )
                thrown = await self._finish(job, call)
            except (TypeError, ValueError) as exc:  # its variables are not JSON
                outcome = ValueError(f"its BusinessError's variables cannot be sent ({exc})")
            else:
                if thrown:
                    self.stats.errors_thrown += 1
                return
        if not isinstance(outcome, Exception):
            if self._completions is None:
                if await self._finish(job, self.client.complete(job, outcome)):
                    self.stats.completed += 1
                return
            try:
                verdict = self._completions.complete(job, outcome)
            except (TypeError, ValueError) as exc:  # what the handler returned is not JSON
                outcome = ValueError(f"its result cannot be sent as JSON ({exc})")
            else:
                try:
                    if await self._finish(job, verdict, refused=InvalidArgument):
                        self.stats.completed += 1
                    return
                except InvalidArgument as exc:  # the server refused the result's values
                    outcome = ValueError(f"its result was refused: {exc.detail}")
        # The handler failed: retry later, one attempt fewer.
        backoff = self.fail_backoff.exact_ms(max(0, job.activation_count - 1))
        log.info("job %s failed: %r; retrying in %d ms", job.key, outcome, backoff)
        if await self._finish(
            job,
            self.client.fail(
                job,
                retries=max(0, job.retries - 1),
                error_message=f"{type(outcome).__name__}: {outcome}",
                retry_backoff_ms=backoff,
            ),
        ):
            self.stats.failed += 1

    async def _run_handler(self, job: Job) -> Result | Exception:
        """The handler's result, or what it raised; its slot is free when this returns."""
        task = asyncio.current_task()
        if task is not None:
            self._in_handler.add(task)
        beat: list[Any] = []
        if self.heartbeat:
            self._beat_later(job, beat)
        try:
            return await self.handler(job)
        except Exception as exc:  # a BusinessError raised is one returned
            return exc
        finally:
            for pending in beat:  # the timer, or the call extending the lease
                pending.cancel()
            if task is not None:
                self._in_handler.discard(task)
            self._handling -= 1
            self._slot_freed.set()

    async def _finish(
        self,
        job: Job,
        call: Awaitable[int | None],
        refused: type[Exception] | tuple[()] = (),
    ) -> bool:
        """Whether the finish was accepted; ``refused``: a failure to raise, not log."""
        try:
            status = await call
            if status is None or status == 204:
                return True
            # A batched completion's verdict: 409 (not this activation) or 404 (gone).
            self.stats.conflicts += 1
            log.warning("job %s: finishing refused (%s); dropped", job.key, status)
            return False
        except refused:
            raise
        except Conflict as exc:
            # Our activation is no longer current (lease expired, job reactivated or
            # finished elsewhere).  Retrying cannot help and must not be tried.
            self.stats.conflicts += 1
            log.warning("job %s: finishing refused (%s); dropped", job.key, exc.detail)
        except (JobfairError, httpx.HTTPError) as exc:
            log.error("job %s: finishing failed (%s); its lease will expire", job.key, exc)
        return False

    def _beat_later(self, job: Job, beat: list[Any]) -> None:
        """Extend ``job``'s lease in a third of its timeout, and again after that.
        ``beat`` holds what to cancel when the handler returns: a timer while waiting
        (cheaper than a sleeping task per job), then the extending call."""
        interval = max(0.05, self.timeout_ms / 3000)
        beat[:] = [asyncio.get_running_loop().call_later(interval, self._beat, job, beat)]

    def _beat(self, job: Job, beat: list[Any]) -> None:
        beat[:] = [asyncio.create_task(self._extend(job, beat))]

    async def _extend(self, job: Job, beat: list[Any]) -> None:
        try:
            await self.client.extend_lease(job, self.timeout_ms)
        except (Conflict, NotFound) as exc:
            log.warning("job %s: lease lost (%s)", job.key, exc.detail)
            return
        except (JobfairError, httpx.HTTPError, *UNEXPECTED) as exc:
            log.warning("job %s: heartbeat failed (%r)", job.key, exc)
        self._beat_later(job, beat)

    # -- shutdown ------------------------------------------------------------------------

    async def _drain(self) -> None:
        if not self._inflight:
            return
        _, late = await asyncio.wait(set(self._inflight), timeout=self.shutdown_grace_s)
        # Only a job whose handler still runs is given back: one whose handler returned
        # is being finished (its completion may be on its way), and releasing it too
        # could run it twice.  Those get their verdicts, a request's time at most.
        running = [t for t in late if t in self._in_handler]
        finishing = [t for t in late if t not in self._in_handler]
        for task in running:
            job = self._inflight.get(task)
            task.cancel()
            if job is not None:
                # Give the job back at once, without spending one of its retries.
                if await self._finish(
                    job,
                    self.client.fail(job, retries=job.retries, error_message="worker shut down"),
                ):
                    self.stats.released += 1
        if finishing:
            _, stuck = await asyncio.wait(finishing, timeout=FINISH_WAIT_S)
            for task in stuck:
                task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)


class Worker:
    """The blocking worker: handlers are plain functions run on ``concurrency`` threads;
    ``run()`` blocks until ``stop()`` (from any thread, or a signal handler)."""

    def __init__(
        self, client: Jobfair, job_type: str, handler: SyncHandler, **options: Any
    ) -> None:
        self.client = client
        self.job_type = job_type
        self.handler = handler
        self.options = options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: AsyncWorker | None = None
        self._ready = threading.Event()
        self._stop_requested = False

    @property
    def stats(self) -> WorkerStats:
        return self._worker.stats if self._worker else WorkerStats()

    def run(self) -> None:
        asyncio.run(self._main())

    def stop(self) -> None:
        self._stop_requested = True
        if self._ready.wait(timeout=60) and self._loop is not None and self._worker is not None:
            self._loop.call_soon_threadsafe(self._worker.stop)

    async def _main(self) -> None:
        concurrency = int(self.options.get("concurrency", 4))
        threads = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="jobfair-handler")
        loop = asyncio.get_running_loop()

        async def on_thread(job: Job) -> Result:
            # In this task's context: the handler sees the span the job runs in.
            run = functools.partial(contextvars.copy_context().run, self.handler, job)
            return await loop.run_in_executor(threads, run)

        async with AsyncJobfair(
            self.client.base_url,
            api_key=self.client.api_key,
            verify=self.client.verify,
            max_attempts=self.client.max_attempts,
            backoff=self.client.backoff,
        ) as jf:
            self._worker = AsyncWorker(jf, self.job_type, on_thread, **self.options)
            self._loop = loop
            self._ready.set()
            if self._stop_requested:
                self._worker.stop()
            try:
                await self._worker.run()
            finally:
                threads.shutdown(wait=False, cancel_futures=True)
