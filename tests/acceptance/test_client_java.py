"""clients/java: its JUnit 5 suite (compiled and run by clients/java/build.sh) against a
live Jobfair on embedded PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.fixtures import quiet_settings

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "java"
JUNIT = Path("/usr/share/java/junit-platform-console-standalone.jar")
HAVE_JUNIT = JUNIT.exists()


@pytest.fixture
def background():
    return True


@pytest.fixture
def settings():
    # Fast lease sweep and promotion (heartbeat and retry tests); 3 waiters (the 503 test).
    return quiet_settings(lease_sweep_interval_ms=50, promote_interval_ms=50, max_waiters=3)


async def test_java_client_suite(live):
    assert shutil.which("javac"), "a JDK 17 is required"
    assert HAVE_JUNIT, "Debian's junit5 package is required: `make test` installs it"
    proc = await asyncio.create_subprocess_exec(
        str(CLIENT / "build.sh"),
        "test",
        env={**os.environ, "JOBFAIR_URL": live.url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=400)
    report = out.decode()
    assert proc.returncode == 0, report[-6000:]
    assert "11 tests successful" in report, report[-3000:]
    assert "0 tests failed" in report, report[-3000:]
