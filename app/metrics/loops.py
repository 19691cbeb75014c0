"""The metrics' background work: the tenant labels read (every process), the process
state copied (multiprocess mode) and the labelled tenants ranked (the leader)."""

from __future__ import annotations

from collections import Counter as Tally
from datetime import datetime, timedelta

from app.db import Database, metric_reads
from app.metrics.events import LABELS_LEAD_S, LABELS_POLL_S, PROCESS_SYNC_S, Metrics, TenantLabels
from app.stats import StatsService


class LabelRefresher:
    """Every process: reads the labelled tenants' sets and applies them."""

    name = "metric-labels"

    def __init__(self, db: Database, labels: TenantLabels) -> None:
        self.db = db
        self.labels = labels
        self.interval_ms = int(LABELS_POLL_S * 1000)

    async def run_once(self, now: datetime) -> int:
        sets = await metric_reads.tenant_sets(self.db)
        self.labels.apply(sets, now)
        return len(sets)


class ProcessSync:
    """Every process, in multiprocess mode: its state into the shared files."""

    name = "metric-sync"

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.interval_ms = int(PROCESS_SYNC_S * 1000)

    async def run_once(self, now: datetime) -> int:
        self.metrics.sync()
        return 0


class TenantRanker:
    """The leader: decides which tenants are labelled -- the ``top`` most active -- and
    publishes a new set, in force ``LABELS_LEAD_S`` later, when it differs from the
    newest one published.

    Activity is a tenant's activations in the share window (every job type); ties go to
    tenants with a backlog (so a tenant whose jobs wait unserved is not the first
    folded), then to those labelled now (fewer changes), then to the most activations
    ever, then by name."""

    name = "metric-ranker"

    def __init__(
        self, db: Database, stats: StatsService, labels: TenantLabels, top: int, interval_ms: int
    ) -> None:
        self.db = db
        self.stats = stats
        self.labels = labels
        self.top = top
        self.interval_ms = interval_ms

    def rank(self) -> list[str]:
        """The ``top`` tenants, best first, by the latest sample and the window."""
        recent: Tally[str] = Tally()
        ever: Tally[str] = Tally()
        backlogged: set[str] = set()
        for r in self.stats.latest:
            recent[r.tenant_id] += self.stats.window.activated((r.job_type, r.tenant_id))
            ever[r.tenant_id] += r.activated_total
            if r.active:
                backlogged.add(r.tenant_id)
        members = self.labels.labelled
        order = sorted(
            ever,
            key=lambda t: (-recent[t], t not in backlogged, t not in members, -ever[t], t),
        )
        return order[: self.top]

    async def run_once(self, now: datetime) -> int:
        """Rank and publish if the set changed; how many tenants it labels."""
        if not self.stats.latest:
            await self.stats.sample()
        chosen = frozenset(self.rank())
        sets = await metric_reads.tenant_sets(self.db)
        newest = max(sets).tenants if sets else None
        if chosen != newest:
            await metric_reads.publish_tenants(
                self.db, now + timedelta(seconds=LABELS_LEAD_S), sorted(chosen), now
            )
        return len(chosen)
