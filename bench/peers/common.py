"""What the systems' modules share: sizes, the CPU meter, pacing and waiting."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

TYPE = "bench"  # Jobfair's job type, PgQueuer's entrypoint, Procrastinate's task name
BATCH = 500  # W1: jobs per enqueue call
PRELOAD_BATCH = 1_000  # W2/W4 set-up for the peers: jobs per enqueue call (not timed)
W3_CONCURRENCY = 10  # W3: the idle worker's handlers
W4_CONCURRENCY = 10
DEADLINE_S = 600.0  # a run that has not finished by then is broken


@dataclass(frozen=True)
class Sizes:
    enqueue: int  # W1 jobs
    drain: int  # W2 jobs measured
    drain_warmup: int  # W2 jobs drained first by the same worker, not measured
    pickup: int  # W3 jobs counted
    pickup_warmup: int  # W3 jobs sent first at the same rate, not counted
    pickup_rate: int  # W3 jobs/s
    fair_a: int  # W4: tenant A's jobs, enqueued first
    fair_b: int  # W4: tenant B's jobs, enqueued after A's

    @classmethod
    def scaled(cls, scale: float) -> Sizes:
        def n(x: int) -> int:
            return max(1, round(x * scale))

        # B's 20 jobs and the warm-up are not scaled: the figure is where B's last job
        # lands, and fewer than 20 would say little.
        return cls(n(20_000), n(20_000), n(5_000), n(2_000), 100, 200, n(5_000), 20)


class Meter:
    """CPU seconds (user + system) of the server's process tree (None: no server, the
    system runs in this process), PostgreSQL's and this process, from construction to
    ``split``.  Unlike bench.harness.CpuMeter it looks for the trees' processes again
    at the end, so a backend that a connection opened after construction is counted
    (one closed before ``split`` is not: split before closing connections)."""

    def __init__(self, server: int | None, postgres: int) -> None:
        self.roots = {"server": server, "postgres": postgres}
        self.started = time.perf_counter()
        self.before = {k: _tree_cpu(pid) for k, pid in self.roots.items()}
        self.before["loadgen"] = {os.getpid(): _cpu(psutil.Process())}

    def split(self, jobs: int, loadgen_s: float | None = None) -> dict[str, float]:
        """Microseconds per job for each part, and how busy the machine's cores were.
        ``loadgen_s``: the load generator's CPU seconds when it was another process
        (the TypeScript and Java workers report their own)."""
        wall = time.perf_counter() - self.started
        seconds = {}
        for k, pid in self.roots.items():
            now = _tree_cpu(pid)
            seconds[k] = sum(v - self.before[k].get(p, 0.0) for p, v in now.items())
        if loadgen_s is None:
            loadgen_s = _cpu(psutil.Process()) - self.before["loadgen"][os.getpid()]
        seconds["loadgen"] = loadgen_s
        row = {f"{k}UsPerJob": 1e6 * s / jobs for k, s in seconds.items()}
        row["busyPct"] = 100 * sum(seconds.values()) / (wall * (os.cpu_count() or 1))
        return row


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _tree_cpu(pid: int | None) -> dict[int, float]:
    if pid is None:
        return {}
    root = psutil.Process(pid)
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            out[p.pid] = _cpu(p)
        except psutil.NoSuchProcess:
            continue
    return out


async def until(done: Callable[[], bool], what: str, interval_s: float = 0.002) -> None:
    """Wait (checking every ``interval_s``) until ``done()``; fail after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(interval_s)


class Window:
    """A drain's measured part: from the moment ``warm`` jobs were acknowledged (the
    worker ran at its pace by then: connections open, statements prepared, a JIT's code
    compiled) to the last.  ``started(acked)`` is called as the acknowledgements grow."""

    def __init__(self, warm: int, server: int | None, postgres: int) -> None:
        self.warm = warm
        self.roots = (server, postgres)
        self.meter: Meter | None = None
        self.t0 = 0.0
        self.acked_at_start = 0

    def started(self, acked: int) -> bool:
        if self.meter is None and acked >= self.warm:
            self.meter = Meter(*self.roots)
            self.t0 = time.perf_counter()
            self.acked_at_start = acked
        return self.meter is not None

    def row(self, acked: int, last_at: float) -> dict[str, float]:
        """jobs/s over the window, ending when the last acknowledgement came, and the CPU
        per job of each part."""
        assert self.meter is not None
        jobs = acked - self.acked_at_start
        return {"jobsPerSec": jobs / (last_at - self.t0), **self.meter.split(jobs)}


class Pickup:
    """W3's stamps: when each job's create call started and returned, and when its
    handler started, all ``time.perf_counter()`` in this process."""

    def __init__(self, warmup: int, jobs: int) -> None:
        self.warmup, self.total = warmup, warmup + jobs
        self.sent: dict[int, float] = {}
        self.returned: dict[int, float] = {}
        self.started: dict[int, float] = {}

    def handler_started(self, i: int) -> None:
        self.started.setdefault(i, time.perf_counter())

    async def produce(self, rate: int, create: Callable[[int], object]) -> None:
        """Create the jobs one at a time, paced at ``rate`` per second against the
        schedule (a late call is not made up for by the next ones waiting less)."""
        interval = 1.0 / rate
        start = time.perf_counter()
        for i in range(self.total):
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.sent[i] = time.perf_counter()
            await create(i)  # type: ignore[misc]
            self.returned[i] = time.perf_counter()
        await until(lambda: len(self.started) >= self.total, "W3: jobs not picked up")

    def samples(self) -> dict[str, list[float]]:
        counted = range(self.warmup, self.total)
        return {
            "pickup": [1e3 * (self.started[i] - self.sent[i]) for i in counted],
            "create": [1e3 * (self.returned[i] - self.sent[i]) for i in counted],
        }


def b_position(order: list[str], a: int, b: int) -> dict[str, int]:
    """W4: the 1-based position, in handler start order, of tenant B's last job."""
    assert len(order) == a + b and order.count("B") == b, (len(order), order.count("B"))
    return {"bLastPosition": max(k for k, t in enumerate(order) if t == "B") + 1, "jobs": a + b}
