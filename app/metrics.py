"""Prometheus metrics: every series, its labels and its meaning are in docs/metrics.md.

Three kinds, from three places:

* **Events** (counters and histograms by job type and tenant): counted in the process
  where each is decided, once its statement has committed, one ``inc(n)`` per batch and
  lane; a histogram's observations of a batch are binned first and written once per
  bucket (``observe_all``).
* **Process state** (waiters, streams, the connection pool, and the counters the
  services keep as plain integers): copied into the metrics by each process every
  second, and by the process answering a scrape at the scrape.
* **The backlog and fairness** (ready, delayed and active jobs, the oldest ready age,
  realised against entitled share, virtual-time lag, caps): read from the database by
  the process answering the scrape, at the scrape -- global values, emitted once, never
  added up over processes.

With several server processes (``jobfair serve --workers N``) the first two go through
prometheus-client's multiprocess mode: each process writes its values to files in
``PROMETHEUS_MULTIPROC_DIR`` (the supervisor makes and removes it, ``app.supervisor``),
and a scrape, whichever process answers it, adds up every process's counters (those of
processes that have died included, so a counter never goes back) and the live processes'
gauges.

Tenants are labelled by name up to ``JOBFAIR_METRICS_TOP_TENANTS`` (K) of them, the most
active; every other tenant's events and gauges are folded into ``tenant="<other>"``
(angle brackets, like ``<default>``: no tenant can be named that).  The set is decided by
the leader (``TenantRanker``) and published in the database with the instant it applies
from, a little ahead, so every process switches to it at the same moment
(``TenantLabels``): at any instant all processes label alike, and since every event is
counted once under one label, sums over tenants are exact.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from app.db import Database, StoreUnavailable
from app.db import metrics as stored
from app.db import operators as stored_operators
from app.db.rows import JobRow, TenantSet
from app.errors import JobfairError, OutcomeUnknown, Overloaded
from app.keys import Principal
from app.operators import LaneView, StatsService
from app.scheduler import Aging, HoldReason, max_wait_to_top_ms
from app.shares import OTHER_KEYS, KeyShare

log = logging.getLogger(__name__)

# Counters here are counters, with no ``_created`` twin per series (it would double them).
prometheus_client.disable_created_metrics()

OTHER = "<other>"  # the tenant label of every tenant without one of its own
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# How often each process reads the labelled set, and how far ahead of its effective
# instant the leader publishes a new one: more than a read's interval (and its jitter),
# so that every process has read it before it applies.
LABELS_POLL_S = 5.0
LABELS_LEAD_S = 15.0
# How often each process copies its own state into the metrics (multiprocess mode).
PROCESS_SYNC_S = 1.0

# Bucket bounds, seconds.  Few enough that the series stay bounded at K tenants by type
# (docs/metrics.md), spread from a hand-off (milliseconds) to an hour.
PICKUP_BUCKETS_S = (0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
PROCESSING_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
REQUEST_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)
WAIT_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)

LANE = ("type", "tenant")
# Outcomes of a finish, for the processing-time histogram and the counters.
COMPLETED, FAILED, RETRIED, ERROR_THROWN = "completed", "failed", "retried", "error_thrown"


def multiprocess_dir() -> str | None:
    """The multiprocess directory, if this process writes its metrics to one."""
    return os.environ.get(MULTIPROC_ENV) or None


class TenantLabels:
    """Which tenants get a label of their own: the set in force (read from the database
    by every process, decided by the leader), switched to the next one at the instant it
    applies from; and, while that set and the tenants admitted since hold fewer than
    ``top``, every tenant an event names, at once (``admitted``).  Every process admits
    alike while there is room (each admits every tenant it counts an event of), so a
    tenant's series mean the same in every process and a sum over tenants stays exact;
    the leader's next set, which ranks the tenants admitted, decides at the edge."""

    def __init__(self, top: int = 0) -> None:
        self.top = top
        self.members: frozenset[str] = frozenset()
        self.admitted: set[str] = set()
        self.effective_at: datetime | None = None
        self._switch: asyncio.TimerHandle | None = None

    def of(self, tenant: str) -> str:
        """The label an event of ``tenant`` is counted under (admitting it if there is
        room)."""
        if tenant in self.members or tenant in self.admitted:
            return tenant
        if len(self.members) + len(self.admitted) < self.top:
            self.admitted.add(tenant)
            return tenant
        return OTHER

    def shown(self, tenant: str) -> str:
        """The label ``tenant``'s gauges carry (admitting no one)."""
        return tenant if tenant in self.members or tenant in self.admitted else OTHER

    @property
    def labelled(self) -> frozenset[str]:
        return self.members | self.admitted

    def apply(self, sets: Sequence[TenantSet], now: datetime) -> None:
        """Take the set in force at ``now`` and arm the switch to the next one, if any."""
        coming: TenantSet | None = None
        for s in sorted(sets):
            if s.effective_at <= now:
                self.members, self.effective_at = s.tenants, s.effective_at
            elif coming is None:
                coming = s
        self._trim()
        if self._switch is not None:
            self._switch.cancel()
            self._switch = None
        if coming is not None:
            delay_s = max(0.0, (coming.effective_at - now).total_seconds())
            self._switch = asyncio.get_running_loop().call_later(
                delay_s, self._take, coming.tenants, coming.effective_at
            )

    def _take(self, tenants: frozenset[str], effective_at: datetime) -> None:
        self.members, self.effective_at = tenants, effective_at
        self._switch = None
        self._trim()

    def _trim(self) -> None:
        """The admitted tenants the set in force leaves room for (by name: alike in
        every process)."""
        room = max(0, self.top - len(self.members))
        self.admitted = set(sorted(self.admitted - self.members)[:room])

    def close(self) -> None:
        if self._switch is not None:
            self._switch.cancel()


@dataclass
class ProcessState:
    """What a process keeps in plain integers and reads off its objects, copied into
    the metrics by ``Metrics.sync``."""

    activation_queries: int = 0
    lead_claims: int = 0
    hand_offs: int = 0
    wake_queries: int = 0
    wakeups: int = 0
    backup_polls: int = 0
    listen_connections: int = 0
    waiters: int = 0
    streams: int = 0
    pool_size: int = 0
    pool_idle: int = 0
    pool_max: int = 0
    pool_waiting: int = 0


def observe_all(child: Any, values: Iterable[float]) -> None:
    """``child.observe(v)`` for each of ``values``, binned here and written once per
    bucket: a batch of 1,000 jobs costs a few writes instead of 2,000 (each one a lock,
    and in multiprocess mode a write to the shared file).  Uses the histogram child's
    buckets and sum, as its own ``observe`` does (tests/unit/test_metrics.py checks the
    two agree)."""
    bounds = child._upper_bounds
    counts = [0] * len(bounds)
    total = 0.0
    for v in values:
        v = v if v > 0 else 0.0
        counts[bisect_left(bounds, v)] += 1
        total += v
    for i, n in enumerate(counts):
        if n:
            child._buckets[i].inc(n)
    child._sum.inc(total)


class Metrics:
    """One app's metrics: the event counters and histograms, the process gauges, the
    tenant labels, and the exposition."""

    def __init__(self, top_tenants: int) -> None:
        self.top_tenants = top_tenants
        self.labels = TenantLabels(top_tenants)
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._synced: dict[str, int] = {}
        self.process_state: Callable[[], ProcessState] = ProcessState
        r = self.registry

        def jobs(event: str, what: str) -> Counter:
            return Counter(f"jobfair_jobs_{event}", what, LANE, registry=r)

        self.created = jobs("created", "Jobs created (an idempotent repeat is not).")
        self.activated = jobs("activated", "Jobs activated (each activation of a job).")
        self.completed = jobs("completed", "Jobs completed.")
        self.failed = jobs("failed", "Jobs failed with no retries left: now FAILED.")
        self.retried = jobs("retried", "Failures with retries left: the job is queued again.")
        self.error_thrown = jobs("error_thrown", "Jobs ended by a business error.")
        self.canceled = jobs("canceled", "Jobs canceled before they were activated.")
        self.lease_expired = jobs(
            "lease_expired", "Activations whose lease ran out: the job is queued again."
        )
        self.released = jobs(
            "released", "Activations given back at once: their caller never received them."
        )
        self.activate_requests = Counter(
            "jobfair_activate_requests",
            "Activation requests (long polls included; streams are not requests).",
            ["type"],
            registry=r,
        )
        self.activate_empty = Counter(
            "jobfair_activate_empty",
            "Activation requests answered with no job.",
            ["type"],
            registry=r,
        )
        self.pickup = Histogram(
            "jobfair_pickup_latency_seconds",
            "From when a job became ready (queued_at) to its activation.",
            LANE,
            buckets=PICKUP_BUCKETS_S,
            registry=r,
        )
        self.processing = Histogram(
            "jobfair_processing_seconds",
            "From a job's activation to its worker's finish, by outcome.",
            ["type", "outcome"],
            buckets=PROCESSING_BUCKETS_S,
            registry=r,
        )
        self.request_latency = Histogram(
            "jobfair_activate_request_seconds",
            "An activation request's time in the server, from its body read to its "
            "answer; waited: whether it waited in the queue for jobs (a long poll).",
            ["type", "waited"],
            buckets=REQUEST_BUCKETS_S,
            registry=r,
        )
        self.long_poll_wait = Histogram(
            "jobfair_long_poll_wait_seconds",
            "How long a long poll waited in the queue, by how it ended "
            "(jobs, timeout, gone, closed, error).",
            ["type", "outcome"],
            buckets=WAIT_BUCKETS_S,
            registry=r,
        )
        self.unavailable = Counter(
            "jobfair_http_503_answers",
            "503 answers, by reason: store_unavailable (the database away or every pooled "
            "connection busy), outcome_unknown, overloaded (JOBFAIR_MAX_IN_FLIGHT requests "
            "worked on), resource_exhausted (waiters full, shutting down, schema not at head).",
            ["reason"],
            registry=r,
        )
        self._outcomes = {
            COMPLETED: self.completed,
            FAILED: self.failed,
            RETRIED: self.retried,
            ERROR_THROWN: self.error_thrown,
        }
        # The process's own integers, kept under the names /metrics always had.
        self._process_counters = {
            "activation_queries": Counter(
                "jobfair_activation_queries",
                "Activation rounds that reached the database.",
                registry=r,
            ),
            "lead_claims": Counter(
                "jobfair_activation_lead_claims",
                "Activation rounds that read and claimed one stride pick in one statement "
                "(a waiter woken by one new job).",
                registry=r,
            ),
            "hand_offs": Counter(
                "jobfair_activation_hand_offs",
                "New jobs claimed for a waiting request in the transaction that created them.",
                registry=r,
            ),
            "wake_queries": Counter(
                "jobfair_wake_queries",
                "Activation queries made for waiting requests.",
                registry=r,
            ),
            "wakeups": Counter(
                "jobfair_wakeups",
                "Wake-ups of waiting requests: NOTIFYs of ready jobs or freed capacity, and "
                "reconnects of the LISTEN connection.",
                registry=r,
            ),
            "backup_polls": Counter(
                "jobfair_backup_polls",
                "Waiter queues woken by their jittered backup poll (no NOTIFY came).",
                registry=r,
            ),
            "listen_connections": Counter(
                "jobfair_listen_connections", "LISTEN connections established.", registry=r
            ),
        }

        def gauge(name: str, what: str) -> Gauge:
            return Gauge(name, what, registry=r, multiprocess_mode="livesum")

        self._process_gauges = {
            "waiters": gauge("jobfair_waiters", "Long polls and streams waiting for jobs."),
            "streams": gauge("jobfair_streams", "Open SSE job streams."),
            "pool_size": gauge("jobfair_db_pool_size", "Database connections open."),
            "pool_idle": gauge("jobfair_db_pool_idle", "Idle database connections."),
            "pool_max": gauge("jobfair_db_pool_max", "Database connections the pools may open."),
            "pool_waiting": gauge(
                "jobfair_db_pool_waiting", "Calls waiting for a pooled connection."
            ),
        }
        self._in_use = gauge("jobfair_db_pool_in_use", "Database connections lent out.")
        # 1 per process: in multiprocess mode, how many server processes are live.
        self._processes = gauge("jobfair_server_processes", "Server processes serving.")

    # -- events (hot path: a dict lookup and an inc per lane and batch) ------------------

    def _child(self, family: Any, *labels: str) -> Any:
        key = (family, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def count(self, family: Counter, lanes: Iterable[tuple[str, str]]) -> None:
        """One event of ``family`` per (job type, tenant) in ``lanes``."""
        of = self.labels.of
        for (job_type, tenant), n in Tally((t, of(tenant)) for t, tenant in lanes).items():
            self._child(family, job_type, tenant).inc(n)

    def count_one(self, family: Counter, job_type: str, tenant: str) -> None:
        self._child(family, job_type, self.labels.of(tenant)).inc(1)

    def jobs_activated(self, job_type: str, rows: Sequence[JobRow]) -> None:
        """Jobs of ``job_type`` just activated: counted, and their pickup latency."""
        if not rows:
            return
        of = self.labels.of
        waits: dict[str, list[float]] = {}
        for r in rows:
            tenant = of(r.tenant_id)
            took = (r.activated_at - r.queued_at).total_seconds() if r.activated_at else 0.0
            into = waits.get(tenant)
            if into is None:
                waits[tenant] = [took]
            else:
                into.append(took)
        for tenant, seconds in waits.items():
            self._child(self.activated, job_type, tenant).inc(len(seconds))
            observe_all(self._child(self.pickup, job_type, tenant), seconds)

    def jobs_finished(
        self,
        outcome: str,
        rows: Iterable[tuple[str, str, datetime | None]],
        now: datetime,
    ) -> None:
        """Jobs (type, tenant, activated_at) a worker finished with ``outcome``."""
        family = self._outcomes[outcome]
        of = self.labels.of
        lanes: dict[tuple[str, str], int] = {}
        took: dict[str, list[float]] = {}
        for job_type, tenant, activated_at in rows:
            lane = (job_type, of(tenant))
            lanes[lane] = lanes.get(lane, 0) + 1
            spent = (now - activated_at).total_seconds() if activated_at else 0.0
            into = took.get(job_type)
            if into is None:
                took[job_type] = [spent]
            else:
                into.append(spent)
        for (job_type, tenant), n in lanes.items():
            self._child(family, job_type, tenant).inc(n)
        for job_type, seconds in took.items():
            observe_all(self._child(self.processing, job_type, outcome), seconds)

    def activate_request(self, job_type: str, seconds: float, *, waited: bool, empty: bool) -> None:
        self._child(self.activate_requests, job_type).inc(1)
        if empty:
            self._child(self.activate_empty, job_type).inc(1)
        self._child(self.request_latency, job_type, "true" if waited else "false").observe(seconds)

    def waited(self, job_type: str, seconds: float, outcome: str) -> None:
        self._child(self.long_poll_wait, job_type, outcome).observe(seconds)

    def refused(self, exc: JobfairError) -> None:
        """A 503 answered for ``exc``."""
        if isinstance(exc, OutcomeUnknown):
            reason = "outcome_unknown"
        elif isinstance(exc, StoreUnavailable):
            reason = "store_unavailable"
        elif isinstance(exc, Overloaded):
            reason = "overloaded"
        else:
            reason = "resource_exhausted"
        self._child(self.unavailable, reason).inc(1)

    # -- process state -----------------------------------------------------------------

    def sync(self) -> None:
        """Copy this process's state into the metrics: counters by what they grew since
        the last copy, gauges as they are."""
        state = self.process_state()
        for name, counter in self._process_counters.items():
            value = getattr(state, name)
            grown = value - self._synced.get(name, 0)
            if grown > 0:
                counter.inc(grown)
                self._synced[name] = value
        for name, g in self._process_gauges.items():
            g.set(getattr(state, name))
        self._in_use.set(state.pool_size - state.pool_idle)
        self._processes.set(1)

    # -- the exposition ----------------------------------------------------------------

    async def exposition(
        self,
        db: Database,
        stats: StatsService,
        resolve_aging: Callable[[int | None, int | None], Aging],
        now: datetime,
        caller: Principal | None = None,
    ) -> bytes:
        """The text a scrape gets: every process's events and state (multiprocess mode:
        added up from the shared directory), and the database's gauges, read now; for a
        key scoped to some tenants or types, the series of those alone."""
        self.sync()
        try:
            snapshot = await database_gauges(db, stats, resolve_aging, self.labels, now)
            up = 1.0
        except StoreUnavailable:
            snapshot, up = [], 0.0
        families = [*snapshot, _gauge("jobfair_database_up", DATABASE_UP, up)]
        directory = multiprocess_dir()
        if directory is not None:
            merged = MultiProcessCollector(None, directory)  # type: ignore[no-untyped-call]
            families.extend(await asyncio.to_thread(lambda: list(merged.collect())))
        else:
            families.extend(self.registry.collect())
        if caller is not None and caller.scoped:
            families = [_within(f, caller) for f in families]
        return render(families)


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
    configured = {r.job_type: r for r in await stored_operators.list_job_types(db)}
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
        for reason in HoldReason:
            held.add_metric([job_type, tenant, reason.value], 1.0 if reason in f.held else 0.0)
        for why, fraction in sorted(f.held_window.items()):
            held_window.add_metric([job_type, tenant, why], fraction)
    families += [weight, held, held_window]
    families.extend(_key_gauges(views, labels))
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


def render(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4), values that are whole numbers written as
    integers (``jobfair_waiters 3``, as /metrics always wrote them)."""
    lines: list[str] = []
    for family in families:
        name = family.name + "_total" if family.type == "counter" else family.name
        kind = {"unknown": "untyped"}.get(family.type, family.type)
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for s in family.samples:
            if s.labels:
                pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
                lines.append(f"{s.name}{{{pairs}}} {_number(s.value)}")
            else:
                lines.append(f"{s.name} {_number(s.value)}")
    return ("\n".join(lines) + "\n").encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


# -- the background work --------------------------------------------------------------


class LabelRefresher:
    """Every process: reads the labelled tenants' sets and applies them."""

    name = "metric-labels"

    def __init__(self, db: Database, labels: TenantLabels) -> None:
        self.db = db
        self.labels = labels
        self.interval_ms = int(LABELS_POLL_S * 1000)

    async def run_once(self, now: datetime) -> int:
        sets = await stored.tenant_sets(self.db)
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
        sets = await stored.tenant_sets(self.db)
        newest = max(sets).tenants if sets else None
        if chosen != newest:
            await stored.publish_tenants(
                self.db, now + timedelta(seconds=LABELS_LEAD_S), sorted(chosen), now
            )
        return len(chosen)
