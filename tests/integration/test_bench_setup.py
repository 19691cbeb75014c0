"""What bench's set-up (bench/preload.py) writes straight through SQL is a backlog that
activation takes from: jobs, their lanes and each lane's default fairness key.  (Without
the keys, added by alembic 0010, `drain`, `backlog` and `tenants` activated nothing.)"""

from __future__ import annotations

from collections import Counter

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.config import Settings
from bench.preload import preload, preload_many_tenants


async def test_the_preloaded_backlog_is_activated_fairly(store, db_url):
    await preload(db_url, "bench", {"a": 30, "b": 30, "c": 30})
    rows, _ = await Rounds(store, Settings()).activate(ActivateRequest("bench", 30, 60_000))
    assert Counter(r.tenant_id for r in rows) == {"a": 10, "b": 10, "c": 10}


async def test_many_preloaded_tenants_each_give_their_turn(store, db_url):
    await preload_many_tenants(db_url, "many", 50, 2)
    rows, _ = await Rounds(store, Settings()).activate(ActivateRequest("many", 50, 60_000))
    assert len(rows) == 50 and len({r.tenant_id for r in rows}) == 50
