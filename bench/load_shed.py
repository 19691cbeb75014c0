"""Load held and shed (issue 27, section 3): what a server holds, what it refuses, and how
it comes back.

* ``held``: idle long polls and SSE streams opened in steps (0, 1,000, 10,000), the server
  processes' RSS and open descriptors read at each; then jobs for some of them, and the
  rest answered ``{"jobs": []}`` at their ``requestTimeout``.
* ``shed``: more long polls and streams than ``JOBFAIR_MAX_WAITERS`` allows: the excess
  answered 503 with ``Retry-After`` before a stream opens, none reset, none 500.
* ``overload``: the capacity of a mix of creates, activations and completes measured
  first (a short closed loop); then that mix offered at ten times it, open-loop (each
  job's calls start on schedule whatever the server is doing), then at half of it again:
  every call's status and latency, and how soon after the overload latency is normal.

Each takes a running server (its base URL and the pid of its process tree) and returns
its figures; tests/chaos/test_load_shed.py asserts on them, ``python -m bench.load_shed``
prints them for docs/reliability-load.md.  Every call is on a raw asyncio connection
(bench.wire, or one connection per call): the client must not be the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import psutil

from bench.harness import (
    ROOT,
    Postgres,
    machine_speed,
    percentile,
    server,
    server_pid,
    speed_line,
    table,
)
from bench.wire import Connection

RESULTS = ROOT / "bench" / "results"

POLL_TYPE = "held-poll"
STREAM_TYPE = "held-stream"


def raise_descriptor_limit(at_least: int) -> bool:
    """This process's soft RLIMIT_NOFILE up to its hard limit; whether that reaches
    ``at_least`` (every call here is one descriptor)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = hard if hard != resource.RLIM_INFINITY else max(soft, at_least)
    if soft < limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    return limit >= at_least


# -- the server's processes -------------------------------------------------------------


@dataclass
class Usage:
    """A server's process tree at one moment (the supervisor, its server processes and
    multiprocessing's resource tracker): resident memory and open descriptors."""

    rss_mb: float
    fds: int
    per_process: list[tuple[float, int]]  # (MB, descriptors) of each, largest first


def usage(pid: int) -> Usage:
    root = psutil.Process(pid)
    rows = []
    for p in [root, *root.children(recursive=True)]:
        try:
            rows.append((p.memory_info().rss / 2**20, p.num_fds()))
        except psutil.NoSuchProcess:
            continue
    rows.sort(reverse=True)
    return Usage(sum(r for r, _ in rows), sum(f for _, f in rows), rows)


async def waiters(client: httpx.AsyncClient) -> tuple[int, int]:
    """``jobfair_waiters`` and ``jobfair_streams``, summed over the server's processes
    (each copies its own into /metrics every second)."""
    text = (await client.get("/metrics")).text
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("jobfair_waiters", "jobfair_streams"):
            found[name] = int(float(value))
    return found["jobfair_waiters"], found["jobfair_streams"]


async def until_waiters(client: httpx.AsyncClient, n: int, timeout_s: float) -> float:
    """Seconds until the server reports ``n`` waiters; TimeoutError after ``timeout_s``."""
    t0 = time.perf_counter()
    seen = (0, 0)
    try:
        async with asyncio.timeout(timeout_s):
            while (seen := await waiters(client))[0] != n:  # noqa: ASYNC110 - a gauge
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise TimeoutError(f"{seen[0]} waiters ({seen[1]} streams), not {n}") from None
    return time.perf_counter() - t0


# -- one call per connection ------------------------------------------------------------


@dataclass
class Answer:
    status: int  # 0: the connection was closed (or reset) without an answer
    headers: dict[str, str]
    body: bytes
    seconds: float  # from the connection's opening to the answer's end


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(" ", 2)[1]), headers


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


class Caller:
    """Calls on connections of their own to ``base``, at most ``opening`` being opened at
    once: a connect storm past the listen backlog is retried by the kernel a second
    later, which would be the client's delay, not the server's."""

    def __init__(self, base: str, opening: int = 200) -> None:
        u = urlsplit(base)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.gate = asyncio.Semaphore(opening)

    def _request(self, method: str, path: str, body: object) -> bytes:
        payload = b"" if body is None else orjson.dumps(body)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        return head.encode() + payload

    async def _open(
        self, method: str, path: str, body: object | Callable[[], object]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with self.gate:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(self._request(method, path, body() if callable(body) else body))
            await writer.drain()
        return reader, writer

    async def call(self, method: str, path: str, body: object | Callable[[], object]) -> Answer:
        """One call on a connection of its own, read to its end.  ``body`` may be a
        function, called once the connection is open (a timeout counted from then)."""
        started = time.perf_counter()
        try:
            reader, writer = await self._open(method, path, body)
        except OSError:
            return Answer(0, {}, b"", time.perf_counter() - started)
        try:
            raw = await reader.read()
        except ConnectionError:
            raw = b""
        finally:
            writer.close()
        head, _, rest = raw.partition(b"\r\n\r\n")
        seconds = time.perf_counter() - started
        if not head:
            return Answer(0, {}, b"", seconds)
        status, headers = _head(head)
        if headers.get("transfer-encoding") == "chunked":
            rest = _dechunk(rest)
        return Answer(status, headers, rest, seconds)

    async def stream(self, path: str) -> Stream:
        """A GET of an SSE stream, its head read; a refusal read to its end."""
        started = time.perf_counter()
        try:
            reader, writer = await self._open("GET", path, None)
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError):
            return Stream(0, {}, None, None, time.perf_counter() - started)
        status, headers = _head(head[:-4])
        s = Stream(status, headers, reader, writer)
        if status != 200:
            rest = await reader.read()
            s.rest = _dechunk(rest) if headers.get("transfer-encoding") == "chunked" else rest
            writer.close()
        s.seconds = time.perf_counter() - started
        return s


@dataclass
class Stream:
    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader | None
    writer: asyncio.StreamWriter | None
    seconds: float = 0.0  # to the head (a refusal: to its end)
    rest: bytes = b""  # a refusal's body
    jobs: list[dict[str, Any]] = field(default_factory=list)

    async def next_job(self) -> dict[str, Any] | None:
        """The next ``event: job``'s data, or None if the stream ends first (keep-alive
        comments and chunk sizes are passed over: each event is one chunk)."""
        assert self.reader is not None
        event = None
        while line := await self.reader.readline():
            text = line.rstrip(b"\r\n")
            if text.startswith(b"event:"):
                event = text[6:].strip()
            elif text.startswith(b"data:") and event == b"job":
                job: dict[str, Any] = orjson.loads(text[5:].strip())
                self.jobs.append(job)
                return job
        return None

    async def end(self) -> bool:
        """Read the stream to its end (events not read are dropped); whether it ended as
        a response should, with the last chunk, rather than cut."""
        assert self.reader is not None
        last = b""
        while line := await self.reader.readline():
            if line.strip():
                last = line.strip()
        self.close()
        return last == b"0"

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def stream_path(job_type: str, lease_ms: int = 60_000) -> str:
    return f"/v2/jobs/stream?type={job_type}&maxJobs=1&timeout={lease_ms}"


# -- held -------------------------------------------------------------------------------


@dataclass
class HeldStep:
    waiters: int  # long polls and streams held
    streams: int
    rss_mb: float
    fds: int
    per_process: list[tuple[float, int]]
    opened_s: float  # from the step's first call sent to the server reporting them all


@dataclass
class Held:
    steps: list[HeldStep]
    # "job", "empty" ({"jobs": []}, at the server's shutdown), or another status
    polls: Counter[str]
    streams: Counter[str]  # "job" (a job, then a clean end at shutdown), or what else
    jobs_handed_out: int
    distinct_jobs: int
    stopped_s: float  # from SIGTERM to every long poll answered and every stream ended
    # Calls refused 503 with Retry-After as they arrived (JOBFAIR_MAX_IN_FLIGHT: a long
    # poll is worked on until it waits) and sent again after it, as a client does.
    shed_on_arrival: int = 0


POLL = {"type": POLL_TYPE, "maxJobs": 1, "timeout": 60_000, "requestTimeout": 600_000}


async def held(
    base: str,
    pid: int,
    stop: Callable[[], None],
    steps: tuple[int, ...] = (1_000, 10_000),
    stream_share: int = 50,
    jobs: int = 200,
    step_timeout_s: float = 60.0,
) -> Held:
    """Long polls and streams (one in ``stream_share`` of each step is a stream) held in
    ``steps``, ``usage`` at 0 and at each; then ``jobs`` jobs go to the long polls (the
    first ``jobs`` in line) and one to each stream, and ``stop()`` (a SIGTERM) makes the
    server answer every other long poll ``{"jobs": []}`` and end every stream."""
    caller = Caller(base)
    refused = 0

    async def poll() -> Answer:
        nonlocal refused
        while (a := await caller.call("POST", "/v2/jobs/activate", POLL)).status == 503:
            refused += 1
            await asyncio.sleep(float(a.headers.get("retry-after", "1")))
        return a

    async def stream() -> Stream:
        nonlocal refused
        while (s := await caller.stream(stream_path(STREAM_TYPE))).status == 503:
            refused += 1
            await asyncio.sleep(float(s.headers.get("retry-after", "1")))
        return s

    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await client.get("/v2/stats")  # every process warm before the baseline
        u = usage(pid)
        rows = [HeldStep(0, 0, u.rss_mb, u.fds, u.per_process, 0.0)]
        polls: list[asyncio.Task[Answer]] = []
        streams: list[asyncio.Task[Stream]] = []
        for target in steps:
            t0 = time.perf_counter()
            more = target - len(polls) - len(streams)
            n_streams = more // stream_share
            streams += [asyncio.create_task(stream()) for _ in range(n_streams)]
            polls += [asyncio.create_task(poll()) for _ in range(more - n_streams)]
            await until_waiters(client, target, timeout_s=step_timeout_s)
            opened_s = time.perf_counter() - t0
            await asyncio.sleep(1.1)  # each process's waiters in /metrics, and settled
            u = usage(pid)
            rows.append(HeldStep(target, len(streams), u.rss_mb, u.fds, u.per_process, opened_s))
        opened = await asyncio.gather(*streams)
        await _create(client, POLL_TYPE, jobs)
        await _create(client, STREAM_TYPE, len(opened))
        stream_jobs = await asyncio.gather(
            *(asyncio.wait_for(s.next_job(), 30) for s in opened if s.status == 200)
        )
        stopped = time.perf_counter()
        stop()
        ends = await asyncio.gather(*(asyncio.wait_for(s.end(), 30) for s in opened))
        answers = await asyncio.gather(*polls)
        stopped_s = time.perf_counter() - stopped
    poll_outcomes: Counter[str] = Counter()
    keys = []
    for a in answers:
        if a.status != 200:
            poll_outcomes[str(a.status)] += 1
            continue
        got = orjson.loads(a.body)["jobs"]
        poll_outcomes["job" if got else "empty"] += 1
        keys += [j["jobKey"] for j in got]
    stream_outcomes = Counter(
        ("job" if clean else "job, unclean end") if s.status == 200 else str(s.status)
        for s, clean in zip(opened, ends, strict=True)
    )
    keys += [j["jobKey"] for j in stream_jobs if j is not None]
    return Held(rows, poll_outcomes, stream_outcomes, len(keys), len(set(keys)), stopped_s, refused)


def held_table(h: Held) -> str:
    lines = ["waiters  streams  RSS MB  descriptors  per process (MB/descriptors)  opened in s"]
    for r in h.steps:
        per = ", ".join(f"{mb:.0f}/{fds}" for mb, fds in r.per_process)
        lines.append(
            f"{r.waiters:>7}  {r.streams:>7}  {r.rss_mb:>6.0f}  {r.fds:>11}  {per:<28}  "
            f"{r.opened_s:.1f}"
        )
    lines.append(f"long polls: {dict(h.polls)}, streams: {dict(h.streams)}")
    lines.append(f"refused 503 on arrival and sent again: {h.shed_on_arrival}")
    lines.append(f"all answered {h.stopped_s:.1f} s after SIGTERM")
    return "\n".join(lines)


async def _create(client: httpx.AsyncClient, job_type: str, n: int) -> None:
    for start in range(0, n, 1_000):
        jobs = [{"type": job_type} for _ in range(min(1_000, n - start))]
        r = await client.post("/v2/jobs/batch", json={"jobs": jobs})
        assert r.status_code == 201, r.text


# -- shed -------------------------------------------------------------------------------


@dataclass
class Shed:
    polls: Counter[int]  # by status (0: closed unanswered)
    streams: Counter[int]
    retry_after: Counter[str]  # the 503s' Retry-After values
    problem_types: Counter[str]  # the 503s' problem types
    refused_ms_max: float  # the slowest refusal
    usage: Usage  # with the most held


async def shed(
    base: str, pid: int, stop: Callable[[], None], polls: int, streams: int, timeout_s: float = 60
) -> Shed:
    """``polls`` long polls and ``streams`` streams at once, more than the server's
    waiter bound: the excess refused at once; once every call is held or refused,
    ``stop()`` (a SIGTERM) answers those held."""
    caller = Caller(base)
    stream_tasks = [
        asyncio.create_task(caller.stream(stream_path(STREAM_TYPE))) for _ in range(streams)
    ]
    poll_tasks = [
        asyncio.create_task(caller.call("POST", "/v2/jobs/activate", POLL)) for _ in range(polls)
    ]
    async with httpx.AsyncClient(base_url=base, timeout=30) as client, asyncio.timeout(timeout_s):
        while True:
            held, _ = await waiters(client)
            answered = sum(t.done() for t in poll_tasks)
            refused_streams = sum(t.done() and t.result().status != 200 for t in stream_tasks)
            if held + answered + refused_streams == polls + streams:
                break
            await asyncio.sleep(0.2)
    u = usage(pid)
    stop()
    opened = await asyncio.gather(*stream_tasks)
    for s in opened:
        if s.status == 200:
            await asyncio.wait_for(s.end(), 30)
    answers = await asyncio.gather(*poll_tasks)
    refusals = [(a.status, a.headers, a.body, a.seconds) for a in answers if a.status != 200]
    refusals += [(s.status, s.headers, s.rest, s.seconds) for s in opened if s.status != 200]
    return Shed(
        Counter(a.status for a in answers),
        Counter(s.status for s in opened),
        Counter(h.get("retry-after", "none") for status, h, _, _ in refusals if status == 503),
        Counter(
            orjson.loads(body).get("type", "?") if body else "no body"
            for status, _, body, _ in refusals
            if status == 503
        ),
        max((seconds for *_, seconds in refusals), default=0) * 1000,
        u,
    )


# -- overload ---------------------------------------------------------------------------

OVERLOAD_TYPE = "overload"
BATCH = 100  # jobs per create, per activation's maxJobs, per complete


@dataclass
class Call:
    kind: str  # create, activate, complete
    phase: str  # baseline, overload, after
    at_s: float  # when it was sent, from the run's start
    status: int  # 0: no answer within the client's timeout, or the connection lost
    seconds: float
    retry_after: str | None


class _Connections:
    """Keep-alive connections to the server, a new one opened whenever none is idle (an
    open-loop client never waits for a connection of its own)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.idle: list[Connection] = []
        self.opened = 0
        self.connect_s: list[float] = []  # how long each connection took to open

    async def call(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes, str | None]:
        c = self.idle.pop() if self.idle else None
        if c is None:
            t = time.perf_counter()
            try:
                c = await Connection.open(self.base)
            except OSError:
                return 0, b"", None
            self.opened += 1
            self.connect_s.append(time.perf_counter() - t)
        try:
            r = await asyncio.wait_for(c.post(path, body), timeout_s)
        except (TimeoutError, ConnectionError, OSError):
            await c.close()
            return 0, b"", None
        self.idle.append(c)
        return r.status, r.body, r.retry_after

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.idle))


@dataclass
class Overload:
    capacity_jobs_s: float
    offered_jobs_s: float
    calls: list[Call]
    connections: int  # opened in all (the most in flight at once, about)
    rss_mb_max: float
    rss_mb_before: float
    client_timeout_s: float
    overload_end_s: float  # from the run's start
    recovered_after_s: float | None  # after the overload's end, to latency as before it
    connect_ms_p99: float
    connect_ms_max: float

    def phase(self, phase: str) -> list[Call]:
        return [c for c in self.calls if c.phase == phase]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "capacityJobsPerSec": round(self.capacity_jobs_s),
            "offeredJobsPerSec": round(self.offered_jobs_s),
            "connections": self.connections,
            "rssMBBefore": round(self.rss_mb_before, 1),
            "rssMBMax": round(self.rss_mb_max, 1),
            "recoveredAfterS": self.recovered_after_s,
            "connectP99Ms": round(self.connect_ms_p99, 1),
            "connectMaxMs": round(self.connect_ms_max, 1),
        }
        for phase in ("baseline", "overload", "after"):
            calls = self.phase(phase)
            ok = [c.seconds * 1000 for c in calls if 200 <= c.status < 300]
            refused = [c.seconds * 1000 for c in calls if c.status == 503]
            out[phase] = {
                "calls": len(calls),
                "byStatus": dict(Counter(c.status for c in calls)),
                "admittedP50Ms": round(percentile(ok, 50), 1) if ok else None,
                "admittedP99Ms": round(percentile(ok, 99), 1) if ok else None,
                "refusedP50Ms": round(percentile(refused, 50), 1) if refused else None,
                "refusedP99Ms": round(percentile(refused, 99), 1) if refused else None,
                "slowestMs": round(max(c.seconds for c in calls) * 1000, 1) if calls else None,
            }
        return out


def _jobs_body(n: int, i: int) -> bytes:
    return orjson.dumps({"jobs": [{"type": OVERLOAD_TYPE, "tenantId": f"t{i % 4}"}] * n})


ACTIVATE = orjson.dumps(
    {"type": OVERLOAD_TYPE, "maxJobs": BATCH, "timeout": 60_000, "requestTimeout": -1}
)


async def _cycle(
    conns: _Connections, phase: str, i: int, t0: float, calls: list[Call], timeout_s: float
) -> int:
    """One job batch's life: created, activated, completed; a refusal ends it.  Returns
    the jobs it completed."""
    steps = [
        ("create", "/v2/jobs/batch", _jobs_body(BATCH, i)),
        ("activate", "/v2/jobs/activate", ACTIVATE),
    ]
    done = 0
    while steps:
        kind, path, body = steps.pop(0)
        sent = time.perf_counter()
        status, answer, retry_after = await conns.call(path, body, timeout_s)
        calls.append(Call(kind, phase, sent - t0, status, time.perf_counter() - sent, retry_after))
        if not 200 <= status < 300:
            return done
        if kind == "activate":
            jobs = orjson.loads(answer)["jobs"]
            if jobs:
                finished = [
                    {"jobKey": j["jobKey"], "activationCount": j["activationCount"]} for j in jobs
                ]
                steps.append(("complete", "/v2/jobs/complete", orjson.dumps({"jobs": finished})))
        elif kind == "complete":
            done += BATCH
    return done


async def capacity(base: str, loops: int = 8, seconds: float = 3.0) -> float:
    """Jobs/s of ``loops`` closed loops of create, activate, complete (each call as soon
    as the one before it is answered): what the server and its database do at full
    speed on this machine, now."""
    conns = _Connections(base)
    calls: list[Call] = []
    stop = time.perf_counter() + seconds
    t0 = time.perf_counter()

    async def loop(i: int) -> int:
        n = 0
        while time.perf_counter() < stop:
            n += await _cycle(conns, "capacity", i, t0, calls, 30)
        return n

    done = sum(await asyncio.gather(*(loop(i) for i in range(loops))))
    elapsed = time.perf_counter() - t0
    await conns.close()
    assert all(200 <= c.status < 300 for c in calls), Counter(c.status for c in calls)
    return done / elapsed


async def overload(
    base: str,
    pid: int,
    capacity_jobs_s: float,
    factor: float = 10,
    baseline_s: float = 2.0,
    overload_s: float = 3.0,
    after_s: float = 4.0,
    client_timeout_s: float = 30.0,
) -> Overload:
    """The mix at half of ``capacity_jobs_s`` for ``baseline_s``, at ``factor`` times it for
    ``overload_s``, then at half again for ``after_s``: open-loop, a job batch's cycle
    started on schedule however many are in flight.  A call unanswered after
    ``client_timeout_s`` counts as status 0."""
    conns = _Connections(base)
    calls: list[Call] = []
    t0 = time.perf_counter()
    rss = [usage(pid).rss_mb]
    cycles: list[asyncio.Task[int]] = []
    i = 0
    phases = [
        ("baseline", baseline_s, 0.5),
        ("overload", overload_s, factor),
        ("after", after_s, 0.5),
    ]
    sampling = True

    async def sample() -> None:
        while sampling:
            await asyncio.sleep(0.25)
            rss.append(usage(pid).rss_mb)

    sampler = asyncio.create_task(sample())
    overload_end_s = 0.0
    for phase, seconds, share in phases:
        rate = capacity_jobs_s * share / BATCH  # cycles per second
        start = time.perf_counter()
        if phase == "after":
            overload_end_s = start - t0
        n = 0
        while (now := time.perf_counter()) < start + seconds:
            due = start + n / rate
            if due > now:
                await asyncio.sleep(due - now)
                continue
            cycles.append(asyncio.create_task(_cycle(conns, phase, i, t0, calls, client_timeout_s)))
            n += 1
            i += 1
    await asyncio.gather(*cycles)
    sampling = False
    await sampler
    await conns.close()
    return Overload(
        capacity_jobs_s,
        capacity_jobs_s * factor,
        calls,
        conns.opened,
        max(rss),
        rss[0],
        client_timeout_s,
        overload_end_s,
        _recovered_after(calls, overload_end_s),
        percentile(conns.connect_s, 99) * 1000,
        max(conns.connect_s, default=0) * 1000,
    )


def _recovered_after(
    calls: list[Call], end_of_overload: float, bucket_s: float = 0.5
) -> float | None:
    """Seconds from the overload's end to the start of the first half-second whose calls
    are all admitted, with a median latency within twice the baseline's plus 20 ms (a
    median: one call slowed by this shared machine is not an overload): what the server
    admitted during the overload is done by then.  None if never within the run."""
    normal = normal_latency_s(calls)
    after = [c for c in calls if c.phase == "after"]
    t = end_of_overload
    while after and t <= max(c.at_s for c in after):
        inside = [c for c in after if t <= c.at_s < t + bucket_s]
        if inside and all(200 <= c.status < 300 for c in inside):
            if percentile([c.seconds for c in inside], 50) <= normal:
                return round(t - end_of_overload, 2)
        t += bucket_s
    return None


def normal_latency_s(calls: list[Call]) -> float:
    """Twice the baseline's median latency plus 20 ms."""
    base = [c.seconds for c in calls if c.phase == "baseline" and 200 <= c.status < 300]
    return 2 * percentile(base, 50) + 0.020


# -- python -m bench.load_shed ------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenarios", nargs="*", default=["held", "shed", "overload"])
    p.add_argument("--server-workers", type=int, default=2)
    p.add_argument("--pool", type=int, default=8, help="JOBFAIR_DB_POOL_SIZE (overload)")
    p.add_argument(
        "--bounds", type=int, nargs="+", default=[0, 16, 64], help="JOBFAIR_MAX_IN_FLIGHT"
    )
    p.add_argument("--repeat", type=int, default=1, help="overload runs per bound")
    args = p.parse_args()
    if not raise_descriptor_limit(11_000):
        raise SystemExit("RLIMIT_NOFILE: this process may not open 10,000 connections")
    pg = Postgres(ROOT / ".jobfair" / "bench")
    out: dict[str, Any] = {"machine": machine_speed()}
    print(speed_line(out["machine"]))
    if "held" in args.scenarios:
        with server(pg.fresh_db("bench_held"), args.server_workers, pool=4) as base:
            pid = server_pid(base)
            h = asyncio.run(held(base, pid, functools.partial(os.kill, pid, signal.SIGTERM)))
        print(held_table(h))
        out["held"] = asdict(h)
    if "shed" in args.scenarios:
        env = {"JOBFAIR_MAX_WAITERS": "5000"}
        with server(pg.fresh_db("bench_shed"), args.server_workers, pool=4, env=env) as base:
            pid = server_pid(base)
            stop = functools.partial(os.kill, pid, signal.SIGTERM)
            s = asyncio.run(shed(base, pid, stop, polls=10_000, streams=200))
        print(s)
        out["shed"] = asdict(s)
    if "overload" in args.scenarios:
        rows = []
        for _ in range(args.repeat):
            for bound in args.bounds:
                env = {"JOBFAIR_MAX_IN_FLIGHT": str(bound)}
                url = pg.fresh_db("bench_overload")
                with server(url, args.server_workers, pool=args.pool, env=env) as base:
                    cap = asyncio.run(capacity(base))
                    o = asyncio.run(overload(base, server_pid(base), cap))
                rows.append({"maxInFlight": bound, "pool": args.pool, **o.summary()})
                print(json.dumps(rows[-1]))
        print(table([_flat(r) for r in rows], list(_flat(rows[0]))))
        out["overload"] = rows
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "load_shed.json").write_text(json.dumps(_keyed(out), indent=2, default=str) + "\n")


def _keyed(value: Any) -> Any:
    """``value`` with every mapping's keys as strings (a Counter of statuses, of
    (status, problem type) pairs), as JSON needs them."""
    if isinstance(value, dict):
        return {str(k): _keyed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_keyed(v) for v in value]
    return value


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """An overload row as one table line: the overload's and the calls after it."""
    o, a = row["overload"], row["after"]
    return {
        "maxInFlight": row["maxInFlight"] or "none",
        "capacity": row["capacityJobsPerSec"],
        "overload calls": o["calls"],
        "refused": o["byStatus"].get(503, 0),
        "admitted p50/p99 ms": f"{o['admittedP50Ms']} / {o['admittedP99Ms']}",
        "slowest ms": o["slowestMs"],
        "after p50/p99 ms": f"{a['admittedP50Ms']} / {a['admittedP99Ms']}",
        "recovered after s": row["recoveredAfterS"],
        "RSS MB max": row["rssMBMax"],
    }


if __name__ == "__main__":
    main()
