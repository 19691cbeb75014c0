"""The chaos load: producers, long-poll and stream workers spread over a list of servers,
and the ledger that says, after a fault, what became of every job.

Clients are given a list of server base URLs, as a client library configured with a
deployment's addresses is, and each starts on its own server of that list.  A connect
error, a 503 or a broken stream sends a client on to the next server of the list; it
keeps what it was doing (a producer its batch, a worker the jobs it holds) and sends the
same call again there.  Every call it repeats is safe to repeat: creations carry
idempotency keys, finishes are fenced by their ``activationCount``.

**The ledger** records every creation a server acknowledged (the job's key) and every
finish a server accepted (key, activation count, which server answered, when).  A finish
whose answer was lost (a transport error once the request may have been sent, or a 503
``outcome-unknown``) is sent again, to whichever server is next.  The second answer may
be a 409: the job is no longer ACTIVATED at that activation.  That 409 is

    **this activation's own finish** if the job ended COMPLETED *at that activation
    count* -- only the holder of an activation can finish the job at it, and the holder
    is this worker, so the lost attempt is the one that committed; otherwise it is
    **fenced** (the lease ended while the answer was lost, another activation took the
    job, and this worker's finish was rightly refused).

``verify`` applies that rule against the database and counts, per job, the accepted
finishes (204s plus the 409s it resolves as this activation's own): exactly one per job.
A 409 to a first attempt is a zombie's finish, always fenced.

**Caps.** Tenants and job types get ``maxActiveJobs``; a sampler reads, every 100 ms on a
connection of its own straight to PostgreSQL (past any proxy the scenario puts in front
of the servers' connections), the count of ACTIVATED jobs per tenant and per type in one
snapshot, and keeps the highest seen.  A sample above a cap is a violation.

The figures (``Figures``) are the row of docs/reliability.md's table: jobs, lost,
finished twice, cap violations, and the unavailability window -- the longest stretch
with no accepted finish while jobs remained unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
from jobfair_client.sse import SseReader

from tests.fixtures import ServerProcess

JOB_TYPES = ("chaos-a", "chaos-b")
# weight, maxActiveJobs (None: no cap of its own), share of the jobs.  The caps bind (the
# highest counts sampled reach them); the capped tenants get fewer of the jobs, so that
# they do not leave a long tail behind the others at their cap.
TENANTS: dict[str, tuple[int, int | None, int]] = {
    "acme": (1, 4, 1),
    "globex": (2, 6, 2),
    "initech": (3, None, 4),
    "umbrella": (1, 8, 2),
}
TYPE_CAPS: dict[str, int | None] = {"chaos-a": 12, "chaos-b": None}

# What every server of a chaos scenario is started with: a sweep fast enough that a lease
# lost with a server comes back within the scenario, a small pool (three servers share
# one PostgreSQL with the rest of the test session), keep-alives a stream can time out on.
SERVER_ENV = {
    "JOBFAIR_LEASE_SWEEP_INTERVAL_MS": "200",
    "JOBFAIR_DB_POOL_SIZE": "8",
    "JOBFAIR_DB_POOL_MIN_SIZE": "2",
    "JOBFAIR_KEEP_ALIVE_S": "1",
    "JOBFAIR_BACKUP_POLL_MS": "500",
}


@dataclass(frozen=True)
class Finish:
    """A finish a server answered 204, or a 409 to a retry after a lost answer (which
    ``verify`` resolves)."""

    job_key: str
    activation_count: int
    server: str
    status: int
    at: float  # time.monotonic()
    after_unknown: bool


@dataclass(frozen=True)
class Fenced:
    """A finish refused with 409: the worker's activation was over (its lease ended)."""

    job_key: str
    activation_count: int
    via: str  # "poll", "stream"; "retry" for a 409 after an unknown outcome not its own
    lease_left_s: float  # of the lease, as the worker received the job
    held_s: float  # from receiving the job to the 409


@dataclass(frozen=True)
class Stranded:
    """A job that sat ready and eligible (no cap, limit or pause holding it, the same
    activation count in every sample) for ``waited_s`` while workers of its type asked
    and were answered nothing ``empty_answers`` times."""

    job_key: str
    job_type: str
    activation_count: int
    waited_s: float
    empty_answers: int


@dataclass
class Figures:
    scenario: str
    jobs: int
    lost: int
    finished_twice: int
    cap_violations: int
    unavailability_s: float
    # Beside the table's figures: what the clients went through.
    accepted_finishes: int = 0
    fenced: int = 0  # 409s to zombies (their lease had ended)
    resolved_409: int = 0  # 409s to a retried finish that turned out to be its own
    client_moves: int = 0  # times a client went on to the next server
    answered_500: int = 0
    max_active: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    answered_by: dict[str, int] = field(default_factory=dict)  # accepted finishes per server
    fenced_jobs: list[Fenced] = field(default_factory=list)  # the zombies' 409s
    # The jobs counted lost: not COMPLETED, or COMPLETED with no finish the ledger saw
    # accepted (and rows nobody created).
    lost_keys: list[str] = field(default_factory=list)

    def row(self) -> str:
        """The scenario's row of docs/reliability.md's table."""
        return (
            f"| {self.scenario} | {self.jobs:,} | {self.lost} | {self.finished_twice} | "
            f"{self.cap_violations} | {self.unavailability_s:.2f} s |"
        )

    def details(self) -> str:
        caps = ", ".join(f"{k} {v}" for k, v in sorted(self.max_active.items()))
        return (
            f"fenced 409 {self.fenced}, resolved 409 {self.resolved_409}, client moves "
            f"{self.client_moves}, answered 500 {self.answered_500}, cap samples "
            f"{self.samples}, highest active [{caps}], finishes by server {self.answered_by}"
            + "".join(f"\n  {f}" for f in self.fenced_jobs[:10])
        )


class Servers:
    """The base URLs the clients know, in order.  A scenario may swap one for another
    (a replacement on a new port); the clients read the list at every call."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)

    def at(self, cursor: int) -> str:
        return self.urls[cursor % len(self.urls)]


class Unanswered(Exception):
    """A call that no server answered in time."""


@dataclass
class Client:
    """A client's place in the server list, moved on by every failure."""

    servers: Servers
    cursor: int
    load: LedgerLoad

    @property
    def url(self) -> str:
        return self.servers.at(self.cursor)

    def move(self) -> None:
        self.cursor += 1
        self.load.client_moves += 1
        self.load.trouble_at = time.monotonic()


@dataclass
class LedgerLoad:
    servers: Servers
    database_url: Callable[[], str]  # straight to PostgreSQL: the sampler and the verdict
    jobs: int = 1_000
    rate_per_s: float = 0  # creations a second over all producers; 0: as fast as they go
    producers: int = 3
    batch: int = 10
    poll_workers: int = 10
    stream_workers: int = 6
    # Per long poll; a stream's credit.  16 workers hold at most 32 jobs: more in flight
    # only queues on a busy 2-core machine, until leases end before their jobs are done.
    max_jobs: int = 2
    # Long enough for a job's round trips on a busy 2-core machine; a lease lost with a
    # server comes back after it.
    lease_ms: int = 5_000
    work_ms: tuple[int, int] = (0, 10)  # each job "takes" a random time in this range
    zombie_every: int = 0  # with n > 0, a worker drops every n-th job it gets (it "died")
    call_timeout_s: float = 60  # a call no server answers in this long fails the load
    # A client slow to take in its answers (a busy machine): each finish's answer is
    # recorded this long after it arrived.
    client_delay_s: float = 0
    # A progress line this often (pytest -s); 0: none.  CHAOS_PROGRESS_S sets it.
    progress_s: float = field(default_factory=lambda: float(os.environ.get("CHAOS_PROGRESS_S", 0)))

    created: dict[str, float] = field(default_factory=dict)  # key -> when acknowledged
    finishes: list[Finish] = field(default_factory=list)
    fenced: list[Fenced] = field(default_factory=list)
    dropped: list[tuple[str, int]] = field(default_factory=list)  # by zombie workers
    # Every activation a worker received: key -> [(activationCount, via, worker, when)].
    received: dict[str, list[tuple[int, str, str, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    client_moves: int = 0
    answered_500: int = 0
    max_active: Counter[str] = field(default_factory=Counter)
    cap_violations: int = 0
    samples: int = 0
    started_at: float = 0.0
    _issued: int = 0
    finishing: int = 0  # finish calls sent and not yet answered and recorded
    # A long poll answered with no job, after waiting its requestTimeout: (type, asked,
    # answered), time.monotonic().  The witnesses of a stranded job.
    empty_answers: list[tuple[str, float, float]] = field(default_factory=list)
    # A long poll answered with jobs: (answered, how long it took), time.monotonic().
    rounds: list[tuple[float, float]] = field(default_factory=list)
    # A job waits ready, with no cap, limit or pause holding it, at most this long while
    # workers of its type are answered nothing: a backup poll (0.5 s, SERVER_ENV) and a
    # round, plus twice the longest a long poll that got jobs took in the last 10 s --
    # what a round takes here and now, which on a loaded machine and a slow database is
    # seconds (a capped type's claims queue for its cap lock).  A job in a parked lane
    # waits for ever, however long rounds take.
    stranded_after_s: float = 5.0
    stranded: list[Stranded] = field(default_factory=list)
    # When a client last met a fault (a connect error, a 5xx, a broken stream): a fault
    # holds every job, so the watch counts waits from after it.
    trouble_at: float = 0.0
    stranded_diagnosis: str = ""
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition)
    _rng: random.Random = field(default_factory=lambda: random.Random(27))
    _clients: itertools.count[int] = field(default_factory=itertools.count)

    # -- calls ---------------------------------------------------------------------------

    def client(self) -> Client:
        """A new client, started on the next server of the list (spreading them)."""
        return Client(self.servers, next(self._clients), self)

    async def send(
        self, http: httpx.AsyncClient, who: Client, path: str, body: dict[str, Any]
    ) -> tuple[httpx.Response, str, bool]:
        """POST until a server answers other than 5xx: the answer, the server that gave
        it, and whether an earlier attempt's outcome is unknown (it may have been done)."""
        unknown = False
        deadline = time.monotonic() + self.call_timeout_s
        while time.monotonic() < deadline:
            url = who.url
            try:
                r = await http.post(url + path, json=body)
            except httpx.TransportError as exc:
                # Refused or never connected: not sent.  Anything later may have been.
                unknown |= not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                who.move()
                await asyncio.sleep(0.05)
                continue
            if r.status_code < 500:
                return r, url, unknown
            self.answered_500 += r.status_code == 500
            problem = _problem_type(r)
            unknown |= problem == "urn:jobfair:outcome-unknown"
            who.move()
            await asyncio.sleep(0.05 if r.status_code == 503 else 0.2)
        raise Unanswered(f"{path}: no server answered within {self.call_timeout_s} s")

    # -- producers -----------------------------------------------------------------------

    async def _producer(self, http: httpx.AsyncClient, i: int) -> None:
        who = self.client()
        tenants = [t for t, (_, _, share) in TENANTS.items() for _ in range(share)]
        while self._issued < self.jobs:
            if self.rate_per_s:  # paced: the load spans a scenario's faults
                ahead_s = self._issued / self.rate_per_s - (time.monotonic() - self.started_at)
                await asyncio.sleep(max(0.0, ahead_s))
                if self._issued >= self.jobs:
                    break
            first = self._issued
            n = min(self.batch, self.jobs - first)
            self._issued += n
            jobs = [
                {
                    "type": JOB_TYPES[k % len(JOB_TYPES)],
                    "tenantId": tenants[k % len(tenants)],
                    "priority": self._rng.randrange(0, 101),
                    "idempotencyKey": f"job-{k}",
                    "variables": {"k": k},
                }
                for k in range(first, first + n)
            ]
            r, _, _ = await self.send(http, who, "/v2/jobs/batch", {"jobs": jobs})
            assert r.status_code == 201, r.text
            now = time.monotonic()
            for key in r.json()["jobKeys"]:
                self.created.setdefault(key, now)
            async with self._progress:
                self._progress.notify_all()

    async def until(self, done: Callable[[], bool], timeout_s: float = 60) -> None:
        """Until ``done()`` holds, checked at each acknowledged creation and accepted
        finish."""
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(done), timeout_s)

    async def until_created(self, n: int, timeout_s: float = 60) -> None:
        """Until ``n`` creations (at most all of them) have been acknowledged."""
        n = min(n, self.jobs)
        await self.until(lambda: len(self.created) >= n, timeout_s)

    async def until_finished(self, n: int, timeout_s: float = 60) -> None:
        """Until ``n`` finishes have been accepted."""
        await self.until(lambda: len(self.finishes) >= n, timeout_s)

    # -- workers -------------------------------------------------------------------------

    async def finish(
        self, http: httpx.AsyncClient, who: Client, job: dict[str, Any], via: str
    ) -> None:
        """Work on ``job``, then complete it, holding it across any server's death."""
        received = time.monotonic()
        lease_left_s = (_instant(job["deadline"]) - datetime.now(UTC)).total_seconds()
        low, high = self.work_ms
        await asyncio.sleep(self._rng.uniform(low, high) / 1000)
        key, count = job["jobKey"], job["activationCount"]
        body = {"activationCount": count}
        self.finishing += 1
        try:
            r, url, unknown = await self.send(http, who, f"/v2/jobs/{key}/complete", body)
            if self.client_delay_s:
                await asyncio.sleep(self.client_delay_s)
            if r.status_code == 204 or (r.status_code == 409 and unknown):
                self.finishes.append(
                    Finish(key, count, url, r.status_code, time.monotonic(), unknown)
                )
            elif r.status_code == 409:
                held_s = time.monotonic() - received
                self.fenced.append(Fenced(key, count, via, lease_left_s, held_s))
            else:
                raise AssertionError(f"complete {key}@{count}: {r.status_code} {r.text}")
        finally:
            self.finishing -= 1
            async with self._progress:
                self._progress.notify_all()

    async def _poll_worker(self, http: httpx.AsyncClient, i: int) -> None:
        who = self.client()
        job_type = JOB_TYPES[i % len(JOB_TYPES)]
        body = {
            "type": job_type,
            "maxJobs": self.max_jobs,
            "timeout": self.lease_ms,
            "requestTimeout": 1_000,
            "worker": f"poll-{i}",
        }
        got = 0
        while True:
            asked = time.monotonic()
            r, _, _ = await self.send(http, who, "/v2/jobs/activate", body)
            assert r.status_code == 200, r.text
            answered = time.monotonic()
            if r.json()["jobs"]:
                self.rounds.append((answered, answered - asked))
            else:
                self.empty_answers.append((job_type, asked, answered))
            jobs = []
            for job in r.json()["jobs"]:
                got += 1
                self._received(job, "poll", f"poll-{i}")
                if self.zombie_every and got % self.zombie_every == 0:
                    self.dropped.append((job["jobKey"], job["activationCount"]))
                else:
                    jobs.append(job)
            await asyncio.gather(*(self.finish(http, who, job, "poll") for job in jobs))

    async def _stream_worker(self, http: httpx.AsyncClient, i: int) -> None:
        who = self.client()
        params: dict[str, str | int] = {
            "type": JOB_TYPES[i % len(JOB_TYPES)],
            "maxJobs": self.max_jobs,
            "timeout": self.lease_ms,
            "worker": f"stream-{i}",
        }
        # Keep-alives come every second (SERVER_ENV): a silent stream is a dead server.
        timeout = httpx.Timeout(5.0, connect=2.0)
        # Each job is worked on as it arrives, as a client's handlers are, beside the
        # stream (at most its credit at once); they outlive a broken stream.
        working: set[asyncio.Task[None]] = set()
        got = 0
        try:
            while True:
                url = who.url
                try:
                    async with http.stream(
                        "GET", url + "/v2/jobs/stream", params=params, timeout=timeout
                    ) as r:
                        if r.status_code != 200:
                            await r.aread()
                            assert r.status_code == 503, (r.status_code, r.text)
                            who.move()
                            await asyncio.sleep(0.05)
                            continue
                        reader = SseReader()
                        async for chunk in r.aiter_raw():
                            for event, data in reader.feed(chunk):
                                if event == "job":
                                    job = json.loads(data)
                                    got += 1
                                    self._received(job, "stream", str(params["worker"]))
                                    if self.zombie_every and got % self.zombie_every == 0:
                                        self.dropped.append((job["jobKey"], job["activationCount"]))
                                        continue
                                    working.add(
                                        asyncio.create_task(self.finish(http, who, job, "stream"))
                                    )
                            done = {t for t in working if t.done()}
                            working -= done
                            _raise_failures(list(done))
                            # A finish moved ``who`` on: the stream is left for a new one
                            # on the server the finish found.
                            if who.url != url:
                                break
                except httpx.TransportError:
                    if who.url == url:
                        who.move()
                    await asyncio.sleep(0.05)
        finally:
            for t in working:
                t.cancel()
            await asyncio.gather(*working, return_exceptions=True)

    def _received(self, job: dict[str, Any], via: str, worker: str) -> None:
        self.received[job["jobKey"]].append(
            (job["activationCount"], via, worker, time.monotonic() - self.started_at)
        )

    # -- caps ----------------------------------------------------------------------------

    async def _sampler(self) -> None:
        caps = {f"tenant {t}": cap for t, (_, cap, _) in TENANTS.items() if cap is not None}
        caps |= {f"type {t}": cap for t, cap in TYPE_CAPS.items() if cap is not None}
        async with _Reader(self.database_url) as reader:
            while True:
                rows = await reader.fetch(ACTIVE_COUNTS, list(JOB_TYPES))
                if rows is None:  # the database away (a scenario's fault): no sample
                    await asyncio.sleep(0.1)
                    continue
                self.samples += 1
                for name, active in rows:
                    self.max_active[name] = max(self.max_active[name], active)
                    cap = caps.get(name)
                    self.cap_violations += cap is not None and active > cap
                await asyncio.sleep(0.1)

    # -- liveness ------------------------------------------------------------------------

    async def _watch(self) -> None:
        """The liveness invariant, sampled: no job waits ready longer than
        ``stranded_after_s`` and twice a recent round while no cap, limit or pause holds
        it and workers of its type ask for jobs and get none.  Every 0.5 s, on a
        connection of its own straight to PostgreSQL, it reads the eligible jobs in one
        snapshot; a job eligible in every sample since ``since`` at one activation count,
        with at least three empty answers to long polls of its type asked and answered
        since then, is stranded: recorded once, with the diagnosis as it stood.  A sample
        that fails (the database away), or a fault a client met (a connect error, a 5xx,
        a broken stream), starts every wait afresh: an outage holds every job."""
        since: dict[str, tuple[float, int, str]] = {}
        reported: set[tuple[str, int]] = set()
        async with _Reader(self.database_url) as reader:
            while True:
                await asyncio.sleep(0.5)
                rows = await reader.fetch(ELIGIBLE, list(JOB_TYPES))
                if rows is None:
                    since = {}
                    continue
                now = time.monotonic()
                recent = [took for at, took in self.rounds[-1000:] if at > now - 10]
                bound = self.stranded_after_s + 2 * max(recent, default=0.0)
                seen = {r["job_key"]: (r["activation_count"], r["job_type"]) for r in rows}
                since = {
                    key: since[key]
                    if key in since and since[key][1] == count
                    else (now, count, job_type)
                    for key, (count, job_type) in seen.items()
                }
                for key, (seen_at, count, job_type) in since.items():
                    start = max(seen_at, self.trouble_at)
                    if now - start < bound or (key, count) in reported:
                        continue
                    empties = sum(
                        1
                        for t, asked, answered in self.empty_answers
                        if t == job_type and asked >= start and answered <= now
                    )
                    if empties >= 3:
                        reported.add((key, count))
                        # The diagnosis first: the drain stops once one is stranded.
                        if not self.stranded_diagnosis:
                            self.stranded_diagnosis = await self.diagnosis([key])
                        self.stranded.append(Stranded(key, job_type, count, now - start, empties))

    # -- the run -------------------------------------------------------------------------

    async def configure(self, http: httpx.AsyncClient) -> None:
        who = self.client()
        for tenant, (weight, cap, _) in TENANTS.items():
            r = await http.put(
                f"{who.url}/v2/tenants/{tenant}", json={"weight": weight, "maxActiveJobs": cap}
            )
            assert r.status_code == 200, r.text
        for job_type, cap in TYPE_CAPS.items():
            r = await http.put(f"{who.url}/v2/job-types/{job_type}", json={"maxActiveJobs": cap})
            assert r.status_code == 200, r.text

    async def run(
        self,
        fault: Callable[[LedgerLoad], Coroutine[Any, Any, None]] | None = None,
        *,
        drain_s: float = 60,
    ) -> None:
        """Configure the caps, start the sampler, the producers and the workers, and
        ``fault`` beside them; once every job is created and ``fault`` has returned, wait
        until every created job is COMPLETED, then stop.  The wait gives up once
        ``drain_s`` pass without one more job completed: a load of 50,000 jobs drains
        for minutes after its last creation, and is stuck only when it stops moving."""
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), limits=limits) as http:
            await self.configure(http)
            self.started_at = time.monotonic()
            background = [asyncio.create_task(self._sampler()), asyncio.create_task(self._watch())]
            background += [
                asyncio.create_task(self._poll_worker(http, i)) for i in range(self.poll_workers)
            ]
            background += [
                asyncio.create_task(self._stream_worker(http, i))
                for i in range(self.stream_workers)
            ]
            foreground = [
                asyncio.create_task(self._producer(http, i)) for i in range(self.producers)
            ]
            if fault is not None:
                foreground.append(asyncio.create_task(fault(self)))
            if self.progress_s:
                background.append(asyncio.create_task(self._progress_lines()))
            everything = [*background, *foreground]
            try:
                await _gather_failing_fast(foreground, background)
                deadline = time.monotonic() + drain_s
                completed = 0
                while (now_completed := await self._completed()) < len(self.created):
                    _raise_failures(everything)
                    if now_completed > completed:
                        completed, deadline = now_completed, time.monotonic() + drain_s
                    if time.monotonic() > deadline:
                        break
                    if self.stranded:
                        break  # the invariant failed: verify says so, with the diagnosis
                    await asyncio.sleep(0.2)
                # The database may show a job COMPLETED before its worker has the answer
                # (on a busy machine, for a while): finishes still in flight are waited
                # for, or the ledger would miss the last accepted finishes.
                with contextlib.suppress(TimeoutError):  # verify tells what is missing
                    await self.until(lambda: self.finishing == 0, self.call_timeout_s + 10)
                _raise_failures(everything)
            finally:
                for t in everything:
                    t.cancel()
                await asyncio.gather(*everything, return_exceptions=True)

    async def _progress_lines(self) -> None:
        """A line every ``progress_s`` (with ``pytest -s``): how the load goes."""
        while True:
            await asyncio.sleep(self.progress_s)
            print(
                f"{time.monotonic() - self.started_at:6.1f} s: created {len(self.created)}, "
                f"finished {len(self.finishes)}, fenced {len(self.fenced)}, "
                f"moves {self.client_moves}, 500s {self.answered_500}",
                flush=True,
            )

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.database_url())
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    async def _completed(self) -> int:
        rows = await self._fetch(COMPLETED_COUNT, list(JOB_TYPES))
        return int(rows[0][0])

    # -- the verdict ---------------------------------------------------------------------

    async def figures(self, scenario: str) -> Figures:
        """The ledger against the database (the 409 rule of the module's docstring)."""
        rows = await self._fetch(JOB_OUTCOMES, list(JOB_TYPES))
        state = {r["job_key"]: (r["state"], r["activation_count"]) for r in rows}
        completions = {r["job_key"]: r["completions"] for r in rows}
        accepted: dict[str, list[Finish]] = defaultdict(list)
        resolved = unresolved = 0
        for f in self.finishes:
            if f.status == 204:
                accepted[f.job_key].append(f)
            elif state.get(f.job_key) == ("COMPLETED", f.activation_count):
                accepted[f.job_key].append(f)
                resolved += 1
            else:
                unresolved += 1
        lost_keys = [
            key
            for key in self.created
            if state.get(key, ("gone",))[0] != "COMPLETED" or not accepted.get(key)
        ]
        lost = len(lost_keys)
        twice = sum(
            1
            for key in set(accepted) | set(completions)
            if len(accepted.get(key, ())) > 1 or completions.get(key, 0) > 1
        )
        # A 204 at one activation for a job that ended at another: finished, then
        # activated again -- as bad as finishing twice.
        twice += sum(
            1
            for key, fs in accepted.items()
            if len(fs) == 1 and state.get(key, ("", -1))[1] != fs[0].activation_count
        )
        answered_by = Counter(f.server for fs in accepted.values() for f in fs)
        return Figures(
            scenario=scenario,
            jobs=len(self.created),
            lost=lost + len(set(state) - set(self.created)),  # a row nobody asked for counts
            finished_twice=twice,
            cap_violations=self.cap_violations,
            unavailability_s=self.unavailability_s(accepted),
            accepted_finishes=sum(len(fs) for fs in accepted.values()),
            fenced=len(self.fenced) + unresolved,
            fenced_jobs=list(self.fenced),
            resolved_409=resolved,
            client_moves=self.client_moves,
            answered_500=self.answered_500,
            max_active=dict(self.max_active),
            samples=self.samples,
            answered_by=dict(answered_by),
            lost_keys=lost_keys + sorted(set(state) - set(self.created)),
        )

    def unavailability_s(self, accepted: dict[str, list[Finish]]) -> float:
        """The longest time with jobs created and unfinished and no finish accepted."""
        events = sorted(
            [(at, 1) for at in self.created.values()]
            + [(f.at, -1) for fs in accepted.values() for f in fs]
        )
        outstanding, since, longest = 0, None, 0.0
        for at, delta in events:
            outstanding += delta
            if delta < 0 and since is not None:
                longest = max(longest, at - since)
            # A wait starts at a finish that leaves work behind, or at work arriving
            # when there was none.
            since = at if outstanding > 0 and (delta < 0 or since is None) else since
            if outstanding <= 0:
                since = None
        return longest

    async def diagnosis(self, keys: Sequence[str] = (), limit: int = 20) -> str:
        """What a failure needs to be understood, read straight from the database: the
        jobs ``keys`` and every unfinished job of the load (up to ``limit`` in all) with
        its state, activation count, deadline and history, its lane's and key's state,
        what the ledger saw of it; every tenant's and type's settings and active counts;
        who leads, and the sessions with a transaction open."""
        conn = await asyncpg.connect(self.database_url())
        try:
            now = await conn.fetchval("SELECT now()")
            jobs = await conn.fetch(
                UNFINISHED, list(JOB_TYPES), [int(k) for k in keys[:limit]], limit
            )
            lines = [f"diagnosis at {now} (load at {time.monotonic() - self.started_at:.1f} s):"]
            lines.append(f"  jobs named or unfinished: {len(jobs)} shown (of at most {limit})")
            for j in jobs:
                key = j["job_key"]
                lines.append(
                    f"  job {key} {j['job_type']}/{j['tenant_id']}/{j['fairness_key']!r}: "
                    f"{j['state']} #{j['activation_count']} deadline {j['deadline']} "
                    f"run_at {j['run_at']} queued_at {j['queued_at']} worker {j['worker']} "
                    f"priority {j['priority']}"
                )
                for e in await conn.fetch(EVENTS_OF, int(key)):
                    lines.append(
                        f"    event #{e['activation_count']} {e['event']} at {e['at']} "
                        f"(started {e['started_at']}, worker {e['worker']}, "
                        f"deadline {e['deadline']})"
                    )
                lane = await conn.fetchrow(LANE_OF, j["job_type"], j["tenant_id"])
                lines.append(f"    lane: {dict(lane) if lane else None}")
                lkey = await conn.fetchrow(KEY_OF, j["job_type"], j["tenant_id"], j["fairness_key"])
                lines.append(f"    key: {dict(lkey) if lkey else None}")
                lines.append(f"    ledger: received {self.received.get(key, [])}")
                lines.append(
                    "    ledger: finishes "
                    f"{[f for f in self.finishes if f.job_key == key]}, fenced "
                    f"{[f for f in self.fenced if f.job_key == key]}, dropped "
                    f"{[d for d in self.dropped if d[0] == key]}"
                )
            for r in await conn.fetch(CONFIG_AND_COUNTS, list(JOB_TYPES)):
                lines.append(f"  {r['what']}: {r['detail']}")
            for r in await conn.fetch(SESSIONS):
                lines.append(f"  session: {dict(r)}")
            return "\n".join(lines)
        finally:
            await conn.close()

    async def verify(self, scenario: str) -> Figures:
        """Every created job COMPLETED exactly once by an accepted finish, none left
        ACTIVATED, as many accepted finishes as jobs, caps held in every sample, no 500:
        asserted; the figures returned (and printed: ``pytest -s``).  On a failure the
        assertion carries ``diagnosis()``."""
        figures = await self.figures(scenario)
        print(figures.row())
        print(figures.details())
        assert not self.stranded, (
            f"stranded: {self.stranded} (after {self.stranded_after_s} s and two rounds)\n"
            f"{self.stranded_diagnosis}"
        )
        activated = await self._fetch(ACTIVATED_LEFT, list(JOB_TYPES))
        if figures.lost or activated[0][0] or figures.accepted_finishes != figures.jobs:
            diagnosis = await self.diagnosis(figures.lost_keys)
            print(diagnosis)
            raise AssertionError(f"{figures}\n{diagnosis}")
        assert figures.jobs == self.jobs, figures
        assert figures.lost == 0, figures
        assert figures.finished_twice == 0, figures
        assert activated[0][0] == 0, f"{activated[0][0]} jobs left ACTIVATED"
        assert figures.accepted_finishes == figures.jobs, figures
        assert figures.cap_violations == 0, figures
        assert figures.samples > 0, figures
        assert figures.answered_500 == 0, figures
        return figures


# -- SQL (a test's reading of the outcome, not the server's queries) --------------------

# Per tenant and per type, in one snapshot: the sampler's reading against the caps.
ACTIVE_COUNTS = """
SELECT 'tenant ' || tenant_id AS name, count(*)::int FROM jobs
 WHERE state = 'ACTIVATED' GROUP BY tenant_id
UNION ALL
SELECT 'type ' || job_type, count(*)::int FROM jobs
 WHERE state = 'ACTIVATED' AND job_type = ANY($1) GROUP BY job_type
"""
COMPLETED_COUNT = "SELECT count(*) FROM jobs WHERE job_type = ANY($1) AND state = 'COMPLETED'"
ACTIVATED_LEFT = "SELECT count(*) FROM jobs WHERE job_type = ANY($1) AND state = 'ACTIVATED'"
# Each job's end, and how many completions its history holds (one row per completed
# activation: more than one is a job finished twice).
JOB_OUTCOMES = """
SELECT j.job_key::text AS job_key, j.state, j.activation_count,
       (SELECT count(*) FROM job_events e
         WHERE e.job_key = j.job_key AND e.shard = j.shard AND e.event = 'completed')::int
         AS completions
  FROM jobs j WHERE j.job_type = ANY($1)
"""


# The diagnosis's readings (LedgerLoad.diagnosis).
UNFINISHED = """
SELECT job_key::text AS job_key, job_type, tenant_id, fairness_key, state, activation_count,
       deadline, run_at, queued_at, worker, priority
  FROM jobs WHERE job_type = ANY($1) AND (state <> 'COMPLETED' OR job_key = ANY($2::bigint[]))
 ORDER BY job_key = ANY($2::bigint[]) DESC, job_key LIMIT $3
"""
EVENTS_OF = """
SELECT activation_count, step, event, at, started_at, worker, deadline FROM job_events
 WHERE job_key = $1 ORDER BY activation_count, step
"""
LANE_OF = """
SELECT vtime, active, held, activated_total,
       (SELECT count(*) FROM jobs j WHERE j.job_type = l.job_type
           AND j.tenant_id = l.tenant_id AND j.state = 'CREATED') AS created
  FROM lanes l WHERE job_type = $1 AND tenant_id = $2
"""
KEY_OF = """
SELECT vtime, active, activated_total FROM lane_keys
 WHERE job_type = $1 AND tenant_id = $2 AND fairness_key = $3
"""
CONFIG_AND_COUNTS = """
SELECT 'tenant ' || t.tenant_id AS what,
       format('weight %s cap %s paused %s rate %s active %s', t.weight, t.max_active_jobs,
              t.paused, t.rate_per_s,
              (SELECT count(*) FROM jobs j WHERE j.tenant_id = t.tenant_id
                  AND j.state = 'ACTIVATED')) AS detail
  FROM tenants t
UNION ALL
SELECT 'type ' || y.job_type,
       format('cap %s paused %s rate %s active %s', y.max_active_jobs, y.paused, y.rate_per_s,
              (SELECT count(*) FROM jobs j WHERE j.job_type = y.job_type
                  AND j.state = 'ACTIVATED'))
  FROM job_types y WHERE y.job_type = ANY($1)
"""
# The jobs of the load that are ready and eligible now, in one snapshot: CREATED and
# due, their tenant and type not paused nor rate-limited, under their tenant's cap (its
# ACTIVATED jobs of every type) and their type's (the liveness watch, _watch).
ELIGIBLE = """
WITH tenant_active AS (
    SELECT tenant_id, count(*) AS n FROM jobs WHERE state = 'ACTIVATED' GROUP BY tenant_id
), type_active AS (
    SELECT job_type, count(*) AS n FROM jobs WHERE state = 'ACTIVATED' GROUP BY job_type
)
SELECT j.job_key::text AS job_key, j.job_type, j.activation_count
  FROM jobs j
  LEFT JOIN tenants t ON t.tenant_id = j.tenant_id
  LEFT JOIN job_types y ON y.job_type = j.job_type
  LEFT JOIN tenant_active ta ON ta.tenant_id = j.tenant_id
  LEFT JOIN type_active ya ON ya.job_type = j.job_type
 WHERE j.job_type = ANY($1) AND j.state = 'CREATED' AND j.run_at <= now()
   AND t.paused IS NOT TRUE AND y.paused IS NOT TRUE
   AND t.rate_per_s IS NULL AND y.rate_per_s IS NULL
   AND (t.max_active_jobs IS NULL OR t.max_active_jobs > COALESCE(ta.n, 0))
   AND (y.max_active_jobs IS NULL OR y.max_active_jobs > COALESCE(ya.n, 0))
"""
# Who leads (the leader lock's holder) and every session with a transaction open.
SESSIONS = """
SELECT a.pid, a.application_name, a.client_port, a.state, a.xact_start, a.wait_event_type,
       a.wait_event, left(a.query, 160) AS query,
       EXISTS (SELECT 1 FROM pg_locks k WHERE k.pid = a.pid AND k.locktype = 'advisory'
               AND k.granted AND k.objsubid = 1) AS leads
  FROM pg_stat_activity a
 WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
   AND (a.xact_start IS NOT NULL
        OR EXISTS (SELECT 1 FROM pg_locks k WHERE k.pid = a.pid AND k.locktype = 'advisory'
                   AND k.granted AND k.objsubid = 1))
"""


class _Reader:
    """A connection of the ledger's own straight to PostgreSQL (past any proxy in front
    of the servers), for its samples: ``fetch`` answers None while the database is away
    (a scenario's fault), and the connection, in whatever state a cut left it, is
    replaced at the next."""

    def __init__(self, database_url: Callable[[], str]) -> None:
        self.database_url = database_url
        self.conn: asyncpg.Connection | None = None

    async def __aenter__(self) -> _Reader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.conn is not None:
            self.conn.terminate()

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record] | None:
        try:
            if self.conn is None or self.conn.is_closed():
                self.conn = await asyncpg.connect(self.database_url(), timeout=2)
            return list(await self.conn.fetch(sql, *args, timeout=2))
        except (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.InternalClientError,  # "another operation is in progress"
            TimeoutError,
        ):
            if self.conn is not None:
                self.conn.terminate()
            self.conn = None
            return None


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _problem_type(r: httpx.Response) -> str | None:
    with contextlib.suppress(ValueError):
        body = r.json()
        if isinstance(body, dict):
            return body.get("type")
    return None


async def _gather_failing_fast(
    foreground: list[asyncio.Task[None]], background: list[asyncio.Task[None]]
) -> None:
    """Until every foreground task is done; the first failure of any task is raised."""
    pending = set(foreground)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=0.2)
        _raise_failures([*foreground, *background])


def _raise_failures(tasks: Sequence[asyncio.Task[None]]) -> None:
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


# -- servers -----------------------------------------------------------------------------


async def until_ready(server: ServerProcess, timeout_s: float = 60) -> None:
    """Polls the process's /readyz (another process: no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            assert server.proc.poll() is None, server.log.read_text()
            with contextlib.suppress(httpx.TransportError):
                if (await http.get(server.url + "/readyz")).status_code == 200:
                    return
            assert time.monotonic() < deadline, f"{server.url} not ready in {timeout_s} s"
            await asyncio.sleep(0.1)


async def start_servers(
    spawn: Callable[..., ServerProcess], n: int, *args: str, **env: str
) -> list[ServerProcess]:
    """``n`` ``jobfair serve`` processes (SERVER_ENV, then ``env``), once all are ready."""
    servers = [spawn(*args, **{**SERVER_ENV, **env}) for _ in range(n)]
    await asyncio.gather(*(until_ready(s) for s in servers))
    return servers


# What a process logs as it takes the lead of the background work, and as it loses it
# (app.sweepers): the leader is the live process whose last such line is the first.
LEADS = "this process leads the background work"
LEFT = ("this process no longer leads", "leader connection lost")


def leads(server: ServerProcess) -> bool:
    """Whether the process is alive and its log says, last, that it leads."""
    if server.proc.poll() is not None:
        return False
    last = False
    for line in server.log.read_text(errors="replace").splitlines():
        if LEADS in line:
            last = True
        elif any(left in line for left in LEFT):
            last = False
    return last


async def until_leader(servers: Sequence[ServerProcess], timeout_s: float = 30) -> ServerProcess:
    """The one process that leads, once exactly one does.  (Two may say so for up to a
    pass of the leadership loop, 2 s: a leader that lost its session and has not
    noticed yet.  The logs are other processes': polled.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = [s for s in servers if leads(s)]
        if len(leaders) == 1:
            return leaders[0]
        assert time.monotonic() < deadline, f"{len(leaders)} leaders for {timeout_s} s"
        await asyncio.sleep(0.1)
