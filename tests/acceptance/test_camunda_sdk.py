"""Issue 4: Camunda's own Python SDK (10.x, strict response validation) against Jobfair."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDK10 = ROOT / ".jobfair" / "camunda-sdk-10" / "bin" / "python"


async def test_camunda_python_sdk_10_activates_completes_fails_and_searches(live):
    assert SDK10.exists(), "Camunda's SDK is not installed: run `make test`, which installs it"
    c = live.client
    r = await c.post(
        "/v2/jobs/batch",
        json={
            "jobs": [{"type": "sdk", "variables": {"amount": 5}}, {"type": "sdk"}, {"type": "sdk"}]
        },
    )
    keys = r.json()["jobKeys"]
    env = {**os.environ, "CAMUNDA_REST_ADDRESS": f"{live.url}/v2", "CAMUNDA_AUTH_STRATEGY": "NONE"}
    proc = await asyncio.create_subprocess_exec(
        str(SDK10),
        str(ROOT / "tests" / "sdk" / "camunda_sdk_flow.py"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["clusterSize"] == 1
    assert seen["activated"] == keys
    assert seen["firstVariables"] == {"amount": 5}
    assert seen["secondComplete"] == "ConflictError"
    assert seen["search"] == sorted(
        [[keys[0], "COMPLETED", 3], [keys[1], "CREATED", 2], [keys[2], "CREATED", 3]]
    )
    failed = (await c.get(f"/v2/jobs/{keys[1]}")).json()
    assert failed["errorMessage"] == "card declined" and failed["retries"] == 2
    done = (await c.get(f"/v2/jobs/{keys[0]}")).json()
    assert done["state"] == "COMPLETED" and done["variables"] == {"amount": 5, "paid": True}
