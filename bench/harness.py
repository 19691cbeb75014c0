"""Benchmark plumbing: an embedded PostgreSQL, fresh databases, server processes, stats.

Everything runs on this machine: the servers, PostgreSQL and the load generator share
its cores, so compare figures measured in one run, not across machines.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from app import embedded, migrations

ROOT = Path(__file__).resolve().parent.parent


class Postgres:
    def __init__(self, data_dir: Path) -> None:
        self.server, _ = embedded.start(data_dir)

    @property
    def postmaster_pid(self) -> int:
        return postmaster_pid(Path(self.server.pgdata))

    def fresh_db(self, name: str, migrate: bool = True) -> str:
        """An empty database ``name`` (dropped first if it exists), with Jobfair's schema
        unless ``migrate`` is false; its asyncpg URL."""
        self.server.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);')
        self.server.psql(f'CREATE DATABASE "{name}";')
        url = embedded.asyncpg_url(self.server.get_uri(name))
        if migrate:
            migrations.upgrade(url)
        return url


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _running(command: list[str], port: int, ready: str, **popen: Any) -> Iterator[str]:
    """A server process on ``port``: yields its base URL once ``GET ready`` answers 200."""
    proc = subprocess.Popen(command, cwd=ROOT, **popen)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{command[2:4]} exited with {proc.returncode}")
            try:
                if httpx.get(base + ready, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[2:4]} did not become ready")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def server(
    url: str, workers: int = 1, pool: int = 20, env: dict[str, str] | None = None
) -> Iterator[str]:
    """A ``jobfair serve`` process tree on a free port (``env``: more JOBFAIR_* settings);
    yields its base URL.  Its log is kept under .jobfair/ only when the benchmark using it
    failed."""
    port = free_port()
    env = {**os.environ, "JOBFAIR_DB_POOL_SIZE": str(pool), **(env or {})}
    command = [sys.executable, "-m", "app.cli", "serve", "--database-url", url]
    command += ["--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    path = ROOT / ".jobfair" / f"bench-server-{port}.log"
    path.parent.mkdir(exist_ok=True)  # a fresh checkout has no .jobfair/ yet
    with (
        open(path, "wb") as log,
        _running(command, port, "/readyz", env=env, stdout=log, stderr=subprocess.STDOUT) as base,
    ):
        yield base
    path.unlink()


def postmaster_pid(pgdata: Path) -> int:
    """The PostgreSQL server running on the data folder ``pgdata``."""
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def server_pid(base: str) -> int:
    """The ``jobfair serve`` process answering on ``base``: the one listening or, when it
    runs several processes, their supervisor."""
    port = int(base.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN" and conn.pid:
            process = psutil.Process(conn.pid)
            parent = process.parent()
            if parent is not None and "app.cli" in parent.cmdline():
                return parent.pid
            return process.pid
    raise RuntimeError("server process not found")


class CpuMeter:
    """CPU time (user + system) of the process trees of the server (or servers: replicas
    counted together) and of PostgreSQL (given by their root pids) and of this process
    (the load generator), from construction to ``split``: where a benchmark's CPU went,
    since every part of it shares this machine's cores."""

    def __init__(self, server: int | Sequence[int], postgres: int) -> None:
        servers = [server] if isinstance(server, int) else list(server)
        self.groups = {
            "server": [p for pid in servers for p in process_tree(pid)],
            "postgres": process_tree(postgres),
            "loadgen": [psutil.Process()],
        }
        self.started = time.perf_counter()
        self.before = {k: cpu_seconds(ps) for k, ps in self.groups.items()}

    def split(self) -> tuple[dict[str, float], float]:
        """CPU seconds per part since construction, and the wall-clock seconds."""
        wall = time.perf_counter() - self.started
        return {k: cpu_seconds(ps) - self.before[k] for k, ps in self.groups.items()}, wall


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process under it."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU seconds the processes have used so far."""
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:  # a backend that ended; its time is lost to us
            continue
        total += times.user + times.system
    return total


def machine_speed(rounds: int = 5) -> dict[str, float]:
    """How fast this machine runs right now, to read benchmark figures by: the same code
    ran up to 2.5x slower at some hours than at others (docs/benchmarks.md).  Medians of
    ``rounds``: milliseconds for a fixed loop of Python (the interpreter's speed), and
    microseconds for a one-byte round trip over a loopback TCP connection, sent and
    received in this one thread (the system calls and the kernel's TCP: about a third of a
    server's CPU per request in a drain)."""
    import socket

    loop_ms, trip_us = [], []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    with a, b:
        for sock in (a, b):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            t0 = time.perf_counter()
            total = 0
            for i in range(300_000):
                total += i * i % 7
            loop_ms.append(1e3 * (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for _ in range(2_000):
                a.send(b"x")
                b.recv(1)
                b.send(b"y")
                a.recv(1)
            trip_us.append(1e6 * (time.perf_counter() - t0) / 2_000)
    return {"pythonLoopMs": median(loop_ms), "loopbackRoundTripUs": median(trip_us)}


def speed_line(speed: dict[str, float]) -> str:
    """``machine_speed``'s figures, as the benchmarks print them."""
    return (
        f"Python loop {speed['pythonLoopMs']:.1f} ms, "
        f"loopback round trip {speed['loopbackRoundTripUs']:.1f} µs (lower is faster)"
    )


@contextmanager
def plain_server(app: str, workers: int = 1) -> Iterator[str]:
    """Any ASGI app (``module:attr``) under uvicorn on a free port; yields its base URL.
    It must answer ``GET /openapi.json`` (FastAPI apps do) to be seen ready."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", app, "--port", str(port)]
    command += ["--workers", str(workers), "--log-level", "warning"]
    with _running(command, port, "/openapi.json") as base:
        yield base


@asynccontextmanager
async def client(base: str, connections: int = 64) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as c:
        yield c


def percentile(samples: list[float], p: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


def latency_row(runs: list[list[float]]) -> dict[str, Any]:
    """Latency figures over repeated runs: each percentile is the median of the runs'
    (a run is one fresh database and server), and every run's p99 is listed."""
    p99s = [percentile(samples, 99) for samples in runs]
    return {
        "p50Ms": median([percentile(samples, 50) for samples in runs]),
        "p95Ms": median([percentile(samples, 95) for samples in runs]),
        "p99Ms": median(p99s),
        "p99Runs": p99s,
        "samples": sum(len(samples) for samples in runs),
    }


async def run_for(n: int, coro_factory) -> None:  # type: ignore[no-untyped-def]
    await asyncio.gather(*(coro_factory(i) for i in range(n)))


def write_results(name: str, out: dict[str, Any]) -> None:
    """Print ``out`` as JSON and keep it as bench/results/<name>.json."""
    path = ROOT / "bench" / "results" / f"{name}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    head = "  ".join(c.ljust(widths[c]) for c in columns)
    lines = [head, "  ".join("-" * widths[c] for c in columns)]
    for r in rows:
        lines.append("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    return "\n".join(lines)


def _fmt(v: object) -> str:
    if isinstance(v, list):
        return " · ".join(_fmt(x) for x in v)
    if isinstance(v, float):
        return f"{v:,.2f}" if v < 100 else f"{v:,.0f}"
    return "" if v is None else str(v)
