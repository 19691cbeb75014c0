"""The dashboard with auth required: it signs in with an API key, an admin sees every
tenant, and a scoped key sees only its own in every view, without ever asking the API
for more than the key may see (issue 25)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, Page, expect

from app.config import Settings
from app.keys import Role
from tests.acceptance.dashboard import Visit, chromium, visit
from tests.acceptance.test_security import bearer, make_key
from tests.fixtures import Live, quiet_settings
from tests.helpers import enqueue


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(auth="required")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as b:
        yield b


async def sign_in(page: Page, token: str) -> None:
    await page.goto("/ui")
    await page.get_by_label("API key").fill(token)
    await page.get_by_role("button", name="Sign in").click()


async def seed(live: Live, admin: str) -> None:
    live.client.headers.update(bearer(admin))
    for tenant in ("acme", "globex", "initech"):
        await enqueue(live.client, "email", tenant, 2)
        await enqueue(live.client, "report", tenant, 1)


def refused(seen: Visit) -> list[tuple[int, str]]:
    """The answers that refused the page, but the first: without a key stored, the page
    asks who it is, and a 401 is how it learns that it must sign in."""
    refusals = [(s, u) for s, u in seen.answers if s in (401, 403)]
    assert refusals[:1] and refusals[0][0] == 401 and refusals[0][1].endswith("/v2/whoami")
    return refusals[1:]


async def test_the_sign_in_page_says_nothing_was_refused_before_a_key_is_typed(
    live: Live, browser: Browser
):
    async with visit(browser, live.url) as seen:
        await seen.page.goto("/ui")
        form = seen.page.locator("form.sign-in")
        await expect(form.get_by_label("API key")).to_be_focused()
        await expect(form.locator(".error")).to_have_text("")
        await expect(seen.page.get_by_text("refused")).to_have_count(0)


async def test_the_page_asks_for_a_key_and_a_wrong_one_is_refused(live: Live, browser: Browser):
    async with visit(browser, live.url) as seen:
        await sign_in(seen.page, "jf_0123456789abcdef_wrong")
        await expect(seen.page.get_by_text("The key was refused")).to_be_visible()
        assert seen.asked("/v2/stats") == []


async def test_an_admin_sees_every_tenant_and_the_configuration(live: Live, browser: Browser):
    _, admin = await make_key(live, Role.ADMIN)
    await seed(live, admin)
    async with visit(browser, live.url) as seen:
        await sign_in(seen.page, admin)
        rows = seen.page.locator('section[data-type="email"] tbody tr')
        await expect(rows).to_have_count(3)
        await seen.page.goto("/ui#/tenants")
        await expect(seen.page.get_by_role("heading", name="Tenants")).to_be_visible()
        assert refused(seen) == []


async def test_a_scoped_key_sees_only_its_tenants_in_every_view(live: Live, browser: Browser):
    _, admin = await make_key(live, Role.ADMIN)
    await seed(live, admin)
    _, scoped = await make_key(live, Role.WORKER, ["globex"], ["email", "report"])
    async with visit(browser, live.url) as seen:
        page = seen.page
        await sign_in(page, scoped)
        for job_type in ("email", "report"):
            rows = page.locator(f'section[data-type="{job_type}"] tbody tr')
            await expect(rows).to_have_count(1)
            await expect(rows).to_have_attribute("data-tenant", "globex")
        views = ("#/tenants", "#/types", "#/tenants/globex", "#/types/email", "#/jobs")
        for view in (*views, "#/failures", "#/workers"):
            await page.goto("/ui" + view)
            await expect(page.locator("main h1")).to_be_visible()
            body = await page.locator("main").inner_text()
            assert "acme" not in body and "initech" not in body, (view, body)
        # The page knew the key's scope: it never asked for what the key may not see.
        assert refused(seen) == []
        assert seen.asked("/v2/tenants") == [] and seen.asked("/v2/job-types") == []
