"""``jobfair demo``: fairness you can watch.

It starts a server on an embedded PostgreSQL of its own, has a *flood* tenant dump a
large backlog and a *trickle* tenant make a few jobs a second, both of one job type and
with weights, and runs workers (asyncio tasks here, over HTTP, as any worker) until the
flood has drained.  A live table shows each tenant's backlog, its share of the
activations against the share its weight entitles it to, and how long the trickle's
jobs wait; the end states the measured shares and the trickle's worst wait.

What fairness means here: the trickle asks for far less than its entitled share, so it
should get all it asks for, at once, while the flood takes the rest (a FIFO queue would
make each trickle job wait behind the whole flood).  The wait measured is the server's
own, ``activatedAt - createdAt`` of each activated job: ready (created, not delayed) to
activated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from app.cli_ops import progress_bar, stdout

JOB_TYPE = "demo"
FLOOD, TRICKLE = "flood", "trickle"
WINDOW_S = 5.0  # the live table's shares are of this last stretch
LEGEND = (
    f"share: of the activations in the last {WINDOW_S:g} s; entitled: the weight over the "
    "weights of the tenants that want work; wait: ready to activated"
)
CREATE_BATCH = 1000
LEASE_MS = 300_000  # long enough never to expire here: a re-activation would skew waits
POLL_MS = 1000  # an idle worker's long poll


# -- what is measured -------------------------------------------------------------------


@dataclass
class Lane:
    tenant: str
    weight: int
    made: int = 0
    activated: int = 0
    completed: int = 0
    ready: int = 0  # from the server's stats, about every second
    active: int = 0
    waits_ms: list[float] = field(default_factory=list)
    recent: deque[tuple[float, int]] = field(default_factory=deque)  # (monotonic, count)

    def activated_since(self, since: float) -> int:
        while self.recent and self.recent[0][0] < since - WINDOW_S:
            self.recent.popleft()
        return sum(n for at, n in self.recent if at >= since)


@dataclass
class Run:
    lanes: dict[str, Lane]
    flood_jobs: int
    started: float = 0.0  # monotonic, when the workers started
    drained: float | None = None  # when the flood's last job completed
    error: str | None = None  # the latest failure of a call, shown until the next success
    dashboard: str | None = None
    completions: deque[tuple[float, int]] = field(default_factory=deque)
    completed: asyncio.Event = field(default_factory=asyncio.Event)  # set on each batch

    def record_activations(self, jobs: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        counts: dict[str, int] = {}
        for job in jobs:
            lane = self.lanes.get(job["tenantId"])
            if lane is None:
                continue
            lane.activated += 1
            counts[lane.tenant] = counts.get(lane.tenant, 0) + 1
            lane.waits_ms.append(wait_ms(job))
        for tenant, n in counts.items():
            self.lanes[tenant].recent.append((now, n))

    def record_completions(self, tenants: list[str]) -> None:
        for tenant in tenants:
            self.lanes[tenant].completed += 1
        self.completions.append((time.monotonic(), len(tenants)))
        self.completed.set()
        flood = self.lanes[FLOOD]
        if self.drained is None and flood.completed >= self.flood_jobs:
            self.drained = time.monotonic()

    def rate(self) -> float:
        """Completions a second over the window."""
        now = time.monotonic()
        while self.completions and self.completions[0][0] < now - WINDOW_S:
            self.completions.popleft()
        span = min(WINDOW_S, max(now - self.started, 1e-3))
        return sum(n for _, n in self.completions) / span


def wait_ms(job: dict[str, Any]) -> float:
    """Ready to activated, by the server's clock (demo jobs are never delayed)."""
    created = datetime.fromisoformat(job["createdAt"])
    activated = datetime.fromisoformat(job["activatedAt"])
    return max(0.0, (activated - created).total_seconds() * 1000)


def shares(counts: dict[str, int]) -> dict[str, float | None]:
    total = sum(counts.values())
    return {t: (n / total if total else None) for t, n in counts.items()}


def entitled(lanes: dict[str, Lane], wanting: list[str]) -> dict[str, float | None]:
    """Each tenant's weight over the weights of the tenants that want work."""
    total = sum(lanes[t].weight for t in wanting)
    return {t: (lanes[t].weight / total if t in wanting and total else None) for t in lanes}


def waited(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def pct(share: float | None) -> str:
    if share is None:
        return "-"
    if 0 < share < 0.0005 or 0.9995 < share < 1:
        return f"{share * 100:.3f}%"  # a weight of 1 against 10,000 is not 0% and 100%
    return f"{share * 100:.1f}%"


def worst(lane: Lane) -> float | None:
    return max(lane.waits_ms, default=None)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# -- the live table ---------------------------------------------------------------------


def live_view(run: Run, url: str) -> RenderableType:
    now = time.monotonic()
    since = now - WINDOW_S
    recent = {t: lane.activated_since(since) for t, lane in run.lanes.items()}
    wanting = [t for t, lane in run.lanes.items() if recent[t] or lane.ready]
    realised, fair = shares(recent), entitled(run.lanes, wanting)
    table = Table(box=box.SIMPLE, pad_edge=False, collapse_padding=True)
    for name in ("tenant", "weight", "ready", "active", "done", "share", "entitled",
                 "wait p50", "wait max"):  # fmt: skip
        table.add_column(name, justify="left" if name == "tenant" else "right", no_wrap=True)
    for t, lane in run.lanes.items():
        table.add_row(
            t,
            str(lane.weight),
            f"{lane.ready:,}",
            f"{lane.active:,}",
            f"{lane.completed:,}",
            pct(realised[t]),
            pct(fair[t]),
            waited(median(lane.waits_ms)),
            waited(worst(lane)),
        )
    flood = run.lanes[FLOOD]
    left = run.flood_jobs - flood.completed
    head = (
        f"{now - run.started:5.0f} s  {run.rate():7,.0f} jobs/s  flood left {left:,}"
        if run.drained is None
        else f"flood drained in {run.drained - run.started:.1f} s"
    )
    lines: list[RenderableType] = [Text(head), table, Text(LEGEND, style="dim")]
    if run.error:
        lines.append(Text(run.error, style="red"))
    return Group(*lines)


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


# -- the server it starts ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@contextlib.contextmanager
def demo_server(
    data_dir: Path, port: int, keep: bool, console: Console
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``jobfair serve`` on its own embedded PostgreSQL in ``data_dir``, on loopback
    without auth; stopped at the end (with its PostgreSQL) unless ``keep``.  It runs in
    its own session: Ctrl-C in the terminal reaches this process alone, which then
    stops the server itself (or, with --keep, leaves it running)."""
    url = f"http://127.0.0.1:{port}"
    log_path = data_dir / "demo-server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFAIR_")}
    env["JOBFAIR_AUTH"] = "off"  # loopback only
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port",
               str(port), "--data-dir", str(data_dir), "--log-level", "warning"]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        with console.status(f"starting a server on embedded PostgreSQL in {data_dir} ..."):
            _wait_ready(url, proc, log_path)
        # soft_wrap: a path or URL split over two lines could not be pasted.
        console.print(f"server: {url} (pid {proc.pid}, log {log_path})", soft_wrap=True)
        yield url, proc
    finally:
        if keep and proc.poll() is None:
            console.print(
                f"the server keeps running at {url} (pid {proc.pid}, data in {data_dir}); "
                f"stop it with: kill {proc.pid}",
                soft_wrap=True,
            )
        else:
            stop_server(proc)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
            raise DemoFailed("the server did not start:\n" + "\n".join(tail))
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise DemoFailed(f"the server was not ready within 180 s (log: {log_path})")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a graceful stop, which also stops its PostgreSQL), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the command ------------------------------------------------------------------------


def demo(
    flood: Annotated[
        int, typer.Option(min=1, help="jobs the flood tenant makes at once")
    ] = 100_000,
    trickle_rate: Annotated[
        float, typer.Option(min=0.1, help="jobs a second the trickle tenant makes")
    ] = 5.0,
    flood_weight: Annotated[int, typer.Option(min=1, max=10_000, help="the flood's weight")] = 1,
    trickle_weight: Annotated[
        int, typer.Option(min=1, max=10_000, help="the trickle's weight")
    ] = 1,
    workers: Annotated[int, typer.Option(min=1, max=256, help="workers (asyncio tasks)")] = 8,
    batch: Annotated[
        int, typer.Option(min=1, max=1000, help="jobs a worker activates per call")
    ] = 32,
    work_ms: Annotated[
        float, typer.Option(min=0, help="a worker's time per job (simulated work), ms")
    ] = 0.0,
    duration: Annotated[
        float | None,
        typer.Option(
            min=1, help="stop after this many seconds", show_default="when the flood drains"
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="the server's port", show_default="a free one"),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="embedded PostgreSQL data folder", show_default="a temporary one, removed after"
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="leave the server running at the end")
    ] = False,
) -> None:
    """Watch fairness: a flood tenant's backlog and a trickle tenant served in turn.

    Starts a server on its own embedded PostgreSQL, makes the flood's jobs (in batches,
    through the API), then runs workers while the trickle makes a few jobs a second,
    until the flood has drained.  The live table shows each tenant's backlog, its share
    of the last seconds' activations against the share its weight entitles it to, and
    the trickle's waits; the last line states the measured shares and the trickle's
    worst wait (ready to activated).
    """
    options = Options(
        flood, trickle_rate, flood_weight, trickle_weight, workers, batch, work_ms, duration
    )
    console = stdout()
    port = port or free_port()
    if port_taken(port):
        typer.echo(f"port {port} is taken: give another --port", err=True)
        raise typer.Exit(2)
    temporary = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="jobfair-demo-")) if data_dir is None else data_dir
    root = root.expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    run = new_run(options)
    try:
        with demo_server(root, port, keep, console) as (url, _):
            asyncio.run(_main(url, options, console, run))
    except DemoFailed as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        if run.started:
            for line in summary(run, options):
                console.print(line, highlight=False, soft_wrap=True)
        typer.echo("interrupted: everything the demo started is stopped", err=True)
        raise typer.Exit(130) from None
    finally:
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)
    for line in summary(run, options):
        console.print(line, highlight=False, soft_wrap=True)


async def _main(url: str, options: Options, console: Console, run: Run) -> None:
    # SIGTERM ends the demo as Ctrl-C does: everything it started is stopped.
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        await run_demo(url, options, console, run)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def register(cli: typer.Typer) -> None:
    cli.command()(demo)
