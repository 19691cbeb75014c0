"""Screenshots of each dashboard view, for the docs: ``make screenshots``.

Starts ``jobfair serve`` on a fresh embedded database, creates a small scene (two job
types, three tenants with different weights, one of them capped, a few failures), keeps
a worker busy so that shares move, and writes ``docs/img/<view>.png`` from Debian's
Chromium.
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


def scene(base: str) -> None:
    with httpx.Client(base_url=base, timeout=30) as c:
        c.put("/v2/tenants/acme", json={"weight": 3, "maxActiveJobs": None}).raise_for_status()
        c.put("/v2/tenants/globex", json={"weight": 1, "maxActiveJobs": 5}).raise_for_status()
        c.put("/v2/tenants/initech", json={"weight": 1, "maxActiveJobs": None})
        for job_type, counts in (("email", (4000, 3000, 200)), ("report", (50, 400, 30))):
            for tenant, n in zip(("acme", "globex", "initech"), counts, strict=True):
                jobs = [{"type": job_type, "tenantId": tenant, "priority": 50}] * n
                c.post("/v2/jobs/batch", json={"jobs": jobs}).raise_for_status()
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
        scene(base)
        stop = threading.Event()
        busy = threading.Thread(target=lambda: asyncio.run(worker(base, stop)))
        busy.start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(base + "/ui")
                page.wait_for_timeout(6000)  # let a minute's shares build up a little
                for name, hash_ in VIEWS.items():
                    page.goto(base + "/ui" + hash_)
                    page.wait_for_timeout(1500)  # two refreshes: a settled picture
                    page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
                    print(OUT / f"{name}.png")
                browser.close()
        finally:
            stop.set()
            busy.join()


if __name__ == "__main__":
    main()
