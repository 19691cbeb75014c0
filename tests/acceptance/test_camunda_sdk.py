"""Issue 4: Camunda's own Python SDK (both the 9.x and the 10.x line of
camunda-orchestration-sdk, which validate responses strictly) against a live Jobfair.

Each SDK line lives in a virtualenv of its own that ``make test`` installs; the SDK runs
in a subprocess (tests/sdk/camunda_sdk_flow.py) and reports what it saw as JSON.  The
sweepers run on their timers here, the lease sweep every 50 ms, so that a 1 ms lease the
SDK takes expires by itself while the SDK waits.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import quiet_settings

ROOT = Path(__file__).resolve().parents[2]
SDKS = {line: ROOT / ".jobfair" / f"camunda-sdk-{line}" / "bin" / "python" for line in (9, 10)}
FLOW = ROOT / "tests" / "sdk" / "camunda_sdk_flow.py"


@pytest.fixture
def background():
    return True


@pytest.fixture
def settings():
    return quiet_settings(lease_sweep_interval_ms=50)


async def run_sdk(live, line: int, *args: str) -> dict[str, Any]:
    python = SDKS[line]
    assert python.exists(), f"Camunda's SDK {line}.x is not installed: `make test` installs it"
    env = {**os.environ, "CAMUNDA_REST_ADDRESS": f"{live.url}/v2", "CAMUNDA_AUTH_STRATEGY": "NONE"}
    proc = await asyncio.create_subprocess_exec(
        str(python),
        str(FLOW),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
    assert proc.returncode == 0, err.decode()[-4000:]
    seen: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    seen["_stderr"] = err.decode()[-4000:]  # the SDK's own log, for a failure's message
    return seen


@pytest.mark.parametrize("line", [9, 10])
async def test_camunda_sdk_calls(live, line):
    c = live.client
    r = await c.post(
        "/v2/jobs/batch",
        json={"jobs": [{"type": "sdk", "variables": {"amount": 5}}] + [{"type": "sdk"}] * 3},
    )
    keys = r.json()["jobKeys"]
    await c.post("/v2/jobs", json={"type": "lease"})

    seen = await run_sdk(live, line, "flow")

    assert seen["leases"] is (line >= 10)
    assert seen["clusterSize"] == 1
    assert seen["activated"] == keys
    assert seen["firstVariables"] == {"amount": 5}
    assert seen["completeAgain"] == "ConflictError"
    assert seen["errorAgain"] == "ConflictError"
    assert seen["missing"] == "NotFoundError"
    paid, declined, no_stock, slow = [(await c.get(f"/v2/jobs/{k}")).json() for k in keys]
    assert paid["state"] == "COMPLETED" and paid["variables"] == {"amount": 5, "paid": True}
    assert declined["state"] == "CREATED" and declined["retries"] == 2
    assert declined["errorMessage"] == "card declined"
    assert no_stock["state"] == "ERROR_THROWN" and no_stock["errorCode"] == "NO_STOCK"
    assert slow["state"] == "ACTIVATED" and slow["retries"] == 7
    # timeout 600 s: the lease now ends about ten minutes out, not thirty seconds.
    deadline = datetime.fromisoformat(slow["deadline"].replace("Z", "+00:00"))
    assert deadline > datetime.now(UTC) + timedelta(minutes=9)
    assert seen["search"] == sorted(
        [
            [keys[0], "COMPLETED", 3],
            [keys[1], "CREATED", 2],
            [keys[2], "ERROR_THROWN", 3],
            [keys[3], "CREATED", 7],
        ]
    )
    if line >= 10:
        assert seen["staleComplete"] == "ConflictError"
        assert seen["currentComplete"] == "ok"


@pytest.mark.parametrize("line", [9, 10])
async def test_camunda_job_worker_drains_two_tenants_by_weight(live, line):
    c = live.client
    for tenant, weight in (("light", 1), ("heavy", 3)):
        assert (await c.put(f"/v2/tenants/{tenant}", json={"weight": weight})).status_code == 200
    # Both tenants stay backlogged until the end: 125 and 375 jobs at weights 1:3.
    for tenant, n in (("light", 125), ("heavy", 375)):
        r = await c.post(
            "/v2/jobs/batch", json={"jobs": [{"type": "drain", "tenantId": tenant}] * n}
        )
        assert r.status_code == 201

    seen = await run_sdk(live, line, "worker", "drain", "500", "50")

    order = seen["order"]
    assert len(order) == 500, seen["_stderr"]  # a job handled twice: what the SDK saw
    shares = Counter(order[:400])
    assert abs(shares["heavy"] / 400 - 0.75) <= 0.03, shares
    search = await c.post(
        "/v2/jobs/search",
        json={"filter": {"type": "drain", "state": "COMPLETED"}, "page": {"limit": 1}},
    )
    assert search.json()["page"]["totalItems"] == 500
