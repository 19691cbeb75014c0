"""The dashboard's overview at many tenants: how long it takes to load and to refresh.

``python -m bench.dashboard [--tenants 10 1000 10000] [--big 100000]`` starts one
``jobfair serve`` on a fresh embedded database per case, creates one job for each of
``--tenants`` small tenants beside one tenant with ``--big`` jobs, and measures:

- ``GET /v2/stats`` as the page asks it: median time and size of the answer;
- in Debian's Chromium (Playwright), the time from navigation to the first tenant row
  drawn (``loadMs``), and the median of the page's own refreshes (``refreshMs``: the
  ``jobfair:refresh`` measures the script makes, request included) over ``--refreshes``.

Prints JSON and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from playwright.sync_api import sync_playwright

from bench.harness import ROOT, Postgres, client, machine_speed, server, speed_line, table

CHROMIUM = "/usr/bin/chromium"


async def seed(base: str, tenants: int, big: int) -> None:
    async with client(base) as c:
        jobs = [{"type": "email", "tenantId": f"t{i:05d}"} for i in range(tenants)]
        jobs += [{"type": "email", "tenantId": "flood"}] * big
        for start in range(0, len(jobs), 10_000):
            r = await c.post("/v2/jobs/batch", json={"jobs": jobs[start : start + 10_000]})
            r.raise_for_status()


async def stats_cost(base: str, rounds: int) -> tuple[float, int]:
    async with client(base) as c:
        times, size = [], 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            r = await c.get("/v2/stats")
            times.append((time.perf_counter() - t0) * 1000)
            size = len(r.content)
        return statistics.median(times), size


def browse(base: str, refreshes: int) -> tuple[float, float]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        t0 = time.perf_counter()
        page.goto(base + "/ui")
        page.locator("section[data-type] tbody tr").first.wait_for()
        load_ms = (time.perf_counter() - t0) * 1000
        page.wait_for_function(
            f"() => performance.getEntriesByName('jobfair:refresh').length > {refreshes}",
            timeout=120_000,
        )
        measures = page.evaluate(
            "() => performance.getEntriesByName('jobfair:refresh').map(m => m.duration)"
        )
        browser.close()
    return load_ms, statistics.median(measures[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, nargs="+", default=[10, 1000, 10_000])
    parser.add_argument("--big", type=int, default=100_000, help="jobs of the one big tenant")
    parser.add_argument("--refreshes", type=int, default=10)
    parser.add_argument("--stats-rounds", type=int, default=7)
    args = parser.parse_args()
    print(speed_line(machine_speed()))
    pg = Postgres(ROOT / ".jobfair" / "bench")
    rows: list[dict[str, Any]] = []
    for n in args.tenants:
        url = pg.fresh_db("bench_dashboard")
        with server(url) as base:
            asyncio.run(seed(base, n, args.big))
            stats_ms, stats_bytes = asyncio.run(stats_cost(base, args.stats_rounds))
            load_ms, refresh_ms = browse(base, args.refreshes)
        rows.append(
            {
                "tenants": n + 1,
                "jobs": n + args.big,
                "statsMs": round(stats_ms, 1),
                "statsBytes": stats_bytes,
                "loadMs": round(load_ms),
                "refreshMs": round(refresh_ms),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"dashboard": rows}, indent=2))
    print(table(rows, ["tenants", "jobs", "statsMs", "statsBytes", "loadMs", "refreshMs"]))


if __name__ == "__main__":
    main()
