"""`jobfair keys` against the database directly, start-up with auth, and the audit log
(API.md "Security"): what a new user does first, run as they would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
from typer.testing import CliRunner

from app.cli.main import cli
from tests.fixtures import free_port, wait_ready

SECRET_VARIABLE = "sesame-variable-4411"


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def jobfair(*args: str, env: dict[str, str] | None = None) -> Ran:
    """The ``jobfair`` command, run in this process (a new Python would cost ~1.7 s a
    call); the first-session test below runs it as its own process, as a user does."""
    result = CliRunner().invoke(cli, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def jobfair_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
    )


def start_public_server(port: int, data_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """`jobfair serve` on every address, on an embedded database in ``data_dir``, with
    no JOBFAIR_* setting (as a new user runs it)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", str(port),
             "--data-dir", str(data_dir)],
            env={k: v for k, v in os.environ.items() if not k.startswith("JOBFAIR_")},
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def test_keys_create_list_revoke_on_a_database_url(db_url: str):
    made = jobfair("keys", "create", "--role", "worker", "--tenants", "a,b", "--types",
                   "mail", "--name", "mailer", "--database-url", db_url)  # fmt: skip
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[-1]
    assert secret.startswith("jf_") and len(secret) > 60
    key_id = secret.split("_")[1]
    listed = jobfair("keys", "list", "--database-url", db_url)
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if line.startswith(key_id)]
    assert "worker" in row and "a,b" in row and "mail" in row and "mailer" in row
    assert secret not in listed.stdout and secret.split("_", 2)[2] not in listed.stdout
    revoked = jobfair("keys", "revoke", key_id, "--database-url", db_url)
    assert revoked.returncode == 0 and key_id in revoked.stdout
    listed = jobfair("keys", "list", "--database-url", db_url)
    [row] = [line for line in listed.stdout.splitlines() if line.startswith(key_id)]
    assert row.split()[-1] != "-"  # revokedAt is set
    assert jobfair("keys", "revoke", "ffffffffffffffff", "--database-url", db_url).returncode == 1
    assert jobfair("keys", "revoke", "not-an-id", "--database-url", db_url).returncode == 2


def test_keys_create_refuses_bad_options_and_changes_nothing(db_url: str):
    for bad in (
        ["--role", "root"],
        ["--role", "worker", "--tenants", "a,,b"],
        ["--role", "worker", "--types", "a b"],
        ["--role", "worker", "--expires", "2001-01-01T00:00:00Z"],
        ["--role", "admin", "--tenants", "a"],  # an admin has every tenant
    ):
        r = jobfair("keys", "create", *bad, "--database-url", db_url)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert "jf_" not in r.stdout
    listed = jobfair("keys", "list", "--database-url", db_url)
    assert len(listed.stdout.strip().splitlines()) == 1  # the header alone


def test_auth_off_on_a_public_address_is_refused_with_what_to_run(db_url: str):
    r = jobfair("serve", "--host", "0.0.0.0", "--port", str(free_port()),
                env={"JOBFAIR_AUTH": "off", "JOBFAIR_DATABASE_URL": db_url})  # fmt: skip
    assert r.returncode == 2
    assert "jobfair keys create --role admin" in r.stderr and "loopback" in r.stderr


async def test_first_key_on_a_running_embedded_server_and_nothing_secret_in_the_logs(
    tmp_path: Path,
):
    """A new user's first session: `jobfair serve` on a public address (auth required by
    default) with the embedded database, the first admin key made with the CLI on the same
    data folder while it runs, then keys, jobs and tokens over HTTP.  The server's whole
    log names the key ids that changed things and never a secret, token or variable."""
    data_dir = tmp_path / "data"
    port = free_port()
    log_path = tmp_path / "server.log"
    server = start_public_server(port, data_dir, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        from tests.fixtures import ServerProcess

        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            await wait_ready(c, ServerProcess(server, url, log_path))
            assert (await c.post("/v2/jobs", json={"type": "t"})).status_code == 401
            made = jobfair_process("keys", "create", "--role", "admin", "--data-dir", str(data_dir))
            assert made.returncode == 0, made.stderr
            admin = made.stdout.strip().splitlines()[-1]
            admin_id = admin.split("_")[1]
            h = {"Authorization": f"Bearer {admin}"}
            r = await c.post(
                "/v2/keys", json={"role": "worker", "tenants": ["acme"], "types": "*"}, headers=h
            )
            worker, worker_id = r.json()["secret"], r.json()["keyId"]
            assert (
                await c.put("/v2/tenants/acme", json={"weight": 2}, headers=h)
            ).status_code == 200
            job = {"type": "t", "tenantId": "acme", "variables": {"v": SECRET_VARIABLE}}
            assert (await c.post("/v2/jobs", json=job, headers=h)).status_code == 201
            w = {"Authorization": f"Bearer {worker}"}
            act = {"type": "t", "maxJobs": 1, "timeout": 60000, "requestTimeout": -1}
            [got] = (await c.post("/v2/jobs/activate", json=act, headers=w)).json()["jobs"]
            assert got["variables"] == {"v": SECRET_VARIABLE}
            r = await c.post(
                f"/v2/jobs/{got['jobKey']}/fail",
                json={"activationCount": 1, "retries": 0, "errorMessage": "x",
                      "variables": {"v2": SECRET_VARIABLE}},
                headers=w,
            )  # fmt: skip
            assert r.status_code == 204
            form = {"grant_type": "client_credentials", "client_id": worker_id,
                    "client_secret": worker}  # fmt: skip
            access = (await c.post("/oauth/token", data=form)).json()["access_token"]
            assert (
                await c.get("/v2/topology", headers={"Authorization": f"Bearer {access}"})
            ).status_code == 200
            bad = {"Authorization": f"Bearer {worker}x"}
            assert (await c.get("/v2/topology", headers=bad)).status_code == 401
            assert (await c.delete(f"/v2/keys/{worker_id}", headers=h)).status_code == 204
    finally:
        server.terminate()
        server.wait(timeout=60)
    text = log_path.read_text() + made.stderr + made.stdout.rsplit(admin, 1)[0]
    for secret in (admin, worker, access, worker.split("_", 2)[2], SECRET_VARIABLE):
        assert secret not in text, f"{secret[:12]}... is in the log"
    assert f"key created: {worker_id} role=worker tenants=acme types=* by={admin_id}" in text
    assert f"key revoked: {worker_id} by={admin_id}" in text
    configured = (
        "tenant configured: acme weight=2 maxActiveJobs=None minActiveJobs=None rateLimit=none"
    )
    assert f"{configured} by={admin_id}" in text
    assert "API keys are required" in text
