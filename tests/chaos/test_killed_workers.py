"""Workers that take jobs and stop working on them, under the chaos load on three
servers (tests/chaos/ledger_load.py).  One worker process is killed with SIGKILL holding
its jobs; another is frozen past its lease (a stopped VM, a long pause) and then tries to
complete its jobs.  Their leases end, the jobs go to the load's workers, who complete
them; the frozen worker's late completes are 409 ``stale-activation`` and change
nothing.  The load's own long-poll workers also drop one job in twenty on the floor (a
worker that crashed in-process), so that dozens of leases end during the run."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chaos.ledger_load import JOB_TYPES, LedgerLoad, Servers, start_servers
from tests.fixtures import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
ZOMBIE_LEASE_MS = 1_000


async def zombie(url: str, max_jobs: int) -> tuple[asyncio.subprocess.Process, list[Any]]:
    """A tests.chaos.zombie_worker process, once it holds its jobs: (process, jobs)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.chaos.zombie_worker",
        url,
        JOB_TYPES[0],
        str(max_jobs),
        str(ZOMBIE_LEASE_MS),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line, f"the zombie worker exited: {await proc.wait()}"
    return proc, json.loads(line)


async def test_killed_and_frozen_workers_jobs_are_redelivered_and_the_late_complete_is_409(
    spawn_server: Callable[..., ServerProcess], db_url: str
) -> None:
    servers = await start_servers(spawn_server, 3)
    load = LedgerLoad(
        Servers([s.url for s in servers]),
        lambda: db_url,
        jobs=400,
        lease_ms=2_000,
        zombie_every=20,
    )
    late: list[dict[str, Any]] = []
    taken: dict[str, int] = {}  # by the two zombies: key -> activation count
    held: list[Any] = []  # the frozen one's jobs

    async def zombies(load: LedgerLoad) -> None:
        await load.until_created(load.jobs // 4)
        (killed, killed_jobs), (frozen, frozen_jobs) = await asyncio.gather(
            zombie(servers[0].url, 5), zombie(servers[1].url, 5)
        )
        taken.update({j["jobKey"]: j["activationCount"] for j in killed_jobs + frozen_jobs})
        held.extend(frozen_jobs)
        killed.send_signal(signal.SIGKILL)
        await killed.wait()

        def redone() -> bool:  # every zombie's job completed by a later activation
            done = {(f.job_key, f.activation_count) for f in load.finishes}
            return all(any((k, c) in done for c in range(n + 1, n + 10)) for k, n in taken.items())

        await load.until(redone)
        assert frozen.stdin is not None and frozen.stdout is not None
        frozen.stdin.write(b"go\n")
        await frozen.stdin.drain()
        late.extend(json.loads(await asyncio.wait_for(frozen.stdout.readline(), 60)))
        assert await frozen.wait() == 0

    await load.run(zombies)
    figures = await load.verify("workers killed mid-job")
    # (A long poll answers with the jobs its first round claims: 1 to 5 each.)
    assert len(held) >= 1 and len(taken) >= 2 and len(late) == len(held)
    # The frozen worker's late completes were refused, for the job was done by another.
    assert {(a["status"], a["type"]) for a in late} == {(409, "urn:jobfair:stale-activation")}
    # And the load's workers' dropped jobs came back to them too, each completed later.
    assert len(load.dropped) >= load.jobs // 60, len(load.dropped)
    finished = {f.job_key: f.activation_count for f in load.finishes}
    assert all(finished[k] > n for k, n in load.dropped)
    assert figures.lost == 0
