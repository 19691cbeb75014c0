"""Issue 27, section 3: load held and shed by `jobfair serve --workers 2`.

Thousands of idle long polls and streams held in bounded memory, or refused with 503 and
``Retry-After`` past ``JOBFAIR_MAX_WAITERS``; ten times the server's capacity offered
and the excess refused, what is admitted answered in bounded time, and the server back
to normal as soon as it ends.  The scenarios are bench.load_shed's (``python -m
bench.load_shed`` prints their figures for docs/reliability-load.md); the calls are made
on raw asyncio connections, so that the client is not what is measured.
"""

from __future__ import annotations

import functools
import resource
import signal
from collections import Counter
from collections.abc import Callable

import httpx
import psutil
import pytest

from bench import load_shed
from bench.harness import percentile
from tests.fixtures import ServerProcess, wait_ready

KB = 1024


async def _started(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        await wait_ready(client, server)


def _clean_log(server: ServerProcess) -> None:
    log = server.log.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]


def _descriptor_limits(pid: int) -> set[tuple[int, int]]:
    root = psutil.Process(pid)
    return {p.rlimit(psutil.RLIMIT_NOFILE) for p in [root, *root.children(recursive=True)]}


async def test_a_server_started_at_a_low_soft_descriptor_limit_raises_it_to_the_hard_one(
    spawn_server,
):
    """A shell's soft 1,024 would close the connections of all but ~1,000 long polls
    unanswered; the server raises it to the hard limit, and says when even that is
    short of what ``JOBFAIR_MAX_WAITERS`` needs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 1024:
        pytest.skip(f"needs a finite hard RLIMIT_NOFILE above 1024, not {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:  # the server inherits the soft limit this process has when it starts it
        server = spawn_server("--workers", "2", JOBFAIR_MAX_WAITERS=str(hard))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    await _started(server)
    assert _descriptor_limits(server.proc.pid) == {(hard, hard)}
    assert f"descriptor limit {hard} (RLIMIT_NOFILE) is below" in server.log.read_text()


def _stop(server: ServerProcess) -> Callable[[], None]:
    return functools.partial(server.proc.send_signal, signal.SIGTERM)


# Thousands of connections held at once: on the 2-core machine, beside the other worker
# process of `make test`, the first fresh-clone run timed out (07:17 UTC, load 8): these
# two are `make chaos`'s until they are made to fit.
@pytest.mark.chaos
async def test_ten_thousand_idle_long_polls_and_streams_are_held_in_bounded_memory(
    spawn_server,
):
    """Held in steps of 1,000 and 10,000 (one in 50 a stream); then jobs for the first
    200 long polls in line and for every stream, and a SIGTERM: the server answers every
    other long poll {"jobs": []}, ends every stream cleanly, and exits 0."""
    if not load_shed.raise_descriptor_limit(11_000):
        pytest.skip("this process may not open 10,000 connections (RLIMIT_NOFILE)")
    server = spawn_server("--workers", "2", JOBFAIR_DB_POOL_SIZE="4")
    await _started(server)
    held = await load_shed.held(server.url, server.proc.pid, _stop(server), jobs=200)
    print(load_shed.held_table(held))
    idle, _, full = held.steps
    streams = full.streams
    assert held.polls == Counter({"job": 200, "empty": full.waiters - streams - 200})
    assert held.streams == Counter({"job": streams})
    assert held.jobs_handed_out == held.distinct_jobs == 200 + streams
    # A descriptor per connection held; memory per waiter bounded (some 20 KB each here:
    # the connection, its request and its task).
    assert full.waiters <= full.fds - idle.fds <= full.waiters + 200
    assert full.rss_mb - idle.rss_mb < full.waiters * 64 * KB / 2**20
    assert server.proc.wait(30) == 0
    _clean_log(server)


@pytest.mark.chaos  # as above
async def test_past_the_waiter_bound_long_polls_and_streams_are_refused_503_retry_after(
    spawn_server,
):
    """300 waiters a process, 1,100 offered to two: 600 held, the rest answered 503 with
    Retry-After at once (a stream before it opens), none reset, none 500."""
    server = spawn_server("--workers", "2", JOBFAIR_MAX_WAITERS="300", JOBFAIR_DB_POOL_SIZE="4")
    await _started(server)
    shed = await load_shed.shed(
        server.url, server.proc.pid, _stop(server), polls=1_000, streams=100
    )
    print(shed)
    assert set(shed.polls) | set(shed.streams) <= {200, 503}
    assert shed.polls[200] + shed.streams[200] == 600
    refused = shed.polls[503] + shed.streams[503]
    assert refused == 500
    assert shed.retry_after == Counter({"1": refused})
    assert shed.problem_types == Counter({"urn:jobfair:resource-exhausted": refused})
    assert server.proc.wait(30) == 0
    _clean_log(server)


@pytest.mark.chaos  # 15 s of the suite's time (issue 39 section 3)
async def test_ten_times_capacity_is_refused_503_and_the_server_recovers_at_once(spawn_server):
    """The capacity of creates, activations and completes (100 jobs a call) measured,
    then ten times it offered for 3 s: the excess refused with 503 and Retry-After, what
    is admitted answered within the in-flight bound's worth of work, no call unanswered,
    and calls sent from a second after the overload as fast as before it.  Without the
    bound (JOBFAIR_MAX_IN_FLIGHT=0) nothing is refused, admitted calls wait for as long
    as the overload lasts and more, and the calls after it wait behind them."""
    server = spawn_server("--workers", "2", JOBFAIR_DB_POOL_SIZE="8", JOBFAIR_MAX_IN_FLIGHT="16")
    await _started(server)
    capacity = await load_shed.capacity(server.url)
    run = await load_shed.overload(server.url, server.proc.pid, capacity, client_timeout_s=30)
    summary = run.summary()
    print(summary)
    over = run.phase("overload")
    statuses = Counter(c.status for c in run.calls)
    assert set(statuses) <= {200, 201, 503}, statuses  # every call answered, none 500
    refused = [c for c in over if c.status == 503]
    assert len(refused) >= len(over) // 4
    assert {c.retry_after for c in refused} == {"1"}
    # Bounded: every call answered within 10 s (the slowest took 15-18 s without the
    # bound, for an overload of 3 s; and more for a longer one).
    assert max(c.seconds for c in run.calls) < 10
    assert run.recovered_after_s is not None and run.recovered_after_s <= 2.0, summary
    # And it stays so: the calls sent from 2 s after the overload, at half the capacity.
    later = [c for c in run.phase("after") if c.at_s >= run.overload_end_s + 2]
    assert sum(c.status == 503 for c in later) <= len(later) // 20
    latencies = [c.seconds for c in later if c.status != 503]
    # Twice the normal latency: the other test worker of `make test` may start a load of
    # its own between the baseline and these calls (a fresh clone's run: 77 ms against a
    # normal 45 ms, beside the two-minute soak). Unbounded, they wait for seconds.
    assert percentile(latencies, 50) <= 2 * load_shed.normal_latency_s(run.calls)
    _clean_log(server)
