"""The dashboard at /ui in a real browser, against a live server with auth off (loopback):
its numbers are the API's, it follows the queue without a reload, and an admin edits a
tenant in place (issue 25)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, Page, expect

from tests.acceptance.dashboard import chromium, visit
from tests.fixtures import CITUS, Live
from tests.helpers import activate, assert_problem, enqueue


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as b:
        yield b


def cell(page: Page, job_type: str, tenant: str, name: str):  # type: ignore[no-untyped-def]
    return page.locator(
        f'section[data-type="{job_type}"] tr[data-tenant="{tenant}"] td[data-field="{name}"]'
    )


async def test_the_page_and_its_assets_are_served_by_the_app_with_a_strict_policy(live: Live):
    page = await live.client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    for asset, media in (("app.js", "text/javascript"), ("style.css", "text/css")):
        r = await live.client.get(f"/ui/{asset}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(media)
        # No address of another host (SVG's namespace is a name, not a fetch).
        text = r.text.replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in text and "https://" not in text
    for missing in ("index.html", "nope.js", "..%2Fapp.py", "app.js.map"):
        assert_problem(await live.client.get(f"/ui/{missing}"), 404)


async def test_whoami_says_auth_is_off_on_loopback(live: Live):
    r = await live.client.get("/v2/whoami")
    assert r.status_code == 200
    assert r.json() == {"keyId": None, "role": "admin", "tenants": "*", "types": "*", "auth": "off"}


async def test_the_overview_shows_the_numbers_of_v2_stats(live: Live, browser: Browser):
    c = live.client
    for job_type, counts in (("email", (5, 2, 1)), ("report", (1, 4, 3))):
        for tenant, n in zip(("acme", "globex", "initech"), counts, strict=True):
            await enqueue(c, job_type, tenant, n)
    await enqueue(c, "email", "acme", 2, runAt="2099-01-01T00:00:00Z")  # delayed
    await activate(c, "email", max_jobs=3)
    await activate(c, "report", max_jobs=2, tenantIds=["globex"])
    stats = (await c.get("/v2/stats")).json()["jobTypes"]
    async with visit(browser, live.url) as seen:
        await seen.page.goto("/ui")
        for t in stats:
            assert len(t["tenants"]) == 3
            for lane in t["tenants"]:
                for name in ("ready", "delayed", "active"):
                    await expect(cell(seen.page, t["type"], lane["tenantId"], name)).to_have_text(
                        str(lane[name])
                    )
            card = seen.page.locator(f'section[data-type="{t["type"]}"] .totals')
            await expect(card.locator('[data-field="ready"]')).to_have_text(str(t["ready"]))
            await expect(card.locator('[data-field="active"]')).to_have_text(str(t["active"]))
        rows = seen.page.locator("section[data-type] tbody tr")
        await expect(rows).to_have_count(6)


async def test_the_overview_follows_new_and_activated_jobs_without_a_reload(
    live: Live, browser: Browser
):
    c = live.client
    await enqueue(c, "email", "acme", 2)
    async with visit(browser, live.url) as seen:
        await seen.page.goto("/ui")
        await expect(cell(seen.page, "email", "acme", "ready")).to_have_text("2")
        loads = len(seen.asked("/ui"))
        await enqueue(c, "email", "acme", 5)
        await enqueue(c, "email", "globex", 1)
        await activate(c, "email", max_jobs=3, tenantIds=["acme"])
        # 2 + 5 - 3 ready, 3 active; globex appears: within 3 s, and without a reload.
        await expect(cell(seen.page, "email", "acme", "ready")).to_have_text("4", timeout=3000)
        await expect(cell(seen.page, "email", "acme", "active")).to_have_text("3", timeout=3000)
        await expect(cell(seen.page, "email", "globex", "ready")).to_have_text("1", timeout=3000)
        assert len(seen.asked("/ui")) == loads  # the page was not loaded again


async def test_an_admin_edits_a_tenants_weight_and_a_bad_value_shows_the_apis_message(
    live: Live, browser: Browser
):
    c = live.client
    limit = {"perSecond": 2.5, "burst": 10}
    await c.put("/v2/tenants/acme", json={"weight": 2, "maxActiveJobs": 7, "rateLimit": limit})
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/tenants/acme")
        weight = page.get_by_label("weight (1–10000)")
        await expect(weight).to_have_value("2")
        await weight.fill("5")
        await page.get_by_role("button", name="Save").click()
        await expect(page.get_by_text("saved")).to_be_visible()
        saved = (await c.get("/v2/tenants/acme")).json()
        # The rate limit was in the form too: a PUT replaces it all, and it is kept.
        kept = {k: saved["rateLimit"][k] for k in ("perSecond", "burst")}
        assert (saved["weight"], saved["maxActiveJobs"], kept) == (5, 7, limit)
        # The API's own words for a weight out of range, shown as they are; nothing changes.
        refused = assert_problem(
            await c.put("/v2/tenants/acme", json={"weight": 0, "maxActiveJobs": 7}), 400
        )
        await weight.fill("0")
        await page.get_by_role("button", name="Save").click()
        await expect(page.get_by_role("alert").filter(has_text=refused["detail"])).to_be_visible()
        got = (await c.get("/v2/tenants/acme")).json()
        assert (got["weight"], got["maxActiveJobs"]) == (5, 7)


async def test_an_admin_edits_a_job_types_aging_and_keeps_what_the_form_does_not_change(
    live: Live, browser: Browser
):
    """A PUT replaces a type's whole configuration: the form sends its per-key cap and
    what it is fair by as they are (they were reset to none and activations before)."""
    c = live.client
    await c.put(
        "/v2/job-types/mail",
        json={
            "maxActivePerKey": 3,
            "fairnessBy": "workerTime",
            "agingStep": 10,
            # FIFO keys are refused on Citus (400): the rest of the form is the same.
            **({} if CITUS else {"keyOrdering": "fifo"}),
        },
    )
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/types/mail")
        per_key = page.get_by_label("max active jobs per fairness key (empty: none)")
        await expect(per_key).to_have_value("3")
        await page.get_by_label("aging step").fill("5")
        await page.get_by_role("button", name="Save").click()
        await expect(page.get_by_text("saved")).to_be_visible()
        got = (await c.get("/v2/job-types/mail")).json()
        assert (got["agingStep"], got["maxActivePerKey"], got["fairnessBy"]) == (
            5,
            3,
            "workerTime",
        )
        ordering = page.get_by_label("order inside each fairness key")
        if not CITUS:
            assert got["keyOrdering"] == "fifo"
            await expect(ordering).to_have_value("fifo")
            await ordering.select_option("")
        await per_key.fill("")
        async with page.expect_response(lambda r: r.request.method == "PUT") as put:
            await page.get_by_role("button", name="Save").click()
        assert (await put.value).status == 200
        got = (await c.get("/v2/job-types/mail")).json()
        assert got["maxActivePerKey"] is None and got["keyOrdering"] is None


async def test_the_overview_pages_and_searches_many_tenants_without_drawing_them_all(
    live: Live, browser: Browser
):
    c = live.client
    jobs = [{"type": "bulk", "tenantId": f"t{i:03d}"} for i in range(120)]
    assert (await c.post("/v2/jobs/batch", json={"jobs": jobs})).status_code == 201
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui")
        rows = page.locator('section[data-type="bulk"] tbody tr')
        await expect(rows).to_have_count(25)
        await expect(page.get_by_text("page 1 of 5")).to_be_visible()
        await page.get_by_role("button", name="Next →").click()
        await expect(page.get_by_text("page 2 of 5")).to_be_visible()
        await expect(rows.first).to_have_attribute("data-tenant", "t025")
        await page.get_by_label("Search tenants").fill("t11")
        await expect(rows).to_have_count(10)  # t110 .. t119
        await expect(rows.first).to_have_attribute("data-tenant", "t110")


async def test_a_failed_job_is_retried_from_the_failures_page_and_is_created_again(
    live: Live, browser: Browser
):
    c = live.client
    [key] = await enqueue(c, "report", "acme", 1)
    [job] = await activate(c, "report")
    r = await c.post(
        f"/v2/jobs/{key}/fail",
        json={"activationCount": job["activationCount"], "retries": 0, "errorMessage": "no disk"},
    )
    assert r.status_code == 204
    assert (await c.get(f"/v2/jobs/{key}")).json()["state"] == "FAILED"
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/failures")
        row = page.locator(f'section[aria-label="failed jobs"] tr[data-job="{key}"]')
        await expect(row).to_contain_text("no disk")
        await row.get_by_role("button", name="Retry").click()
        await expect(row).to_have_count(0)
    assert (await c.get(f"/v2/jobs/{key}")).json()["state"] == "CREATED"


async def test_retry_all_asks_first_and_revives_every_failed_job_of_the_filter(
    live: Live, browser: Browser
):
    c = live.client
    keys = await enqueue(c, "report", "acme", 3) + await enqueue(c, "report", "globex", 2)
    for job in await activate(c, "report", max_jobs=5):
        await c.post(
            f"/v2/jobs/{job['jobKey']}/fail",
            json={"activationCount": job["activationCount"], "retries": 0},
        )
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/failures?tenantId=acme")
        questions: list[str] = []

        async def answer(dialog):  # type: ignore[no-untyped-def]
            questions.append(dialog.message)
            await dialog.accept()

        page.on("dialog", answer)
        await page.get_by_role("button", name="Retry all FAILED").click()
        # The redraw after the retry has run (the retried jobs left the table, and the
        # button with them), and the answer is still said: the redraw once dropped it.
        failed = page.get_by_role("region", name="failed jobs")
        await expect(failed.get_by_role("button", name="Retry all FAILED")).to_have_count(0)
        await expect(failed.get_by_role("row")).to_have_count(1)  # the header alone
        await expect(page.get_by_text("3 jobs retried.")).to_be_visible()
        assert questions and "tenant acme" in questions[0]
    states = {k: (await c.get(f"/v2/jobs/{k}")).json() for k in keys}
    assert sorted(s["state"] for s in states.values() if s["tenantId"] == "acme") == ["CREATED"] * 3
    assert (
        sorted(s["state"] for s in states.values() if s["tenantId"] == "globex") == ["FAILED"] * 2
    )


async def test_the_workers_page_names_the_workers_seen_and_the_waiting_count(
    live: Live, browser: Browser
):
    c = live.client
    await enqueue(c, "email", "acme", 1)
    await activate(c, "email", worker="mailer-7")
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/workers")
        # Workers seen are written every few seconds per process; the page follows.
        await expect(page.locator('tr[data-worker="mailer-7"]')).to_contain_text(
            "email", timeout=10_000
        )
        await expect(page.locator('[data-field="waiting"]')).to_contain_text("Waiting now: 0")


async def test_an_admin_pauses_and_resumes_a_tenant_from_its_page(live: Live, browser: Browser):
    c = live.client
    await enqueue(c, "email", "acme", 1)
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/tenants/acme")
        await page.get_by_role("button", name="Pause").click()
        await expect(page.get_by_role("button", name="Resume")).to_be_visible()
        assert (await c.get("/v2/tenants/acme")).json()["paused"] is True
        assert await activate(c, "email") == []  # paused work is not activated
        await page.get_by_role("button", name="Resume").click()
        await expect(page.get_by_role("button", name="Pause")).to_be_visible()
        assert (await c.get("/v2/tenants/acme")).json()["paused"] is False


async def test_stats_give_each_type_its_last_15_minutes_of_activations(live: Live):
    c = live.client
    await enqueue(c, "email", "acme", 5)
    await c.get("/v2/stats")  # the process's first sample: the series counts from here
    await activate(c, "email", max_jobs=3)
    [t] = (await c.get("/v2/stats")).json()["jobTypes"]
    series = t["activatedPerMinute"]
    assert len(series) == 15
    assert series[-1] == 3 and all(n is None for n in series[:-1])


async def test_the_job_browser_filters_pages_and_opens_a_job_with_its_history(
    live: Live, browser: Browser
):
    c = live.client
    keys = await enqueue(c, "email", "acme", 30, variables={"to": "a@example.com"})
    await enqueue(c, "email", "globex", 3)
    [job] = await activate(c, "email", tenantIds=["acme"], worker="mailer-1")
    await c.post(
        f"/v2/jobs/{job['jobKey']}/fail",
        json={"activationCount": job["activationCount"], "retries": 2, "errorMessage": "busy"},
    )
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/jobs?tenantId=acme")
        rows = page.locator("tr[data-job]")
        await expect(rows).to_have_count(25)  # a page
        first = await rows.first.get_attribute("data-job")
        assert first == max(keys, key=int)  # newest first
        await page.get_by_role("button", name="Older →").click()
        await expect(rows).to_have_count(5)
        await expect(page.locator("tbody")).not_to_contain_text("globex")
        await page.goto(f"/ui#/jobs/{job['jobKey']}")
        await expect(page.locator("dl.record")).to_contain_text("acme")
        details = page.locator("details", has_text="variables")
        await expect(details).not_to_have_attribute("open", "")  # collapsed
        await details.locator("summary").click()
        await expect(details.locator("pre")).to_contain_text("a@example.com")
        history = page.locator("section", has_text="History")
        await expect(history).to_contain_text("mailer-1")
        await expect(history).to_contain_text("busy")


async def test_every_view_is_reached_by_the_keyboard_alone(live: Live, browser: Browser):
    await enqueue(live.client, "email", "acme", 1)
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui")
        await expect(page.locator('section[data-type="email"]')).to_be_visible()
        await page.locator("a.brand").focus()
        reached = []
        for _ in range(6):  # after the brand, the six views in order
            await page.keyboard.press("Tab")
            reached.append(await page.evaluate("() => document.activeElement.textContent"))
        assert reached == ["Overview", "Tenants", "Job types", "Jobs", "Failures", "Workers"]
        await page.keyboard.press("Enter")  # on "Workers"
        await expect(page.get_by_role("heading", name="Workers")).to_be_visible()
