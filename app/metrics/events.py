"""Prometheus metrics, the events: every series, its labels and its meaning are in docs/metrics.md.

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
``PROMETHEUS_MULTIPROC_DIR`` (the supervisor makes and removes it, ``app.infra.supervisor``),
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
import os
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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


class ActivatedJob(Protocol):
    """What the events read of a job just activated (app.db.rows.JobRow has it)."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def queued_at(self) -> datetime: ...
    @property
    def activated_at(self) -> datetime | None: ...


# A set of labelled tenants as stored: from when it applies, and its tenants
# (app.db.rows.TenantSet is one).
TenantSet = tuple[datetime, frozenset[str]]


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
        for effective_at, tenants in sorted(sets):
            if effective_at <= now:
                self.members, self.effective_at = tenants, effective_at
            elif coming is None:
                coming = (effective_at, tenants)
        self._trim()
        if self._switch is not None:
            self._switch.cancel()
            self._switch = None
        if coming is not None:
            effective_at, tenants = coming
            delay_s = max(0.0, (effective_at - now).total_seconds())
            self._switch = asyncio.get_running_loop().call_later(
                delay_s, self._take, tenants, effective_at
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
    degraded: int = 0  # 1 while the jobs table holds many dead versions (ADR 036)


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
    """One app's metrics: the event counters and histograms, the process gauges and the
    tenant labels (a scrape reads them: app.metrics.scrape)."""

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
            "degraded": gauge(
                "jobfair_jobs_table_degraded",
                "Server processes working around a jobs table full of dead row versions "
                "(a transaction holding the xmin horizon?).",
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

    def jobs_activated(self, job_type: str, rows: Sequence[ActivatedJob]) -> None:
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

    def refused(self, reason: str) -> None:
        """A 503 answered, for ``reason`` (store_unavailable, outcome_unknown, overloaded,
        resource_exhausted)."""
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
