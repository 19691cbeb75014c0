"""clients/curl.md: its worker script, taken from the document as written, drains jobs
against a live Jobfair (completing what ./handle accepts, failing what it rejects): over
plain HTTP without keys, and over HTTPS (CURL_CA_BUNDLE) with a tenant-scoped key that
never shows on a command line."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import stat
from pathlib import Path

import psutil
import pytest

from app.config import Settings
from app.domain import DEFAULT_TENANT
from app.keys import Role
from tests.fixtures import Live, Tls, quiet_settings

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


@pytest.fixture(params=["http", "https with a key"])
def keys(request) -> bool:
    return request.param != "http"


@pytest.fixture
def settings(keys: bool) -> Settings:
    return quiet_settings(auth="required") if keys else quiet_settings()


def command_lines(session: int) -> list[str]:
    """What ``ps`` shows of the script's processes (its session)."""
    lines = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(p.pid) == session:
                lines.append(" ".join(p.info["cmdline"] or []))
        except (ProcessLookupError, PermissionError):
            pass
    return lines


async def test_the_documented_curl_worker_drains_jobs(
    live: Live, live_tls: str, tls: Tls, tmp_path, keys: bool
):
    assert shutil.which("curl") and shutil.which("jq"), "curl and jq are required"
    (tmp_path / "worker.sh").write_text(worker_script())
    (tmp_path / "handle").write_text(HANDLE)
    for name in ("worker.sh", "handle"):
        (tmp_path / name).chmod(stat.S_IRWXU)
    c = live.client
    env = {**os.environ, "JOBFAIR_URL": live.url}
    env.pop("JOBFAIR_API_KEY", None)
    if keys:
        _, admin = await live.services.keys.create(Role.ADMIN, None, None, None, None, "t")
        c.headers["Authorization"] = f"Bearer {admin}"
        _, secret = await live.services.keys.create(
            Role.WORKER, [DEFAULT_TENANT], None, None, None, "t"
        )
        env |= {
            "JOBFAIR_URL": live_tls,
            "JOBFAIR_API_KEY": secret,
            "CURL_CA_BUNDLE": str(tls.ca),
        }
    good = (await c.post("/v2/jobs/batch", json={"jobs": [{"type": "send-email"}] * 5})).json()
    bad = (
        await c.post(
            "/v2/jobs", json={"type": "send-email", "retries": 1, "variables": {"bad": True}}
        )
    ).json()
    # Another tenant's: out of the key's scope (and, without keys, done like the others).
    other = (await c.post("/v2/jobs", json={"type": "send-email", "tenantId": "globex"})).json()
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "worker.sh",
        cwd=tmp_path,
        env=env,
        start_new_session=True,  # so that its curl children go with it
    )
    seen: list[str] = []
    try:

        async def finished() -> None:
            while True:
                seen.extend(command_lines(proc.pid))
                states = [
                    (await c.get(f"/v2/jobs/{k}")).json()["state"]
                    for k in [*good["jobKeys"], bad["jobKey"]]
                ]
                if states == ["COMPLETED"] * 5 + ["FAILED"]:
                    return
                await asyncio.sleep(0.1)  # noqa: ASYNC110 - the script has no event to await

        await asyncio.wait_for(finished(), timeout=60)

        async def curl_seen() -> None:
            # Each of the script's curl calls may fall between two samples; its next long
            # poll (which waits: the other tenant's job is out of a key's scope, or taken)
            # is the one sure to be seen.
            while not any("curl" in line for line in seen):
                seen.extend(command_lines(proc.pid))
                await asyncio.sleep(0.05)  # noqa: ASYNC110 - no event tells a process started

        await asyncio.wait_for(curl_seen(), timeout=30)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    done = (await c.get(f"/v2/jobs/{good['jobKeys'][0]}")).json()
    assert done["variables"] == {"handledBy": "curl"}
    failed = (await c.get(f"/v2/jobs/{bad['jobKey']}")).json()
    assert failed["retries"] == 0 and failed["errorMessage"] == "handle exited non-zero"
    if keys:
        assert (await c.get(f"/v2/jobs/{other['jobKey']}")).json()["state"] == "CREATED"
        assert not [line for line in seen if env["JOBFAIR_API_KEY"] in line]
