"""The ledger's own checks (tests/chaos/ledger_load.py), each shown to catch what it is
for: the drain waits for finishes whose answers are still on their way, and a job left
ready while workers are answered nothing is named stranded, with its diagnosis, instead
of showing as a timeout or a count."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import pytest

from tests.chaos.ledger_load import LedgerLoad, Servers, start_servers
from tests.fixtures import ServerProcess


async def test_the_drain_waits_for_finishes_whose_answers_are_on_their_way(
    spawn_server: Callable[..., ServerProcess], db_url: str
) -> None:
    """Issue 39: `lost=1, accepted_finishes=199`, nothing else wrong.  The database
    showed every job COMPLETED while the last finish's 204 was still on its way to a
    worker on a busy machine; the drain stopped the workers then, and the ledger never
    saw that finish accepted.  Here every answer is taken in a second after it came:
    the drain must wait for them."""
    [server] = await start_servers(spawn_server, 1)
    load = LedgerLoad(Servers([server.url]), lambda: db_url, jobs=60, client_delay_s=1.0)
    await load.run()
    figures = await load.verify("answers taken in late")
    assert figures.lost == 0 and figures.accepted_finishes == 60, figures


async def test_a_job_left_in_a_parked_lane_is_named_stranded(
    spawn_server: Callable[..., ServerProcess], db_url: str
) -> None:
    """A lane parked with ready jobs in it (the fault a broken wake-up protocol would
    leave, made here by hand) strands them: workers of the type are answered nothing.
    The watch names the jobs within its bound, with the lane's state in the diagnosis,
    and the run stops there rather than after the drain's minute."""
    [server] = await start_servers(spawn_server, 1)
    load = LedgerLoad(Servers([server.url]), lambda: db_url, jobs=200, stranded_after_s=2.0)
    park = """
        WITH parked AS (
            UPDATE lanes SET active = false
             WHERE job_type = 'chaos-b' AND tenant_id = 'initech' RETURNING 1)
        SELECT count(*) FROM jobs
         WHERE job_type = 'chaos-b' AND tenant_id = 'initech' AND state = 'CREATED'
    """

    async def strand(load: LedgerLoad) -> None:
        conn = await asyncpg.connect(db_url)
        try:
            # Parked over and over while jobs come (each creation wakes the lane), then
            # once more with jobs of the lane still ready.
            for _ in range(3000):
                ready_left = await conn.fetchval(park)
                if len(load.created) == load.jobs and ready_left:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the lane never held a ready job once all were created")
        finally:
            await conn.close()

    with pytest.raises(AssertionError) as failed:
        await load.run(strand, drain_s=60)
        await load.verify("a parked lane with ready jobs")
    text = str(failed.value)
    assert "stranded" in text and "job_type='chaos-b'" in text, text
    assert "'active': False" in text, text  # the lane, as the diagnosis read it
    assert all(s.job_type == "chaos-b" and s.waited_s >= 2.0 for s in load.stranded)
