"""clients/typescript: its node:test suite against a live Jobfair (embedded PostgreSQL).

``make test`` installs the client's dev dependencies (the TypeScript compiler) and builds
it; this test serves Jobfair and runs ``node --test`` with JOBFAIR_URL pointing at it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.fixtures import quiet_settings

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"


@pytest.fixture
def background():
    return True


@pytest.fixture
def settings():
    # Fast lease sweep and promotion (heartbeat and retry tests); 3 waiters (the 503 test).
    return quiet_settings(lease_sweep_interval_ms=50, promote_interval_ms=50, max_waiters=3)


async def test_typescript_client_suite(live):
    node = shutil.which("node")
    assert node, "Node.js 18+ is required"
    assert (CLIENT / "dist" / "index.js").exists(), "run `make test`, which builds the client"
    proc = await asyncio.create_subprocess_exec(
        node,
        "--test",
        "--test-concurrency=1",
        "--test-reporter=spec",
        "test/",
        cwd=CLIENT,
        env={**os.environ, "JOBFAIR_URL": live.url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    report = out.decode()
    assert proc.returncode == 0, report[-6000:]
    assert "# fail 0" in report or "ℹ fail 0" in report, report[-3000:]
    assert "ℹ pass 10" in report, report[-3000:]
