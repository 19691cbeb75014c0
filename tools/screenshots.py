"""Screenshots of each dashboard view, for the docs: ``make screenshots``.

Starts ``jobfair serve`` on a fresh embedded database, creates the scene issue 40 tried
as a new user (a flood of ``bigco`` beside a tenant trickling two jobs a second, four
tenants weighted 1/1/3/5, one capped, one paused; a few failures), keeps a worker busy so
that shares move, and writes ``docs/img/<view>.png`` from Debian's Chromium, with a job
page saying why a capped tenant's job waits.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import Postgres, server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
OUT = ROOT / "docs" / "img"
VIEWS = {
    "overview": "#/",
    "tenant": "#/tenants/acme",
    "job-type": "#/types/email",
    "jobs": "#/jobs",
    "failures": "#/failures",
    "workers": "#/workers",
}


def scene(base: str) -> str:
    """The scene; the key of a capped tenant's job that will wait (for its job page)."""
    with httpx.Client(base_url=base, timeout=30) as c:
        for tenant, weight, cap in (
            ("bigco", 1, None),
            ("smallco", 1, None),
            ("acme", 3, 2),
            ("topco", 5, None),
        ):
            body = {"weight": weight, "maxActiveJobs": cap}
            c.put(f"/v2/tenants/{tenant}", json=body).raise_for_status()
        for job_type, counts in (("email", (20000, 300, 400, 600)), ("report", (50, 0, 400, 30))):
            for tenant, n in zip(("bigco", "smallco", "acme", "topco"), counts, strict=True):
                for start in range(0, n, 10000):
                    size = min(10000, n - start)
                    jobs = [{"type": job_type, "tenantId": tenant, "priority": 50}] * size
                    c.post("/v2/jobs/batch", json={"jobs": jobs}).raise_for_status()
        c.post("/v2/tenants/smallco/pause").raise_for_status()
        waiting = c.post("/v2/jobs", json={"type": "email", "tenantId": "acme"}).json()["jobKey"]
        # A few failures for the failures view.
        got = c.post(
            "/v2/jobs/activate",
            json={"type": "report", "maxJobs": 6, "timeout": 60000, "worker": "reporter-1"},
        ).json()["jobs"]
        for job in got[:4]:
            c.post(
                f"/v2/jobs/{job['jobKey']}/fail",
                json={
                    "activationCount": job["activationCount"],
                    "retries": 0,
                    "errorMessage": "template 'monthly' not found",
                },
            )
        for job in got[4:]:
            c.post(
                f"/v2/jobs/{job['jobKey']}/error",
                json={"activationCount": job["activationCount"], "errorCode": "NO_ADDRESS"},
            )
    return str(waiting)


async def trickle(base: str, stop: threading.Event) -> None:
    """A tenant trickling two jobs a second: each taken as it comes."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        while not stop.is_set():
            await c.post("/v2/jobs", json={"type": "email", "tenantId": "trickle"})
            await asyncio.sleep(0.5)


async def worker(base: str, stop: threading.Event) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        while not stop.is_set():
            r = await c.post(
                "/v2/jobs/activate",
                json={
                    "type": "email",
                    "maxJobs": 20,
                    "timeout": 60000,
                    "worker": "mailer-1",
                    "requestTimeout": 1000,
                },
            )
            jobs = r.json().get("jobs", [])
            if jobs:
                await c.post(
                    "/v2/jobs/complete",
                    json={
                        "jobs": [
                            {"jobKey": j["jobKey"], "activationCount": j["activationCount"]}
                            for j in jobs[:15]
                        ]
                    },
                )  # 5 of each batch stay active
            await asyncio.sleep(0.05)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    pg = Postgres(ROOT / ".jobfair" / "bench")
    url = pg.fresh_db("screenshots")
    with server(url) as base:
        waiting = scene(base)
        stop = threading.Event()
        busy = threading.Thread(target=lambda: asyncio.run(worker(base, stop)))
        busy.start()
        drip = threading.Thread(target=lambda: asyncio.run(trickle(base, stop)))
        drip.start()
        views = {**VIEWS, "job-why": f"#/jobs/{waiting}"}
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(base + "/ui")
                page.wait_for_timeout(6000)  # let a minute's shares build up a little
                # Of acme's ready jobs, the one with most ahead of it (its tenant at its
                # cap), shown first: the worker would have taken it by the end.
                ready = httpx.get(
                    base + "/v2/jobs",
                    params={"tenantId": "acme", "type": "email", "state": "CREATED", "limit": 50},
                ).json()["items"]
                ahead = {
                    j["jobKey"]: httpx.get(base + f"/v2/jobs/{j['jobKey']}/explain").json()
                    for j in ready
                }
                if ahead:
                    key = max(ahead, key=lambda k: ahead[k].get("queue", {}).get("aheadInKey", 0))
                    views = {"job-why": f"#/jobs/{key}", **VIEWS}
                for name, hash_ in views.items():
                    page.goto(base + "/ui" + hash_)
                    page.wait_for_timeout(1500)  # two refreshes: a settled picture
                    page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
                    print(OUT / f"{name}.png")
                browser.close()
        finally:
            stop.set()
            busy.join()
            drip.join()


if __name__ == "__main__":
    main()
