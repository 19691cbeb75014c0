"""The leader lock (app.db.leader, app.sweepers): a process that leads the background work
stops leading when its lock's session dies and another process takes the lock before it
reconnects -- found by the connection-cutting chaos scenario (tests/chaos/test_network.py),
where the old leader went on running the sweepers beside the new one."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.db.locks import LEADER_LOCK_KEY
from tests.fixtures import Live

# pg_locks shows a one-bigint advisory key as its high and low halves (objsubid 1), in
# this test's database (advisory locks are per database).
HOLDER = """
SELECT pid FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND objsubid = 1
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND classid::bigint = $1::bigint >> 32 AND objid::bigint = $1::bigint & 4294967295
"""


@pytest.fixture
def background() -> bool:
    return True


async def test_a_leader_whose_lock_was_taken_while_its_session_was_down_stops_leading(
    live: Live, db_url: str
) -> None:
    background = live.services.background
    await asyncio.wait_for(background.is_leader.wait(), 10)
    other = await asyncio.wait_for(asyncpg.connect(db_url), 10)  # "another process"
    try:
        for _ in range(5):
            holder = await other.fetchval(HOLDER, LEADER_LOCK_KEY)
            assert holder is not None
            await other.fetchval("SELECT pg_terminate_backend($1)", holder)
            # The leader retries every 1-2 s; this takes the lock in the meantime (or,
            # if the leader was quicker and holds it again, cuts it once more).
            for _ in range(20):
                if await other.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY):
                    break
                await asyncio.sleep(0.05)
            else:
                continue
            break
        else:
            raise AssertionError("the leader re-took its lock first five times")

        # Another leads now: within the loop's next passes, this process must not.  (No
        # event says "stopped leading": polled, with a deadline.)
        for _ in range(200):
            if not background.is_leader.is_set():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the process still leads, 10 s after its lock was taken")
    finally:
        await other.close()
    # Once the lock is free again, the process takes the lead back.
    await asyncio.wait_for(background.is_leader.wait(), 10)
