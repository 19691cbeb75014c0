"""Metrics that match the screens (issue 40 section 3): a new tenant's series carry its
label from its first event while there is room among the labelled; the weight, what holds
a lane now and what held it in the window are series."""

from __future__ import annotations

from app.metrics.events import OTHER
from tests.acceptance.test_metrics import scrape, value
from tests.fixtures import Live
from tests.helpers import activate, enqueue


async def test_a_new_tenant_is_labelled_from_its_first_event(live: Live):
    c = live.client
    await enqueue(c, "fresh", "newco", 3)
    [job] = await activate(c, "fresh", 1)
    samples = await scrape(c)
    assert value(samples, "jobfair_jobs_created_total", type="fresh", tenant="newco") == 3
    assert value(samples, "jobfair_jobs_activated_total", type="fresh", tenant="newco") == 1
    assert value(samples, "jobfair_jobs_created_total", type="fresh", tenant=OTHER) == 0
    assert value(samples, "jobfair_ready_jobs", type="fresh", tenant="newco") == 2
    assert value(samples, "jobfair_labelled_tenants") == 1
    assert job["tenantId"] == "newco"


async def test_weight_and_holds_are_series(live: Live):
    c = live.client
    await c.put("/v2/tenants/capped", json={"maxActiveJobs": 1, "weight": 4})
    await enqueue(c, "hold", "capped", 3)
    await enqueue(c, "hold", "free", 3)
    await live.services.stats.sample()
    await activate(c, "hold", 4)
    samples = await scrape(c)
    assert value(samples, "jobfair_weight", type="hold", tenant="capped") == 4
    assert value(samples, "jobfair_weight", type="hold", tenant="free") == 1
    held = "jobfair_held"
    assert value(samples, held, type="hold", tenant="capped", reason="tenantCap") == 1
    assert value(samples, held, type="hold", tenant="capped", reason="tenantRate") == 0
    assert value(samples, held, type="hold", tenant="free", reason="tenantCap") == 0
    fraction = value(
        samples, "jobfair_held_window_fraction", type="hold", tenant="capped", reason="tenantCap"
    )
    assert 0 < fraction <= 1
