"""Issue 27 section 4, the short soak: two minutes of tests/chaos/soak.py's load at a
third of the measured capacity on `jobfair serve --workers 2`, background work on,
retention short.  ``make soak`` runs the same for 30 minutes at half the capacity, on a
machine to itself (docs/reliability.md, "Soak"); here the other test worker's tests share
the two cores the capacity was measured on, and at half it the first window once fell
behind the offered rate (621 of 747 jobs/s, a drift of 14 %) with nothing drifting.

What the short soak asserts on throughput is what a drift would show: that the server
slowed down.  The last window must keep up with the offered rate and not fall below the
first window by 10 %.  A first window behind the rate because a neighbour test took the
second core is not that: at a third of the capacity a fresh clone's CI run once gave 899
jobs/s in the first window and 999 in the last, of 997 offered (a symmetric "drift" of
11 %, with the server faster at the end than at the start).  ``make soak`` reports the
symmetric drift of the 30-minute run."""

from __future__ import annotations

import httpx
import pytest

from tests.chaos import soak
from tests.fixtures import ServerProcess, wait_ready

SECONDS = 120
INTERVAL_S = 10
WINDOW_S = 30
FRACTION = 1 / 3


async def _started(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        await wait_ready(client, server)


# Two minutes of the suite's time: `make extended` (issue 39 section 3); `make soak` is the
# thirty-minute version.
@pytest.mark.extended
async def test_two_minutes_at_a_third_of_capacity_drift_nothing_and_lose_nothing(
    spawn_server, db_url
):
    server = spawn_server("--workers", "2", **soak.server_env(retention_s=20))
    await _started(server)
    result = await soak.soak(
        server.url, db_url, server.proc.pid, SECONDS, INTERVAL_S, WINDOW_S, fraction=FRACTION
    )
    print(result.summary())
    # The ledger: every job created was completed once, after its failures if any.
    assert result.created > 0.9 * result.rate_jobs_per_s * SECONDS
    assert result.lost == 0 and result.completed_twice == 0, result.summary()
    assert result.completed_once == result.created
    assert result.failed_then_retried >= result.created // 20
    assert result.left_activated == 0 and result.server_errors == 0
    # Throughput: no slowdown.  The last 30 s keep up with the offered rate and are not
    # 10 % below the first 30 s after the warm-up.
    assert result.last_window_jobs_per_s >= 0.9 * result.rate_jobs_per_s, result.summary()
    assert result.last_window_jobs_per_s >= 0.9 * result.first_window_jobs_per_s, result.summary()
    # Bounded: retention (20 s) and autovacuum keep the tables at one size, and the
    # server's memory is flat, from the middle of the run to its end.
    settled = [r for r in result.rows if r["atS"] > SECONDS / 2]
    middle = settled[0]
    for key in ("jobsMiB", "jobsIndexesMiB", "historyMiB"):
        assert max(r[key] for r in settled) <= 1.3 * middle[key] + 0.5, (key, result.rows)
    rss_after_warm_up, rss_middle, rss_end = result.rss_mib
    assert rss_end <= 1.15 * rss_middle, result.summary()
    server.proc.terminate()
    server.proc.wait(timeout=30)
    log = server.log.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]
