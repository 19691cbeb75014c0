"""The demo's parts that run: the flood, the trickle, the workers, the stats read, and
the summary at the end."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.live import Live

from app.console import progress_bar
from app.demo.measure import (
    CREATE_BATCH,
    FLOOD,
    JOB_TYPE,
    LEASE_MS,
    POLL_MS,
    TRICKLE,
    Lane,
    Run,
    entitled,
    live_view,
    median,
    pct,
    shares,
    waited,
    worst,
)

# -- the parts that run -----------------------------------------------------------------


async def worker(
    http: httpx.AsyncClient, n: int, run: Run, stop: asyncio.Event, batch: int, work_ms: float
) -> None:
    """Activate (long polling), work, complete the batch; until ``stop``."""
    body = {
        "type": JOB_TYPE,
        "maxJobs": batch,
        "timeout": LEASE_MS,
        "worker": f"demo-worker-{n}",
        "requestTimeout": POLL_MS,
    }
    while not stop.is_set():
        try:
            r = await http.post("/v2/jobs/activate", json=body)
            if r.status_code != 200:
                run.error = f"activate: {r.status_code} {r.text[:200]}"
                await asyncio.sleep(0.5)
                continue
            jobs = r.json()["jobs"]
            if not jobs:
                continue
            run.record_activations(jobs)
            if work_ms:
                await asyncio.sleep(work_ms * len(jobs) / 1000)
            done = [{"jobKey": j["jobKey"], "activationCount": j["activationCount"]} for j in jobs]
            r = await http.post("/v2/jobs/complete", json={"jobs": done})
            if r.status_code != 200:
                run.error = f"complete: {r.status_code} {r.text[:200]}"
                continue
            results = r.json()["results"]
            run.record_completions(
                [
                    j["tenantId"]
                    for j, res in zip(jobs, results, strict=True)
                    if res["status"] == 204
                ]
            )
            run.error = None
        except httpx.TransportError as exc:
            run.error = f"worker {n}: {exc!r}"
            await asyncio.sleep(0.5)


async def trickle(http: httpx.AsyncClient, rate: float, run: Run, stop: asyncio.Event) -> None:
    """``rate`` jobs a second, evenly (a batch a tick when that is more than 50)."""
    lane = run.lanes[TRICKLE]
    tick_s = max(1 / rate, 0.02)
    start = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - start) * rate) + 1 - lane.made
        if due > 0:
            jobs = [{"type": JOB_TYPE, "tenantId": TRICKLE} for _ in range(due)]
            try:
                if due == 1:
                    r = await http.post("/v2/jobs", json=jobs[0])
                else:
                    r = await http.post("/v2/jobs/batch", json={"jobs": jobs})
                if r.status_code == 201:
                    lane.made += due
                else:
                    run.error = f"trickle: {r.status_code} {r.text[:200]}"
            except httpx.TransportError as exc:
                run.error = f"trickle: {exc!r}"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), tick_s)


async def watch_stats(http: httpx.AsyncClient, run: Run, stop: asyncio.Event) -> None:
    """Each lane's ready and active jobs as the server counts them, every second."""
    while not stop.is_set():
        await read_stats(http, run)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def read_stats(http: httpx.AsyncClient, run: Run) -> None:
    with contextlib.suppress(httpx.TransportError, ValueError, KeyError):
        r = await http.get("/v2/stats", params={"type": JOB_TYPE})
        if r.status_code == 200:
            seen = {x["tenantId"]: x for t in r.json()["jobTypes"] for x in t["tenants"]}
            for tenant, lane in run.lanes.items():
                # A lane with no jobs is left out of the stats.
                lane.ready = seen.get(tenant, {}).get("ready", 0)
                lane.active = seen.get(tenant, {}).get("active", 0)


async def make_flood(http: httpx.AsyncClient, n: int, console: Console) -> None:
    """The flood's backlog, through the API in batches, a few at a time."""
    sizes = [min(CREATE_BATCH, n - i) for i in range(0, n, CREATE_BATCH)]
    gate = asyncio.Semaphore(4)
    with progress_bar(console) as bar:
        task = bar.add_task(f"creating the flood's {n:,} jobs", total=n)

        async def one(size: int) -> None:
            async with gate:
                jobs = [{"type": JOB_TYPE, "tenantId": FLOOD} for _ in range(size)]
                r = await http.post("/v2/jobs/batch", json={"jobs": jobs})
                if r.status_code != 201:
                    raise DemoFailed(f"creating jobs: {r.status_code} {r.text[:300]}")
                bar.advance(task, size)

        await asyncio.gather(*(one(size) for size in sizes))


class DemoFailed(Exception):
    pass


@dataclass
class Options:
    flood: int
    trickle_rate: float
    flood_weight: int
    trickle_weight: int
    workers: int
    batch: int
    work_ms: float
    duration_s: float | None


def new_run(options: Options) -> Run:
    lanes = {
        FLOOD: Lane(FLOOD, options.flood_weight),
        TRICKLE: Lane(TRICKLE, options.trickle_weight),
    }
    return Run(lanes, options.flood)


async def run_demo(url: str, options: Options, console: Console, run: Run) -> None:
    """Configure, fill, drain, measuring into ``run`` (which holds what was measured
    also when stopped early: by --duration or Ctrl-C)."""
    lanes = run.lanes
    limits = httpx.Limits(max_connections=options.workers + 8)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        r = await http.get("/v2/stats", params={"type": JOB_TYPE})
        if any(t["pending"] or t["active"] for t in r.json()["jobTypes"]):
            raise DemoFailed(
                f"this data folder's server already has {JOB_TYPE!r} jobs waiting or "
                "active (an interrupted demo's), which would skew what is measured: give "
                "another --data-dir, or none (a temporary one)"
            )
        for lane in lanes.values():
            r = await http.put(f"/v2/tenants/{lane.tenant}", json={"weight": lane.weight})
            if r.status_code != 200:
                raise DemoFailed(f"configuring {lane.tenant}: {r.status_code} {r.text[:300]}")
        with contextlib.suppress(httpx.HTTPError):
            if (await http.get("/ui")).status_code == 200:
                run.dashboard = f"{url}/ui"
                console.print(f"dashboard: {run.dashboard}", soft_wrap=True)
        await make_flood(http, options.flood, console)
        lanes[FLOOD].made = options.flood

        stop_making, stop_working = asyncio.Event(), asyncio.Event()
        run.started = time.monotonic()
        tasks = [
            asyncio.create_task(worker(http, n, run, stop_working, options.batch, options.work_ms))
            for n in range(options.workers)
        ]
        making = asyncio.create_task(trickle(http, options.trickle_rate, run, stop_making))
        polling = asyncio.create_task(watch_stats(http, run, stop_working))
        try:
            with Live(live_view(run, url), console=console, auto_refresh=False) as live:
                try:
                    while run.drained is None and not (
                        options.duration_s and time.monotonic() - run.started >= options.duration_s
                    ):
                        await asyncio.sleep(1.0)
                        live.update(live_view(run, url), refresh=True)
                    # The trickle's last jobs, then stop.
                    stop_making.set()
                    await making
                    trickle_lane = lanes[TRICKLE]
                    until = time.monotonic() + 10
                    while trickle_lane.completed < trickle_lane.made:
                        run.completed.clear()
                        left_s = until - time.monotonic()
                        if left_s <= 0:
                            break
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(run.completed.wait(), left_s)
                finally:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(read_stats(http, run), 5)
                    live.update(live_view(run, url), refresh=True)
        finally:
            console.print()  # the final frame, piped, ends without a line break
            stop_making.set()
            stop_working.set()
            # A worker ends after its long poll (POLL_MS); one stuck longer is cut off.
            _, pending = await asyncio.wait([*tasks, making, polling], timeout=POLL_MS / 1000 + 5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


def summary(run: Run, options: Options) -> list[str]:
    """What the demo measured, in a few lines; the last states the shares and the
    trickle's worst wait."""
    flood, trick = run.lanes[FLOOD], run.lanes[TRICKLE]
    end = run.drained or time.monotonic()
    lines = []
    if run.drained is not None:
        took = run.drained - run.started
        lines.append(
            f"flood: {options.flood:,} jobs drained in {took:.1f} s "
            f"({options.flood / took:,.0f} jobs/s) by {options.workers} workers"
        )
    else:
        lines.append(
            f"flood: not drained after {end - run.started:.1f} s, "
            f"{options.flood - flood.completed:,} of {options.flood:,} jobs left"
        )
    lines.append(
        f"trickle: {trick.made:,} jobs made at {options.trickle_rate:g}/s, "
        f"{trick.activated:,} activated, {trick.completed:,} completed"
    )
    lines.append(
        "waits, ready to activated: "
        f"trickle p50 {waited(median(trick.waits_ms))}, max {waited(worst(trick))}; "
        f"flood p50 {waited(median(flood.waits_ms))}, max {waited(worst(flood))}"
    )
    realised = shares({FLOOD: flood.activated, TRICKLE: trick.activated})
    fair = entitled(run.lanes, [FLOOD, TRICKLE])
    served = (
        f"all {trick.made:,} of its jobs served"
        if trick.completed >= trick.made
        else f"{trick.completed:,} of its {trick.made:,} jobs served"
    )
    lines.append(
        f"measured shares: flood {pct(realised[FLOOD])} (entitled {pct(fair[FLOOD])}), "
        f"trickle {pct(realised[TRICKLE])} (entitled {pct(fair[TRICKLE])}; {served}); "
        f"trickle's worst wait {waited(worst(trick))} "
        f"(p50 {waited(median(trick.waits_ms))}), "
        f"flood's median wait {waited(median(flood.waits_ms))}"
    )
    return lines
