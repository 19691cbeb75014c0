"""What the demo measures and shows: each tenant's lane, the shares, the waits, the live
table."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

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
