"""Several server processes, each accepting on a listening socket of its own.

uvicorn's own ``--workers`` shares one listening socket among its processes, and the
process that wakes first takes whatever connections are waiting: in 2 of 6 drains the 32
connections of a pool of workers all landed in one process, which kept them while they
were kept alive and left the other idle (ADR 013).  Here each process binds its own
socket to the same address with ``SO_REUSEPORT``, and the kernel spreads new connections
over the processes by their address hash.

The processes start listening together, once every one of them has started its app
(its pool connected and warmed up): a server that answers at all answers from every
process, and no connection waits in the backlog of a process still starting.  A process
started later, to replace one that died, listens as soon as its own app has started.

The supervisor starts ``workers`` processes, starts another when one dies (a process that
exits cleanly was stopped on purpose and is not replaced), and on SIGTERM or SIGINT asks
each to stop gracefully (uvicorn answers what is in flight), then waits for them.  One
whose app failed to start among the first ``workers`` stops them all, exit code 3, as a
single process would.  A replacement that fails to start (its database away longer than
it waits, ``db_startup_wait_s``) is started again after a back-off: the processes still
serving are healthy, and stopping them would turn an outage of the database into one of
the whole service.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import glob
import logging
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # as app.metrics, which this module must not import
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# How long a worker may take to stop after SIGTERM beyond uvicorn's graceful timeout.
STOP_GRACE_S = 5.0
# How often a process waiting for its siblings checks that its supervisor is alive.
PARENT_CHECK_S = 0.2
# Back-off before starting again a replacement that failed to start: doubling up to this.
RESTART_MAX_S = 30.0


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_listening(port)`` once its sockets listen (after
    its app has started: uvicorn listens then)."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[int], None]) -> None:
        super().__init__(config)
        self.on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            [first, *_] = [sock for server in self.servers for sock in server.sockets]
            self.on_listening(first.getsockname()[1])


def raise_descriptor_limit(needed: int) -> int:
    """This process's soft RLIMIT_NOFILE raised to its hard limit (the server processes
    it starts inherit it); the soft limit it leaves.  A warning if that is below
    ``needed``: past the limit, uvloop accepts a connection and closes it at once, so a
    caller gets a reset where the waiter bound would have answered 503 with Retry-After.
    Shells and containers often start a process at a soft 1,024 under a far higher hard
    limit; 10,000 long polls need a descriptor each."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a hard limit above the kernel's nr_open
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target, exc)
    if soft < needed:
        log.warning(
            "descriptor limit %d (RLIMIT_NOFILE) is below the %d that JOBFAIR_MAX_WAITERS and "
            "the pool need per process: connections past it are closed unanswered.  Raise "
            "the hard limit (LimitNOFILE=, ulimit -Hn) or lower JOBFAIR_MAX_WAITERS.",
            soft,
            needed,
        )
    return soft


def serve_one(
    app: str, host: str, port: int, options: dict[str, Any], on_listening: Callable[[int], None]
) -> None:
    """Serve ``app`` (an import string) on ``host:port`` from this process, as
    ``uvicorn.run`` does; ``on_listening(port)`` once it listens (the port it got, for a
    port 0).  Exit code 3 if its app fails to start."""
    server = _Server(uvicorn.Config(app, host=host, port=port, **options), on_listening)
    server.run()
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


def serve(
    app: str,
    host: str,
    port: int,
    workers: int,
    options: dict[str, Any],
    on_listening: Callable[[int], None] = lambda port: None,
) -> None:
    """Serve ``app`` (an import string) on ``host:port`` from ``workers`` processes;
    ``options`` are uvicorn.Config's; ``on_listening(port)`` once, when the first
    ``workers`` all listen.  Call refuse_if_taken first.  Returns when every process has
    stopped cleanly; SystemExit (raised by the caller's signal handlers) stops them all
    and goes through."""
    with metrics_directory() as directory:
        _serve(app, host, port, workers, options, directory, on_listening)


@contextlib.contextmanager
def metrics_directory() -> Iterator[str]:
    """The folder where the server processes write their metrics (prometheus-client's
    multiprocess mode; docs/metrics.md), named to them in ``PROMETHEUS_MULTIPROC_DIR``:
    the one that variable names, emptied of an earlier run's files, or else a new one,
    removed at exit."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        clear_metrics(given)
        yield given
        return
    made = tempfile.mkdtemp(prefix="jobfair-metrics-")
    os.environ[MULTIPROC_ENV] = made  # the spawned processes inherit it
    try:
        yield made
    finally:
        del os.environ[MULTIPROC_ENV]
        shutil.rmtree(made, ignore_errors=True)


def clear_metrics(directory: str) -> None:
    """Remove an earlier run's metrics files from ``directory`` (its counters would be
    added to this run's), and nothing else."""
    os.makedirs(directory, exist_ok=True)
    for prefix in ("counter", "gauge", "histogram", "summary"):
        for stale in glob.glob(os.path.join(directory, f"{prefix}_*.db")):
            os.remove(stale)


def _forget(process: BaseProcess, directory: str) -> None:
    """A process has exited: its gauges leave the sums (its counters stay in them)."""
    from prometheus_client import multiprocess

    if process.pid is not None:
        multiprocess.mark_process_dead(process.pid, directory)


def _serve(
    app: str,
    host: str,
    port: int,
    workers: int,
    options: dict[str, Any],
    directory: str,
    on_listening: Callable[[int], None],
) -> None:
    context = multiprocessing.get_context("spawn")
    reports, report = context.Pipe(duplex=False)
    go = context.Event()

    def start() -> BaseProcess:
        process = context.Process(
            target=_worker, args=(app, host, port, options, os.getpid(), report, go)
        )
        process.start()
        return process

    processes = [start() for _ in range(workers)]
    ready = listening = 0
    # Replacements that failed to start, to be started again at (monotonic) time.
    pending: list[float] = []
    restart_delay_s = 1.0
    try:
        while processes or pending:
            timeout = max(0.0, min(pending) - time.monotonic()) if pending else None
            for event in wait([p.sentinel for p in processes] + [reports], timeout):
                if event is reports:
                    what, pid = reports.recv()
                    if what == "listening":
                        listening += 1
                        if listening == workers:  # once: replacements come later
                            on_listening(port)
                        continue
                    ready += 1
                    restart_delay_s = 1.0
                    log.info("server process %s has started", pid)
                    if ready == workers and not go.is_set():
                        log.info("all %d server processes have started: listening", workers)
                        go.set()
            running = []
            for process in processes:
                # Read once: a process seen running here and exited a moment later must
                # be kept for the next pass, not dropped unreplaced.
                code = process.exitcode
                if code is None:
                    running.append(process)
                    continue
                _forget(process, directory)
                if code == STARTUP_FAILURE and not go.is_set():
                    # Its app failed to start, as the others' would: give up, as one
                    # process would (and as uvicorn's supervisor does).
                    log.error("server process %s failed to start; stopping", process.pid)
                    raise SystemExit(STARTUP_FAILURE)
                elif code == STARTUP_FAILURE:
                    log.error(
                        "replacement server process %s failed to start; trying again in %.0f s",
                        process.pid,
                        restart_delay_s,
                    )
                    pending.append(time.monotonic() + restart_delay_s)
                    restart_delay_s = min(restart_delay_s * 2, RESTART_MAX_S)
                elif code != 0:
                    log.warning(
                        "server process %s exited (%s); starting another", process.pid, code
                    )
                    # The others need not wait for its replacement to start.
                    go.set()
                    pending.append(time.monotonic())
                # One that exited cleanly (0) was stopped on purpose (Ctrl-C reaches every
                # process of the terminal's group): not replaced.
            processes = running
            now = time.monotonic()
            processes += [start() for due in pending if due <= now]
            pending = [due for due in pending if due > now]
    finally:
        go.set()  # a process still waiting for its siblings would not stop
        _stop(processes, options.get("timeout_graceful_shutdown") or 0)


def _stop(processes: list[BaseProcess], graceful_s: float) -> None:
    """Stop every process gracefully, killing one that takes too long.  A second signal
    while they stop (SystemExit from the caller's handlers) kills the rest at once, but
    still waits for them: whatever runs after the supervisor (stopping the embedded
    PostgreSQL) must not pull the database from under processes still serving."""
    for process in processes:
        if process.exitcode is None:
            process.terminate()  # SIGTERM: uvicorn's graceful shutdown
    try:
        for process in processes:
            process.join(graceful_s + STOP_GRACE_S)
            if process.exitcode is None:
                log.warning("server process %s did not stop in time; killing it", process.pid)
                _kill([process])
    except SystemExit:
        log.warning("stopping again: killing the server processes")
        _kill(processes)
        raise


def _kill(processes: list[BaseProcess]) -> None:
    for process in processes:
        if process.exitcode is None:
            process.kill()
    for process in processes:
        process.join()


def _address(host: str, port: int) -> tuple[socket.AddressFamily, Any]:
    [(family, _, _, _, address), *_] = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    return family, address


def refuse_if_taken(host: str, port: int) -> None:
    """OSError if the address is in use, as a single server would fail: sockets that
    share a port by SO_REUSEPORT would otherwise share it with another server on it."""
    family, address = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)


def _listening_socket(host: str, port: int) -> socket.socket:
    family, address = _address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def _stop_with(parent: int) -> None:
    """Have the kernel send this process SIGTERM when its supervisor dies (Linux), so a
    supervisor killed outright leaves no server process holding the port."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the workers outlive a killed supervisor
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class _ListenTogether:
    """``app``, whose start-up, once complete, is reported to the supervisor, and held
    until the supervisor says ``go`` (every process has started).  uvicorn listens when
    the start-up completes, as the ASGI lifespan protocol has servers do."""

    def __init__(self, app: ASGIApp, report: Connection, go: Event, parent: int) -> None:
        self.app = app
        self.report = report
        self.go = go
        self.parent = parent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def send_when_all_started(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.report.send(("started", os.getpid()))
                await asyncio.to_thread(self._wait_for_go)
            await send(message)

        await self.app(scope, receive, send_when_all_started)

    def _wait_for_go(self) -> None:
        # A supervisor killed outright never says go; this process then starts, sees the
        # SIGTERM its supervisor's death sent it (_stop_with), and stops.
        while not self.go.wait(PARENT_CHECK_S) and os.getppid() == self.parent:
            pass


def _worker(
    app: str,
    host: str,
    port: int,
    options: dict[str, Any],
    parent: int,
    report: Connection,
    go: Event,
) -> None:
    from uvicorn.importer import import_from_string

    _stop_with(parent)
    # Bound now, so that the address is ours; uvicorn listens once the app has started.
    sock = _listening_socket(host, port)
    gated = _ListenTogether(import_from_string(app), report, go, parent)
    config = uvicorn.Config(gated, host=host, port=port, **options)
    _Server(config, lambda port: report.send(("listening", os.getpid()))).run(sockets=[sock])
