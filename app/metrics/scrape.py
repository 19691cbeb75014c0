"""What a scrape reads: the database's gauges (the backlog, the shares, the holds), every
process's events, and the text format, for a key the series it may see."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from app.db import Database, StoreUnavailable, metric_reads, operating
from app.domain import shown_key, stored_key
from app.keys import Principal
from app.metrics.events import LANE, OTHER, Metrics, TenantLabels, multiprocess_dir
from app.scheduler import LANE_REASONS, Aging, max_wait_to_top_ms
from app.shares import OTHER_KEYS, KeyShare
from app.stats import LaneView, StatsService


class Scrape:
    """What ``GET /metrics`` answers: this app's metrics and the database's gauges."""

    def __init__(
        self,
        metrics: Metrics,
        db: Database,
        stats: StatsService,
        resolve_aging: Callable[[int | None, int | None], Aging],
    ) -> None:
        self.metrics = metrics
        self.db = db
        self.stats = stats
        self.resolve_aging = resolve_aging

    async def exposition(self, now: datetime, caller: Principal | None = None) -> bytes:
        """The text a scrape gets: every process's events and state (multiprocess mode:
        added up from the shared directory), and the database's gauges, read now; for a
        key scoped to some tenants or types, the series of those alone."""
        families = await self.families(now, database=True, merged=True)
        if caller is not None and caller.scoped:
            families = [_within(f, caller) for f in families]
        return render(families)

    async def families(self, now: datetime, *, database: bool, merged: bool) -> list[Metric]:
        """This process's events and state -- every process's of the server, added up
        from the shared directory, if ``merged`` and in multiprocess mode -- and, if
        ``database``, the database's gauges read now."""
        metrics = self.metrics
        metrics.sync()
        families: list[Metric] = []
        if database:
            try:
                families = list(
                    await database_gauges(
                        self.db, self.stats, self.resolve_aging, metrics.labels, now
                    )
                )
                up = 1.0
            except StoreUnavailable:
                up = 0.0
            families.append(_gauge("jobfair_database_up", DATABASE_UP, up))
        directory = multiprocess_dir()
        if merged and directory is not None:
            collector = MultiProcessCollector(None, directory)  # type: ignore[no-untyped-call]
            families.extend(await asyncio.to_thread(lambda: list(collector.collect())))
        else:
            families.extend(metrics.registry.collect())
        return families


DATABASE_UP = "1 if this scrape read the database's gauges, 0 if the database was away."


def _gauge(name: str, what: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, what, value=value)


# -- the database's gauges ------------------------------------------------------------


@dataclass
class _Folded:
    """One labelled lane's gauges: a lane's own, or the fold of every unlabelled one."""

    ready: int = 0
    delayed: int = 0
    active: int = 0
    oldest_s: float = 0.0
    realized: float = 0.0
    entitled: float = 0.0
    configured: float = 0.0
    lag: float | None = None
    capped: set[str] = field(default_factory=set)
    paused: bool = False
    weight: int | None = None  # a lane's own (a fold has none)
    lanes: int = 0
    held: set[str] = field(default_factory=set)  # what holds it now (HoldReason values)
    held_window: dict[str, float] = field(default_factory=dict)  # fraction of the window

    def add(self, v: LaneView) -> None:
        """Counts and shares add up; the oldest age, the lag and the flags take the
        largest (a fold is held back or paused if any lane in it is)."""
        self.ready += v.ready
        self.delayed += v.delayed
        self.active += v.active
        if v.oldest_ready_age_ms is not None:
            self.oldest_s = max(self.oldest_s, v.oldest_ready_age_ms / 1000)
        self.realized += v.realized_share
        self.entitled += v.entitled_share
        self.configured += v.configured_share
        if v.vtime_lag is not None:
            self.lag = v.vtime_lag if self.lag is None else max(self.lag, v.vtime_lag)
        if v.capped_by is not None:
            self.capped.add(v.capped_by)
        self.paused = self.paused or v.paused
        self.lanes += 1
        self.weight = v.weight if self.lanes == 1 else None
        self.held.update(h.reason.value for h in v.holds)
        for reason, f in v.held_in_window.items():
            self.held_window[reason] = max(self.held_window.get(reason, 0.0), f)


LANE_GAUGES: tuple[tuple[str, str, Callable[[_Folded], float | None]], ...] = (
    ("jobfair_ready_jobs", "Jobs activatable now (CREATED).", lambda f: f.ready),
    (
        "jobfair_delayed_jobs",
        "Jobs waiting for a runAt or a retry back-off (SCHEDULED).",
        lambda f: f.delayed,
    ),
    ("jobfair_active_jobs", "Jobs activated and not finished (ACTIVATED).", lambda f: f.active),
    (
        "jobfair_oldest_ready_age_seconds",
        "How long the oldest ready job has been ready (0: none is); <other>: the oldest "
        "of the folded tenants'.",
        lambda f: f.oldest_s,
    ),
    (
        "jobfair_realized_share",
        "The lane's fraction of its job type's activations in the share window.",
        lambda f: f.realized,
    ),
    (
        "jobfair_entitled_share",
        "The fraction of its job type's activations in the share window that its weight "
        "entitled it to, among the lanes backlogged then.",
        lambda f: f.entitled,
    ),
    (
        "jobfair_configured_share",
        "Its weight over the weights of the type's lanes with ready jobs now.",
        lambda f: f.configured,
    ),
    (
        "jobfair_vtime_lag",
        "Its virtual time minus the smallest of its type's backlogged lanes not held at a "
        "cap (0: picked next); only for backlogged lanes; <other>: the largest.",
        lambda f: f.lag,
    ),
    (
        "jobfair_paused",
        "1 while the lane's tenant or job type is paused.",
        lambda f: 1.0 if f.paused else 0.0,
    ),
)


async def database_gauges(
    db: Database,
    stats: StatsService,
    resolve_aging: Callable[[int | None, int | None], Aging],
    labels: TenantLabels,
    now: datetime,
) -> list[Metric]:
    """The gauges read from the database, folded to the labelled tenants."""
    views = await stats.lanes(now, every_lane=True)
    configured = {r.job_type: r for r in await operating.list_job_types(db)}
    folded: dict[tuple[str, str], _Folded] = {}
    types: set[str] = set()
    for v in views:
        types.add(v.job_type)
        key = (v.job_type, labels.shown(v.tenant_id))
        f = folded.get(key)
        if f is None:
            f = folded[key] = _Folded()
        f.add(v)
    families: list[Metric] = []
    for name, what, value in LANE_GAUGES:
        family = GaugeMetricFamily(name, what, labels=LANE)
        for (job_type, tenant), f in sorted(folded.items()):
            got = value(f)
            if got is not None:
                family.add_metric([job_type, tenant], got)
        families.append(family)
    capped = GaugeMetricFamily(
        "jobfair_capped",
        "1 while a cap holds the lane back (cap: tenant, its tenant's over every type; "
        "type, its job type's), so that a capped lane is not taken for a starved one.",
        labels=[*LANE, "cap"],
    )
    for (job_type, tenant), f in sorted(folded.items()):
        for cap in ("tenant", "type"):
            capped.add_metric([job_type, tenant, cap], 1.0 if cap in f.capped else 0.0)
    families.append(capped)
    weight = GaugeMetricFamily(
        "jobfair_weight",
        "The lane's tenant's weight (labelled tenants only: a fold has none).",
        labels=LANE,
    )
    held = GaugeMetricFamily(
        "jobfair_held",
        "1 while the reason holds the lane's ready jobs back now (tenantPaused, typePaused, "
        "tenantCap, typeCap, tenantRate, typeRate), else 0; <other>: any folded lane's.",
        labels=[*LANE, "reason"],
    )
    held_window = GaugeMetricFamily(
        "jobfair_held_window_fraction",
        "The fraction of the share window the reason held the lane's ready jobs back "
        "(<other>: the largest of the folded lanes').",
        labels=[*LANE, "reason"],
    )
    for (job_type, tenant), f in sorted(folded.items()):
        if tenant != OTHER and f.weight is not None:
            weight.add_metric([job_type, tenant], f.weight)
        for reason in LANE_REASONS:
            held.add_metric([job_type, tenant, reason.value], 1.0 if reason in f.held else 0.0)
        for why, fraction in sorted(f.held_window.items()):
            held_window.add_metric([job_type, tenant, why], fraction)
    families += [weight, held, held_window]
    families.extend(_key_gauges(views, labels))
    families.extend(await _key_cap_gauges(db, views, labels))
    keys_held = GaugeMetricFamily(
        "jobfair_keys_held",
        "Fairness keys of the type held at their caps now (a key's own maxActiveJobs or its "
        "type's maxActivePerKey; ADR 040): each waits for one of its running jobs to end.",
        labels=["type"],
    )
    held_keys = await operating.held_key_counts(db)
    for job_type in sorted(types | set(held_keys)):
        keys_held.add_metric([job_type], held_keys.get(job_type, 0))
    families.append(keys_held)
    failed_heads = GaugeMetricFamily(
        "jobfair_fifo_keys_failed_head",
        "FIFO keys of the type (keyOrdering fifo, ADR 041) stopped behind a FAILED head: "
        "each waits for an operator to cancel or retry that job (counted up to 10,000).",
        labels=["type"],
    )
    for job_type, n in sorted((await metric_reads.failed_fifo_heads(db)).items()):
        failed_heads.add_metric([job_type], n)
    families.append(failed_heads)
    families.extend(_minimum_gauges(stats, views, labels))
    bound = GaugeMetricFamily(
        "jobfair_aging_bound_seconds",
        "How long a priority-0 job of the type waits at most before aging makes it top "
        "priority (+Inf: no aging); an oldest ready age beyond it is starvation.",
        labels=["type"],
    )
    for job_type in sorted(types):
        row = configured.get(job_type)
        aging = resolve_aging(
            row.aging_interval_ms if row else None, row.aging_step if row else None
        )
        bound.add_metric([job_type], max_wait_to_top_ms(0, aging) / 1000)
    families.append(bound)
    families.append(
        _gauge(
            "jobfair_share_window_seconds",
            "The span the share window covers now (the last minute, once it is full).",
            stats.window.span_s,
        )
    )
    families.append(
        _gauge(
            "jobfair_labelled_tenants",
            "Tenants with a label of their own; every other is folded into <other>.",
            len(labels.labelled),
        )
    )
    return families


def _minimum_gauges(
    stats: StatsService, views: Sequence[LaneView], labels: TenantLabels
) -> list[Metric]:
    """Each labelled tenant's guaranteed minimum (ADR 042) against its ACTIVATED jobs of
    every type, as the last sample counted them, and whether it is below it with jobs
    ready; the folded tenants below theirs are counted under <other>."""
    minimum = GaugeMetricFamily(
        "jobfair_tenant_min_active_jobs",
        "The tenant's guaranteed minimum of ACTIVATED jobs of every type (minActiveJobs; "
        "tenants with one and a label of their own).",
        labels=["tenant"],
    )
    active = GaugeMetricFamily(
        "jobfair_tenant_active_jobs",
        "The ACTIVATED jobs of every type of a tenant with a minimum, as its minimum counts them.",
        labels=["tenant"],
    )
    below = GaugeMetricFamily(
        "jobfair_tenant_below_minimum",
        "1 while the tenant has ready jobs and fewer ACTIVATED than its minimum: served "
        "first, so it lasts only while the workers or a cap cannot take its jobs; "
        "<other>: how many of the folded tenants are.",
        labels=["tenant"],
    )
    ready: Counter[str] = Counter()
    for v in views:
        ready[v.tenant_id] += v.ready
    folded = 0
    for tenant_id, row in sorted(stats.limits.tenants.items()):
        if not row.min_active_jobs:
            continue
        n = stats.limits.active.get(("tenant", tenant_id), 0)
        short = ready[tenant_id] > 0 and n < row.min_active_jobs
        if tenant_id in labels.labelled:
            minimum.add_metric([tenant_id], row.min_active_jobs)
            active.add_metric([tenant_id], n)
            below.add_metric([tenant_id], 1.0 if short else 0.0)
        else:
            folded += short
    below.add_metric([OTHER], folded)
    return [minimum, active, below]


KEY = (*LANE, "key")
KEY_GAUGES: tuple[tuple[str, str, Callable[[KeyShare], float | None]], ...] = (
    (
        "jobfair_key_realized_share",
        "The fairness key's fraction of its lane's activations in the share window; "
        "key=<other>: the keys without a label of their own, folded.",
        lambda k: k.realized,
    ),
    (
        "jobfair_key_entitled_share",
        "The fraction of its lane's activations in the share window that its weight "
        "entitled it to, among the lane's keys backlogged then.",
        lambda k: k.entitled,
    ),
    (
        "jobfair_key_weight",
        "The fairness key's weight inside its lane (keys with a label of their own).",
        lambda k: None if k.key == OTHER_KEYS else k.weight,
    ),
    (
        "jobfair_key_vtime_lag",
        "Its virtual time minus the least of its lane's backlogged keys (0: served next "
        "in its lane); only for backlogged keys.",
        lambda k: k.vtime_lag,
    ),
)


def _key_gauges(views: Sequence[LaneView], labels: TenantLabels) -> list[Metric]:
    """The second level's gauges (ADR 027): the labelled tenants' lanes alone, each with
    its JOBFAIR_METRICS_TOP_KEYS most active keys by name and key="<other>" for the rest
    (an unlabelled tenant's keys are not shown: its lane is folded into <other>)."""
    families: list[Metric] = []
    for name, what, value in KEY_GAUGES:
        family = GaugeMetricFamily(name, what, labels=KEY)
        for v in views:
            if v.tenant_id not in labels.labelled:
                continue
            for k in v.keys:
                got = value(k)
                if got is not None:
                    family.add_metric([v.job_type, v.tenant_id, k.key], got)
        families.append(family)
    return families


async def _key_cap_gauges(
    db: Database, views: Sequence[LaneView], labels: TenantLabels
) -> list[Metric]:
    """The caps of the keys the second level's gauges show (ADR 040): each key's own cap
    against its ACTIVATED jobs of every type, and whether it is held now."""
    listed = [
        (v.job_type, v.tenant_id, stored_key(k.key))
        for v in views
        if v.tenant_id in labels.labelled
        for k in v.keys
        if k.key != OTHER_KEYS
    ]
    caps = await operating.key_caps_listed(db, listed)
    cap = GaugeMetricFamily(
        "jobfair_key_max_active_jobs",
        "The fairness key's own cap on ACTIVATED jobs of every type (its maxActiveJobs); "
        "keys with one.",
        labels=KEY,
    )
    active = GaugeMetricFamily(
        "jobfair_key_active_jobs",
        "The fairness key's ACTIVATED jobs of every type, where it has a cap of its own.",
        labels=KEY,
    )
    held = GaugeMetricFamily(
        "jobfair_key_held",
        "1 while the key is held now: at its own cap, at its type's maxActivePerKey, or "
        "(a FIFO type) behind its head; else 0.",
        labels=KEY,
    )
    for job_type, tenant, key in listed:
        found = caps.get((job_type, tenant, key))
        if found is None:
            continue
        labelled = [job_type, tenant, shown_key(key)]
        if found["maxActiveJobs"] is not None:
            cap.add_metric(labelled, found["maxActiveJobs"])
            active.add_metric(labelled, found["activeAllTypes"] or 0)
        held.add_metric(labelled, 1.0 if found["held"] else 0.0)
    return [cap, active, held]


# -- rendering ------------------------------------------------------------------------


# Event series labelled by job type alone: each sums every tenant's figures of its type,
# so a key scoped to some tenants is not given them.
TYPE_WIDE_EVENTS = frozenset(
    {
        "jobfair_activate_requests",
        "jobfair_activate_empty",
        "jobfair_processing_seconds",
        "jobfair_activate_request_seconds",
        "jobfair_long_poll_wait_seconds",
    }
)


def _within(family: Metric, caller: Principal) -> Metric:
    """``family`` with only the samples of tenants and types ``caller`` may see (the
    fold of the others is theirs too, so it is left out; and for a key scoped to some
    tenants, the series that add up every tenant's events of a type)."""
    out = Metric(family.name, family.documentation, family.type)
    if caller.tenants is not None and family.name in TYPE_WIDE_EVENTS:
        return out
    for s in family.samples:
        tenant, job_type = s.labels.get("tenant"), s.labels.get("type")
        if tenant is not None and (
            tenant == OTHER or (caller.tenants is not None and tenant not in caller.tenants)
        ):
            continue
        if job_type is not None and caller.types is not None and job_type not in caller.types:
            continue
        out.samples.append(s)
    return out


class _Families:
    """Metric families already made, as a collector prometheus-client can render."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def render(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4), written by prometheus-client."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))  # type: ignore[arg-type]
    return generate_latest(registry)
