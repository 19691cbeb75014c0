"""clients/examples: each language's two-tenant demo, run against a live Jobfair; the
trickle tenant's 10 jobs must come out near the front, not behind the 1,000-job flood."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "clients" / "examples"

COMMANDS = {
    "python": [sys.executable, str(EXAMPLES / "two_tenants.py")],
    "typescript": ["node", str(EXAMPLES / "two_tenants.mjs")],
    # The jar: built by clients/java/build.sh (into the test's own folder here).
    "java": ["java", "-cp", "{build}/jobfair-client.jar", str(EXAMPLES / "TwoTenants.java")],
}


# The Python demo in `make test`; the TypeScript and Java ones (whose clients' own suites
# run there) in `make extended`, for time (issue 39 section 3).
@pytest.mark.parametrize(
    "language",
    [
        pytest.param(lang, marks=() if lang == "python" else pytest.mark.extended)
        for lang in COMMANDS
    ],
)
async def test_two_tenant_demo(live, language, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "clients" / "python")}
    if language == "java":  # its own build folder: other tests build the client at once
        env["JOBFAIR_JAVA_BUILD"] = str(tmp_path / "java")
        build = await asyncio.create_subprocess_exec(
            str(ROOT / "clients" / "java" / "build.sh"), env=env
        )
        assert await build.wait() == 0
    command = [part.format(build=tmp_path / "java") for part in COMMANDS[language]]
    proc = await asyncio.create_subprocess_exec(
        *command,
        live.url,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
    text = out.decode()
    assert proc.returncode == 0, text[-3000:]
    done_by = int(re.search(r"TRICKLE_DONE_BY=(\d+)", text).group(1))
    # Equal weights: the trickle gets every other activation while it has work, so its
    # 10 jobs are out within the first few batches (4 handlers), not after 1,000.
    assert done_by <= 40, text
    print(f"{language}: {text.strip().splitlines()[-2]}")
