"""The benchmarks' CPU accounting counts every process of the server it measures."""

from __future__ import annotations

import httpx

from bench.harness import CpuMeter, machine_speed, postmaster_pid, server, server_pid
from tests.fixtures import Postgres


def test_cpu_meter_counts_each_server_worker_and_postgres(db_url: str, postgres: Postgres) -> None:
    with server(db_url, workers=2) as base:
        meter = CpuMeter(server_pid(base), postmaster_pid(postgres.root / "pgdata"))
        workers = [
            p
            for p in meter.groups["server"]
            if "from multiprocessing.spawn" in " ".join(p.cmdline())
        ]
        assert len(workers) == 2
        with httpx.Client(base_url=base) as client:
            for _ in range(50):
                assert client.post("/v2/jobs", json={"type": "metered"}).status_code == 201
        seconds, wall = meter.split()
    assert seconds["server"] > 0
    assert seconds["postgres"] > 0
    assert wall > 0


def test_machine_speed_times_the_interpreter_and_the_loopback() -> None:
    speed = machine_speed(rounds=2)
    # A fixed loop of 300,000 steps and a TCP round trip take some time, and not minutes.
    assert 0.1 < speed["pythonLoopMs"] < 60_000
    assert 0.1 < speed["loopbackRoundTripUs"] < 60_000_000


async def test_the_benchmarks_lane_reads_match_the_statement(store) -> None:
    """bench.lane_read and bench.scaling send read_lanes their own arguments; a change of
    the statement's parameters (alembic 0013 added two arrays) must not leave them
    behind, as it once did: benchmarks are not run in the suite."""
    from bench import lane_read, scaling

    await store.execute("INSERT INTO tenants (tenant_id) VALUES ('t1')")
    await store.execute(
        "INSERT INTO lanes (job_type, tenant_id, shard, vtime) VALUES"
        " ('bench', 't1', jobfair_shard('t1'), 0)"
    )
    assert await store.fetch(lane_read.READ_LANES.text, *lane_read.ARGS)
    async with store.connection() as conn:
        assert await scaling._read(conn, 4) is not None
