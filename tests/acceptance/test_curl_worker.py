"""clients/curl.md: its worker script, taken from the document as written, drains jobs
against a live Jobfair (completing what ./handle accepts, failing what it rejects)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import stat
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HANDLE = """#!/bin/sh
# Accepts a job unless its variables say {"bad": true}; prints the result variables.
vars=$(cat)
if echo "$vars" | jq -e '.bad == true' >/dev/null; then exit 1; fi
echo '{"handledBy": "curl"}'
"""


def worker_script() -> str:
    text = (ROOT / "clients" / "curl.md").read_text()
    [script] = [
        block for block in re.findall(r"```sh\n(.*?)```", text, re.S) if "#!/bin/sh" in block
    ]
    return script


async def test_the_documented_curl_worker_drains_jobs(live, tmp_path):
    assert shutil.which("curl") and shutil.which("jq"), "curl and jq are required"
    (tmp_path / "worker.sh").write_text(worker_script())
    (tmp_path / "handle").write_text(HANDLE)
    for name in ("worker.sh", "handle"):
        (tmp_path / name).chmod(stat.S_IRWXU)
    c = live.client
    good = (await c.post("/v2/jobs/batch", json={"jobs": [{"type": "send-email"}] * 5})).json()
    bad = (
        await c.post(
            "/v2/jobs", json={"type": "send-email", "retries": 1, "variables": {"bad": True}}
        )
    ).json()
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "worker.sh",
        cwd=tmp_path,
        env={**os.environ, "JOBFAIR_URL": live.url},
        start_new_session=True,  # so that its curl children go with it
    )
    try:

        async def finished() -> None:
            while True:
                states = [
                    (await c.get(f"/v2/jobs/{k}")).json()["state"]
                    for k in [*good["jobKeys"], bad["jobKey"]]
                ]
                if states == ["COMPLETED"] * 5 + ["FAILED"]:
                    return
                await asyncio.sleep(0.1)  # noqa: ASYNC110 - the script has no event to await

        await asyncio.wait_for(finished(), timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    done = (await c.get(f"/v2/jobs/{good['jobKeys'][0]}")).json()
    assert done["variables"] == {"handledBy": "curl"}
    failed = (await c.get(f"/v2/jobs/{bad['jobKey']}")).json()
    assert failed["retries"] == 0 and failed["errorMessage"] == "handle exited non-zero"
