"""Issue 22: Camunda's SDKs authenticate against Jobfair unchanged, configured as their
own documentation says: ``CAMUNDA_AUTH_STRATEGY=BASIC`` (user = key id, password = the
key's secret) and ``CAMUNDA_AUTH_STRATEGY=OAUTH`` (client credentials at Jobfair's
``/oauth/token``).  Each of the Python SDK's 9.x and 10.x lines and the JS SDK, with each
strategy, activates and completes the jobs of its key's tenant, is never handed another
tenant's, and gets its own error for a 403 when it names a tenant outside the key's scope.

The SDKs run in subprocesses (tests/sdk/camunda_sdk_flow.py ``auth``, and
tests/sdk/camunda_js_flow.cjs ``auth``), configured only through the environment, as an
application would configure them.  What each sends, read from their sources:

- Python (camunda-orchestration-sdk 9.0.1, 10.0.1): BASIC sends
  ``CAMUNDA_BASIC_AUTH_USERNAME`` / ``_PASSWORD`` as HTTP Basic; OAUTH posts a form
  (grant_type, client_id, client_secret, audience = ``CAMUNDA_TOKEN_AUDIENCE``, by
  default ``zeebe.camunda.io``) to ``CAMUNDA_OAUTH_URL`` with ``CAMUNDA_CLIENT_ID`` /
  ``CAMUNDA_CLIENT_SECRET``.  An activation carries no ``tenantIds`` unless the caller
  (or 10.x's ``CAMUNDA_TENANT_IDS``) names some: Jobfair then draws from the key's.
- JS (@camunda8/sdk 8.8): BASIC as above; OAUTH posts the same form (audience =
  ``ZEEBE_TOKEN_AUDIENCE``, by default ``zeebe.camunda.io``) with ``ZEEBE_CLIENT_ID`` /
  ``ZEEBE_CLIENT_SECRET``, and caches the token on disk (``CAMUNDA_TOKEN_CACHE_DIR``,
  by default ~/.camunda).  An activation always carries ``tenantIds:
  [CAMUNDA_TENANT_ID]``, and that defaults to ``<default>``: a key scoped to other
  tenants needs ``CAMUNDA_TENANT_ID`` set to one of them (here ``acme``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.keys import Role
from tests.fixtures import Live, quiet_settings

ROOT = Path(__file__).resolve().parents[2]
PYTHON_SDKS = {
    line: ROOT / ".jobfair" / f"camunda-sdk-{line}" / "bin" / "python" for line in (9, 10)
}
PYTHON_FLOW = ROOT / "tests" / "sdk" / "camunda_sdk_flow.py"
JS_PREFIX = ROOT / ".jobfair" / "camunda-js"
JS_FLOW = ROOT / "tests" / "sdk" / "camunda_js_flow.cjs"

TYPE = "sdk-auth"
TENANT = "acme"  # the worker key's one tenant
OUTSIDE = "globex"  # a tenant the key may not use


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(auth="required")


def credentials(sdk: str, strategy: str, live: Live, key_id: str, secret: str) -> dict[str, str]:
    """The environment that configures ``sdk`` for ``strategy``, in the SDK's own names."""
    if strategy == "BASIC":
        return {
            "CAMUNDA_AUTH_STRATEGY": "BASIC",
            "CAMUNDA_BASIC_AUTH_USERNAME": key_id,
            "CAMUNDA_BASIC_AUTH_PASSWORD": secret,
        }
    prefix = "ZEEBE" if sdk == "js" else "CAMUNDA"
    return {
        "CAMUNDA_AUTH_STRATEGY": "OAUTH",
        "CAMUNDA_OAUTH_URL": f"{live.url}/oauth/token",
        f"{prefix}_CLIENT_ID": key_id,
        f"{prefix}_CLIENT_SECRET": secret,
    }


async def run(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    # The SDKs read their settings from the environment: none of the caller's leak in.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CAMUNDA_", "ZEEBE_"))}
    proc = await asyncio.create_subprocess_exec(
        *command,
        env={**base, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()[-4000:]
    seen: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return seen


async def run_sdk(
    sdk: str, live: Live, auth: dict[str, str], tmp_path: Path, *, assigned: bool = False
) -> dict[str, Any]:
    """The SDK's ``auth`` run; ``assigned``: its first activation asks for tenantFilter
    ASSIGNED (and the JS SDK is left its default CAMUNDA_TENANT_ID, ``<default>``)."""
    mode = ["auth", TYPE, OUTSIDE, *(["assigned"] if assigned else [])]
    if sdk == "js":
        node = shutil.which("node")
        assert node, "Node.js is required for this test"
        assert (JS_PREFIX / "node_modules" / "@camunda8" / "sdk").is_dir(), "run `make test`"
        env = {
            "CAMUNDA_JS_PREFIX": str(JS_PREFIX),
            "ZEEBE_REST_ADDRESS": live.url,
            **({} if assigned else {"CAMUNDA_TENANT_ID": TENANT}),
            "CAMUNDA_TOKEN_CACHE_DIR": str(tmp_path / "camunda-tokens"),
            **auth,
        }
        return await run([node, str(JS_FLOW), *mode], env)
    python = PYTHON_SDKS[int(sdk)]
    assert python.exists(), f"Camunda's SDK {sdk}.x is not installed: `make test` installs it"
    env = {"CAMUNDA_REST_ADDRESS": f"{live.url}/v2", **auth}
    return await run([str(python), str(PYTHON_FLOW), *mode], env)


async def jobs_and_key(live: Live) -> tuple[dict[str, str], list[str], str, str]:
    """An admin's headers; jobs of TENANT, OUTSIDE, TENANT; a worker key for TENANT and
    TYPE (its id and secret)."""
    _, admin = await live.services.keys.create(Role.ADMIN, None, None, None, None, "test")
    as_admin = {"Authorization": f"Bearer {admin}"}
    jobs = [{"type": TYPE, "tenantId": t} for t in (TENANT, OUTSIDE, TENANT)]
    r = await live.client.post("/v2/jobs/batch", json={"jobs": jobs}, headers=as_admin)
    assert r.status_code == 201, r.text
    row, secret = await live.services.keys.create(
        Role.WORKER, [TENANT], [TYPE], "camunda-sdk", None, "test"
    )
    return as_admin, r.json()["jobKeys"], row.key_id, secret


async def states(live: Live, as_admin: dict[str, str], keys: list[str]) -> list[str]:
    return [
        (await live.client.get(f"/v2/jobs/{k}", headers=as_admin)).json()["state"] for k in keys
    ]


@pytest.mark.parametrize("strategy", ["BASIC", "OAUTH"])
@pytest.mark.parametrize("sdk", ["9", "10", "js"])
async def test_camunda_sdk_authenticates_and_is_held_to_its_tenants(
    live: Live, sdk: str, strategy: str, tmp_path: Path
):
    as_admin, keys, key_id, secret = await jobs_and_key(live)
    mine, theirs, mine_too = keys

    seen = await run_sdk(sdk, live, credentials(sdk, strategy, live, key_id, secret), tmp_path)

    assert sorted(map(tuple, seen["activated"])) == sorted([(mine, TENANT), (mine_too, TENANT)])
    assert seen["completed"] == ["ok", "ok"]
    # Camunda's API documents no 403 for an activation, so the Python SDK raises its
    # error for an undocumented status (not ForbiddenError), with the status on it.
    assert seen["outside"] == ("HTTPError 403" if sdk == "js" else "UnexpectedStatus 403")
    if strategy == "BASIC":
        assert seen["scheme"] == "Basic"
    else:
        # The SDK's bearer token is one Jobfair's /oauth/token issued for this key.
        assert seen["scheme"] == "Bearer"
        principal = await live.services.keys.verify_access_token(seen["accessToken"])
        assert principal is not None and principal.key_id == key_id
    assert await states(live, as_admin, keys) == ["COMPLETED", "CREATED", "COMPLETED"]


@pytest.mark.parametrize("sdk", ["10", "js"])  # js: its default tenant is sent along
async def test_tenant_filter_assigned_draws_from_the_keys_tenants(
    live: Live, sdk: str, tmp_path: Path
):
    """Camunda's "the tenants assigned to me": the key's, whatever ``tenantIds`` says
    (the JS SDK still sends ``["<default>"]``, a tenant this key may not use)."""
    as_admin, keys, key_id, secret = await jobs_and_key(live)
    mine, theirs, mine_too = keys

    auth = credentials(sdk, "BASIC", live, key_id, secret)
    seen = await run_sdk(sdk, live, auth, tmp_path, assigned=True)

    assert sorted(map(tuple, seen["activated"])) == sorted([(mine, TENANT), (mine_too, TENANT)])
    assert seen["completed"] == ["ok", "ok"]
    assert await states(live, as_admin, keys) == ["COMPLETED", "CREATED", "COMPLETED"]
