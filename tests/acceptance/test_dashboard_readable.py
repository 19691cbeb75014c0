"""The dashboard tells the truth about fairness (issue 40 section 1), in Chromium: every
lane served in the window has a row, with its weight, its entitled share now beside the
window's, what holds it back (with the figures) and how long nothing of its type was
activated; the failures page counts before a retry of them all and names thrown errors'
codes; workers gone for minutes are marked; a FAILED job has no completedAt."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, expect

from tests.acceptance.dashboard import chromium, visit
from tests.fixtures import Live
from tests.helpers import activate, complete, enqueue


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as b:
        yield b


def row(page, job_type: str, tenant: str):  # type: ignore[no-untyped-def]
    return page.locator(f'section[data-type="{job_type}"] tr[data-tenant="{tenant}"]')


async def test_flood_trickle_weights_cap_and_pause_read_true(live: Live, browser: Browser):
    """Four tenants weighted 1/1/3/5, one capped, one paused, and a trickle tenant whose
    jobs are taken as they come beside a flood."""
    c = live.client
    for tenant, weight in (("bigco", 1), ("smallco", 1), ("midco", 3), ("topco", 5)):
        await c.put(f"/v2/tenants/{tenant}", json={"weight": weight})
    await c.put("/v2/tenants/midco", json={"weight": 3, "maxActiveJobs": 1})
    await enqueue(c, "mail", "bigco", 300)
    for tenant in ("smallco", "midco", "topco"):
        await enqueue(c, "mail", tenant, 30)
    await c.post("/v2/tenants/smallco/pause")
    await live.services.stats.sample()
    for _ in range(3):
        await enqueue(c, "mail", "trickle", 1)
        jobs = await activate(c, "mail", 10)
        assert "trickle" in {j["tenantId"] for j in jobs}
        for j in jobs:
            if j["tenantId"] != "midco":
                assert (await complete(c, j)).status_code == 204
    stats = (await c.get("/v2/stats")).json()
    [mail] = stats["jobTypes"]
    lanes = {x["tenantId"]: x for x in mail["tenants"]}
    assert lanes["trickle"]["ready"] == 0 and lanes["trickle"]["activatedLastMinute"] == 3
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui")
        await expect(page.locator('section[data-type="mail"] tbody tr')).to_have_count(5)
        for tenant, lane in lanes.items():
            r = row(page, "mail", tenant)
            await expect(r.locator('[data-field="weight"]')).to_have_text(str(lane["weight"]))
            if lane["ready"]:
                # Entitled now: its weight over the unpaused backlogged weights (1+3+5).
                now = f"{100 * lane['configuredShare']:.1f} %"
                await expect(r.locator('[data-field="entitled-now"]')).to_contain_text(now)
        assert lanes["topco"]["configuredShare"] == round(5 / 9, 4)
        await expect(row(page, "mail", "trickle")).to_contain_text("realised")
        midco = row(page, "mail", "midco")
        await expect(midco.locator('[data-held="tenantCap"]')).to_have_text(
            "held: tenant's cap 1/1"
        )
        await expect(midco.locator('[data-field="held-window"]')).to_contain_text("tenant's cap")
        smallco = row(page, "mail", "smallco")
        await expect(smallco.locator('[data-held="tenantPaused"]')).to_be_visible()
        # Nothing served for a minute: the card says so (the sampler's clock moved back).
        stats_service = live.services.stats
        total, at, moved = stats_service._moved["mail"]
        stats_service._moved["mail"] = (total, at - 61, moved)
        await expect(page.locator('section[data-type="mail"] [data-field="idle"]')).to_contain_text(
            "no activation of this type for", timeout=10_000
        )


async def test_a_fairness_key_at_its_cap_is_named_on_its_tenants_row(live: Live, browser: Browser):
    """Issue 44: a key held at its own cap shows on its lane's row, with its running jobs
    against its cap; a key with room does not."""
    c = live.client
    await c.put("/v2/tenants/acme/keys/cust-7", json={"maxActiveJobs": 1})
    await enqueue(c, "mail", "acme", 5, fairnessKey="cust-7")
    await enqueue(c, "mail", "acme", 5, fairnessKey="cust-8")
    await live.services.stats.sample()
    await activate(c, "mail", 4)
    await live.services.stats.sample()
    async with visit(browser, live.url) as seen:
        await seen.page.goto("/ui")
        acme = row(seen.page, "mail", "acme")
        await expect(acme.locator('[data-held-key="cust-7"]')).to_have_text(
            "key cust-7 at its cap 1/1"
        )
        await expect(acme.locator('[data-held-key="cust-8"]')).to_have_count(0)


async def test_a_fifo_keys_head_is_named_on_its_tenants_row(live: Live, browser: Browser):
    """Issue 44 §2: a FIFO key whose head is out shows with its head; a FAILED one too."""
    c = live.client
    await c.put("/v2/job-types/mail", json={"keyOrdering": "fifo"})
    await enqueue(c, "mail", "acme", 3, fairnessKey="cust-7")
    await enqueue(c, "mail", "acme", 3, fairnessKey="cust-8")
    await live.services.stats.sample()
    jobs = {j["fairnessKey"]: j for j in await activate(c, "mail", 4)}
    failed = jobs["cust-8"]
    r = await c.post(
        f"/v2/jobs/{failed['jobKey']}/fail",
        json={"retries": 0, "activationCount": failed["activationCount"]},
    )
    assert r.status_code == 204
    await live.services.stats.sample()
    async with visit(browser, live.url) as seen:
        await seen.page.goto("/ui")
        acme = row(seen.page, "mail", "acme")
        await expect(acme.locator('[data-key-head="cust-7"]')).to_have_text(
            f"key cust-7 waits for job {jobs['cust-7']['jobKey']} (ACTIVATED)"
        )
        await expect(acme.locator('[data-key-head="cust-8"]')).to_have_text(
            f"key cust-8 waits for job {failed['jobKey']} (FAILED)"
        )
        await expect(acme.locator("[data-held-key]")).to_have_count(0)


async def test_a_tenants_minimum_shows_on_its_rows(live: Live, browser: Browser):
    """Issue 44 §3: a tenant below its minimum is tagged so, with its active jobs."""
    c = live.client
    assert (await c.put("/v2/tenants/acme", json={"minActiveJobs": 3})).status_code == 200
    await enqueue(c, "mail", "acme", 5)
    await live.services.stats.sample()
    await activate(c, "mail", 1)
    await live.services.stats.sample()
    async with visit(browser, live.url) as seen:
        await seen.page.goto("/ui")
        acme = row(seen.page, "mail", "acme")
        await expect(acme.locator('[data-minimum="below"]')).to_have_text(
            "minimum 1/3 · served first"
        )


async def test_one_tenant_reads_one_tenant(live: Live, browser: Browser):
    await enqueue(live.client, "solo", "acme", 2)
    async with visit(browser, live.url) as seen:
        await seen.page.goto("/ui")
        card = seen.page.locator('section[data-type="solo"] .totals')
        await expect(card).to_contain_text("1 tenant")
        await expect(card).not_to_contain_text("1 tenants")


async def test_failures_count_before_retrying_all_and_name_the_error_code(
    live: Live, browser: Browser
):
    c = live.client
    await enqueue(c, "report", "acme", 3)
    await enqueue(c, "report", "acme", 1)
    jobs = await activate(c, "report", max_jobs=4)
    for job in jobs[:3]:
        body = {"activationCount": job["activationCount"], "retries": 0}
        assert (await c.post(f"/v2/jobs/{job['jobKey']}/fail", json=body)).status_code == 204
    thrown = jobs[3]
    body = {
        "activationCount": thrown["activationCount"],
        "errorCode": "NO_STOCK",
        "errorMessage": "sold out",
    }
    assert (await c.post(f"/v2/jobs/{thrown['jobKey']}/error", json=body)).status_code == 204
    failed_key = jobs[0]["jobKey"]
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/failures")
        region = page.get_by_role("region", name="thrown errors")
        await expect(region.locator('[data-field="error"]')).to_have_text("NO_STOCK: sold out")
        questions: list[str] = []
        asked = asyncio.Event()

        async def refuse(dialog):  # type: ignore[no-untyped-def]
            questions.append(dialog.message)
            await dialog.dismiss()
            asked.set()

        page.on("dialog", refuse)
        await page.get_by_role("button", name="Retry all FAILED").click()
        await asyncio.wait_for(asked.wait(), timeout=10)
        assert questions == ["Retry 3 FAILED jobs of every type and tenant?"]
        # A FAILED job was not completed: its page shows no completedAt, and when it ended.
        await page.goto(f"/ui#/jobs/{failed_key}")
        record = page.locator("dl.record")
        await expect(record.locator("dt", has_text="finishedAt")).to_be_visible()
        completed = record.locator("dt:text-is('completedAt') + dd")
        await expect(completed).to_have_text("—")
    assert (await c.get(f"/v2/jobs/{failed_key}")).json()["state"] == "FAILED"


async def test_a_worker_gone_for_minutes_is_marked_apart_from_live_ones(
    live: Live, browser: Browser
):
    c = live.client
    await enqueue(c, "email", "acme", 2)
    await activate(c, "email", worker="live-1")
    await activate(c, "email", worker="gone-1")
    await live.services.workers.flush()
    await live.services.db.execute(
        "UPDATE workers SET last_seen_at = last_seen_at - interval '10 minutes',"
        " last_activated_at = last_activated_at - interval '10 minutes' WHERE worker = 'gone-1'"
    )
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto("/ui#/workers")
        gone = page.locator('tr[data-worker="gone-1"]')
        await expect(gone.locator('[data-field="gone"]')).to_contain_text("not seen for 10")
        live_row = page.locator('tr[data-worker="live-1"]')
        await expect(live_row).to_contain_text("ago")
        await expect(live_row.locator('[data-field="gone"]')).to_have_count(0)


async def test_the_job_page_says_why_the_job_waits(live: Live, browser: Browser):
    c = live.client
    await c.put("/v2/tenants/capped", json={"maxActiveJobs": 1})
    [_, waiting] = await enqueue(c, "work", "capped", 2)
    await activate(c, "work", 1)
    async with visit(browser, live.url) as seen:
        page = seen.page
        await page.goto(f"/ui#/jobs/{waiting}")
        why = page.get_by_role("region", name="why it waits")
        await expect(why.locator('[data-reason="tenantCap"]')).to_have_text(
            "held by its tenant's cap: 1 of 1 active"
        )
        await expect(why).to_contain_text("activatable now: no")
        await expect(why).to_contain_text("estimated start: cannot be estimated")
