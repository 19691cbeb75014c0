"""A scoped key's explanation: only of the jobs it may see (404 otherwise, as reading the
job), and its lane's shares among the lanes it may see alone."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.keys import Role
from tests.acceptance.test_security import bearer, make_key
from tests.fixtures import Live, quiet_settings
from tests.helpers import assert_problem, enqueue


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(auth="required")


async def test_a_scoped_key_explains_its_jobs_alone(live: Live):
    c = live.client
    _, admin = await make_key(live, Role.ADMIN)
    c.headers.update(bearer(admin))
    await c.put("/v2/tenants/acme", json={"weight": 3})
    [mine] = await enqueue(c, "mail", "acme", 1)
    [theirs] = await enqueue(c, "mail", "globex", 1)
    _, scoped = await make_key(live, Role.WORKER, ["acme"])
    c.headers.update(bearer(scoped))
    e = (await c.get(f"/v2/jobs/{mine}/explain")).json()
    assert e["tenantId"] == "acme" and e["lane"]["weight"] == 3
    assert e["lane"]["configuredShare"] == 1.0  # among the lanes it may see: its own
    assert_problem(await c.get(f"/v2/jobs/{theirs}/explain"), 404)
    c.headers.pop("Authorization")
    assert (await c.get(f"/v2/jobs/{mine}/explain")).status_code == 401
