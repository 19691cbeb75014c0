"""The TypeScript and Java clients with API keys, against a live Jobfair that requires
them, over plain HTTP and over HTTPS (a certificate of the test's own CA): a focused test
of each (clients/typescript/test/auth.test.mjs, clients/java/.../AuthTest.java), not their
whole suites again.  Each gets an admin key and a worker key scoped to tenant acme."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from app.keys import Role
from tests.fixtures import Live, Tls, quiet_settings

CLIENTS = Path(__file__).resolve().parents[2] / "clients"
JUNIT = Path("/usr/share/java/junit-platform-console-standalone.jar")
HAVE_JUNIT = JUNIT.exists()


@pytest.fixture
def settings():
    return quiet_settings(auth="required")


@pytest.fixture
async def env(live: Live, live_tls: str, tls: Tls) -> dict[str, str]:
    _, admin = await live.services.keys.create(Role.ADMIN, None, None, None, None, "test")
    _, worker = await live.services.keys.create(Role.WORKER, ["acme"], None, None, None, "test")
    return {
        **os.environ,
        "JOBFAIR_AUTH_URLS": f"{live.url},{live_tls}",
        "JOBFAIR_ADMIN_KEY": admin,
        "JOBFAIR_WORKER_KEY": worker,
        "JOBFAIR_CA": str(tls.ca),
    }


async def run(cwd: Path, env: dict[str, str], *command: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


# Node's fetch without the CA: the code of the error it fails with.
FETCH = "fetch(process.argv[1]).then(() => console.log('ok'), (e) => console.log(e.cause?.code))"


async def test_typescript_client_with_keys_over_http_and_https(env, live_tls, tls: Tls):
    node = shutil.which("node")
    assert node, "Node.js 18+ is required"
    client = CLIENTS / "typescript"
    assert (client / "dist" / "index.js").exists(), "run `make test`, which builds the client"
    # Node's fetch trusts the CAs of NODE_EXTRA_CA_CERTS besides its own: no client option.
    code, report = await run(
        client,
        {**env, "NODE_EXTRA_CA_CERTS": str(tls.ca)},
        *(node, "--test", "--test-reporter=spec", "test/auth.test.mjs"),
    )
    assert code == 0 and "ℹ pass 2" in report and "ℹ fail 0" in report, report[-3000:]
    # Without it, the certificate is refused: the CA is what makes the calls above work.
    plain = {k: v for k, v in env.items() if k != "NODE_EXTRA_CA_CERTS"}
    _, answer = await run(client, plain, node, "-e", FETCH, f"{live_tls}/healthz")
    assert answer.strip() == "UNABLE_TO_VERIFY_LEAF_SIGNATURE", answer
    _, answer = await run(
        client, {**plain, "NODE_EXTRA_CA_CERTS": str(tls.ca)}, node, "-e", FETCH, live_tls
    )
    assert answer.strip() == "ok", answer


async def test_java_client_with_keys_over_http_and_https(env, tmp_path):
    assert shutil.which("javac"), "a JDK 17 is required"
    assert HAVE_JUNIT, "Debian's junit5 package is required: `make test` installs it"
    client = CLIENTS / "java"
    code, report = await run(
        client,
        {**env, "JOBFAIR_JAVA_BUILD": str(tmp_path / "java")},  # its own: builds run at once
        *(str(client / "build.sh"), "test", "--select-class", "dev.jobfair.client.AuthTest"),
    )
    assert code == 0, report[-6000:]
    assert "3 tests successful" in report and "0 tests failed" in report, report[-3000:]
