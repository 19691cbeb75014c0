"""Issue 4: Camunda's JavaScript SDK (@camunda8/sdk 8.8, Node 20) against a live Jobfair:
activate, complete, fail, and a stale completion surfaced as the SDK's HTTP 409 error.

``make test`` installs the SDK under .jobfair/camunda-js; the SDK runs in Node
(tests/sdk/camunda_js_flow.cjs) and reports what it saw as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIX = ROOT / ".jobfair" / "camunda-js"
FLOW = ROOT / "tests" / "sdk" / "camunda_js_flow.cjs"


async def test_camunda_js_sdk_activates_completes_and_fails(live):
    node = shutil.which("node")
    assert node, "Node.js is required for this test"
    assert (PREFIX / "node_modules" / "@camunda8" / "sdk").is_dir(), "run `make test` first"
    c = live.client
    r = await c.post(
        "/v2/jobs/batch",
        json={"jobs": [{"type": "js", "variables": {"amount": 5}}, {"type": "js"}, {"type": "js"}]},
    )
    keys = r.json()["jobKeys"]
    env = {
        **os.environ,
        "CAMUNDA_JS_PREFIX": str(PREFIX),
        "ZEEBE_REST_ADDRESS": live.url,
        "CAMUNDA_AUTH_STRATEGY": "NONE",
    }
    proc = await asyncio.create_subprocess_exec(
        node, str(FLOW), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()[-4000:]
    seen = json.loads(out.decode().strip().splitlines()[-1])

    assert seen["clusterSize"] == 1
    assert seen["activated"] == keys
    assert seen["firstVariables"] == {"amount": 5}
    assert seen["complete"] == seen["fail"] == seen["jobComplete"] == "ok"
    assert seen["completeAgain"] == "HTTPError 409"
    assert seen["failAgain"] == "HTTPError 409"
    assert seen["missing"] == "HTTPError 404"
    paid, declined, third = [(await c.get(f"/v2/jobs/{k}")).json() for k in keys]
    assert paid["state"] == "COMPLETED" and paid["variables"] == {"amount": 5, "paid": True}
    assert declined["state"] == "CREATED" and declined["retries"] == 2
    assert declined["errorMessage"] == "card declined"
    assert third["state"] == "COMPLETED" and third["variables"] == {"by": "job.complete"}
