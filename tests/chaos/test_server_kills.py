"""Three ``jobfair serve`` processes on one database, and one of them killed with SIGKILL
ten times under the chaos load (tests/chaos/ledger_load.py), each replaced at once on the
same port, as a service manager restarts a unit.  The clients know the three addresses
and move to another when theirs fails; workers hold their jobs across the death and
finish them elsewhere; the jobs whose activation died with a server come back when
their lease ends.  The background work moves with the leader lock: the first kill is
always the leader's, and another process's log says it took over."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import signal
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from tests.chaos.ledger_load import (
    LEADS,
    SERVER_ENV,
    LedgerLoad,
    Servers,
    start_servers,
    until_leader,
    until_ready,
)
from tests.fixtures import ServerProcess

REPLACEMENT_ENV = {**SERVER_ENV, "JOBFAIR_MIGRATE_ON_START": "false"}


def port_of(server: ServerProcess) -> str:
    match = re.search(r":(\d+)$", server.url)
    assert match is not None
    return match.group(1)


async def kill_and_replace(
    spawn_server: Callable[..., ServerProcess],
    servers: list[ServerProcess],
    load: LedgerLoad,
    kills: int,
    interval_s: float,
    min_ready: int,
) -> list[tuple[str, str]]:
    """``kills`` times, every ``interval_s``: SIGKILL a ready server -- the leader first,
    then one at random -- and start its replacement on its port at once.  A kill waits
    until ``min_ready`` of the three are ready (2: one is always serving; 3: every
    replacement is up before the next kill).  Returns (when: UTC, as the logs write it,
    the killed server's URL)."""
    rng = random.Random(27)
    ready = {id(s): asyncio.create_task(until_ready(s)) for s in servers}
    history: list[tuple[str, str]] = []
    for round_ in range(kills):
        await asyncio.sleep(interval_s)  # the fault's pace, not a wait for an event
        while sum(ready[id(s)].done() for s in servers) < min_ready:
            pending = {ready[id(s)] for s in servers} - {t for t in ready.values() if t.done()}
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        up = [s for s in servers if ready[id(s)].done()]
        for t in ready.values():
            if t.done():
                t.result()  # a replacement that did not come up fails the test
        victim = await until_leader(servers) if round_ == 0 else rng.choice(up)
        victim.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.proc.wait)
        history.append((datetime.now(UTC).isoformat(timespec="milliseconds"), victim.url))
        # The schema is there: a restarted unit need not check it again (2 s, busy).
        started = spawn_server("--port", port_of(victim), **REPLACEMENT_ENV)
        replacement = dataclasses.replace(started, url=victim.url)  # its --port's URL
        servers[servers.index(victim)] = replacement
        ready[id(replacement)] = asyncio.create_task(until_ready(replacement))
    await asyncio.gather(*(ready[id(s)] for s in servers))
    return history


def leadership(servers: list[ServerProcess]) -> list[tuple[str, str]]:
    """Every "leads" line of every log (killed processes' too): (instant, port), in time
    order."""
    lines = []
    for log in servers[0].log.parent.glob("server-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if LEADS in line:
                port = re.search(r"Jobfair serving on \S+:(\d+)", log.read_text())
                lines.append((line.split()[0], port.group(1) if port else "?"))
    return sorted(lines)


async def servers_killed_under_load(
    spawn_server: Callable[..., ServerProcess],
    db_url: str,
    jobs: int,
    kills: int,
    scenario: str,
    interval_s: float,
    min_ready: int,
) -> None:
    servers = await start_servers(spawn_server, 3)
    first_leader = await until_leader(servers)
    load = LedgerLoad(
        Servers([s.url for s in servers]),
        lambda: db_url,
        jobs=jobs,
        rate_per_s=jobs / (kills * interval_s),  # creations go on through every kill
    )
    history: list[tuple[str, str]] = []

    async def fault(load: LedgerLoad) -> None:
        history.extend(
            await kill_and_replace(spawn_server, servers, load, kills, interval_s, min_ready)
        )

    await load.run(fault)
    figures = await load.verify(scenario)
    events = [(at, f"killed {url}") for at, url in history]
    events += [(at, f"the process on port {port} leads") for at, port in leadership(servers)]
    for at, what in sorted(events):
        print(f"{at.removesuffix('+00:00').removesuffix('Z')}: {what}")
    assert len(history) == kills
    assert figures.client_moves > 0  # the clients of the killed servers went elsewhere
    # The leader's kill handed the background work to another process, which said so.
    assert history[0][1] == first_leader.url
    new_leader = await until_leader(servers)
    assert new_leader.proc is not first_leader.proc
    assert len(leadership(servers)) >= 2


# `make test`: five kills, 1.5 s apart, one server always serving (a replacement takes 2
# to 5 s to start on a busy 2-core machine, most of it Python's imports).
async def test_servers_killed_under_load_lose_nothing_and_finish_each_job_once(
    spawn_server: Callable[..., ServerProcess], db_url: str
) -> None:
    await servers_killed_under_load(
        spawn_server, db_url, 400, 5, "kill -9 of a server, ×5", interval_s=1.5, min_ready=2
    )


# `make chaos`: the ten kills, 3 s apart, each once all three are up.
@pytest.mark.chaos
async def test_a_server_killed_ten_times_under_load_loses_nothing(
    spawn_server: Callable[..., ServerProcess], db_url: str
) -> None:
    await servers_killed_under_load(
        spawn_server, db_url, 5_000, 10, "kill -9 of a server, ×10", interval_s=3, min_ready=3
    )
