"""The TypeScript and Java clients' own suites (node:test, JUnit 5) against a live Jobfair
on embedded PostgreSQL, JOBFAIR_URL pointing at it.

``make test`` builds the TypeScript client (its compiler is its one dev dependency) and
installs Debian's junit5 for the Java one, whose suite ``clients/java/build.sh test``
compiles and runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.answer_dropper import AnswerDropper
from tests.fixtures import quiet_settings

CLIENTS = Path(__file__).resolve().parents[2] / "clients"
JUNIT = Path("/usr/share/java/junit-platform-console-standalone.jar")
HAVE_JUNIT = JUNIT.exists()


@pytest.fixture
def background():
    return True


@pytest.fixture
def settings():
    # Fast lease sweep and promotion (heartbeat and retry tests); 3 waiters (the 503 test).
    return quiet_settings(lease_sweep_interval_ms=50, promote_interval_ms=50, max_waiters=3)


async def run_suite(live, cwd: Path, *command: str, **env: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env={**os.environ, "JOBFAIR_URL": live.url, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=400)
    report = out.decode()
    assert proc.returncode == 0, report[-6000:]
    return report


async def test_typescript_client_suite(live):
    node = shutil.which("node")
    assert node, "Node.js 18+ is required"
    client = CLIENTS / "typescript"
    assert (client / "dist" / "index.js").exists(), "run `make test`, which builds the client"
    async with AnswerDropper.serving(live.url, every=2) as dropper:
        report = await run_suite(
            live, client, node, "--test", "--test-concurrency=1", "--test-reporter=spec", "test/",
            JOBFAIR_DROPPING_URL=dropper.url,
        )  # fmt: skip
    assert "ℹ fail 0" in report and "ℹ pass 28" in report, report[-3000:]
    assert dropper.dropped >= 5


async def test_java_client_suite(live, tmp_path):
    assert shutil.which("javac"), "a JDK 17 is required"
    assert HAVE_JUNIT, "Debian's junit5 package is required: `make test` installs it"
    client = CLIENTS / "java"
    # Its own build folder: other tests build the client at the same time.
    build = {"JOBFAIR_JAVA_BUILD": str(tmp_path / "java")}
    async with AnswerDropper.serving(live.url, every=2) as dropper:
        build["JOBFAIR_DROPPING_URL"] = dropper.url
        report = await run_suite(live, client, str(client / "build.sh"), "test", **build)
    # Its tracing test runs where OpenTelemetry's jars are (build.sh says which).
    traced = "OpenTelemetry SDK: its test runs" in report
    assert traced or "its test left out" in report, report[:2000]
    expected = 24 if traced else 23
    assert f"{expected} tests successful" in report and "0 tests failed" in report, report[-3000:]
    assert dropper.dropped >= 5
