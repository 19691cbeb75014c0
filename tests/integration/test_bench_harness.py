"""The benchmarks' CPU accounting counts every process of the server it measures."""

from __future__ import annotations

import httpx

from bench.harness import CpuMeter, postmaster_pid, server, server_pid
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
