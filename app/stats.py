"""Stats: what each lane got and was entitled to in the share window, what holds it back
(StatsService, sampled by every process); the limits a claim checks, read once for
the stats, the lanes view and a job's explanation."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app import scheduler
from app.db import Database, metric_reads, operating
from app.db.rows import JobTypeRow, LaneSampleRow, LaneStats, TenantRow
from app.domain import shown_key, stored_key, utcnow
from app.scheduler import Bucket
from app.shares import (
    OTHER_KEYS,
    KeySample,
    KeyShare,
    KeyWindow,
    LaneKeys,
    LaneSample,
    ShareWindow,
    Throughput,
)

STATS_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class LaneView:
    """One lane (job type, tenant) as the stats view and the metrics show it."""

    job_type: str
    tenant_id: str
    ready: int
    delayed: int
    active: int
    oldest_ready_age_ms: int | None  # of the oldest ready job, from when it became ready
    oldest_ready_key: int | None
    capped_by: str | None  # "tenant" or "type": the cap that holds the lane back now
    activated_in_window: int
    realized_share: float  # of the type's activations in the window
    entitled_share: float  # what its weight entitled it to of them (app.shares)
    configured_share: float  # its weight over those of the lanes with ready jobs now
    # Its virtual time minus the smallest among its type's backlogged lanes not held at
    # a cap (None: not backlogged).
    vtime_lag: float | None
    # Whether the lane's tenant or its job type is paused (POST .../pause), each apart,
    # and either (the metrics' flag).
    tenant_paused: bool = False
    type_paused: bool = False
    # The second level: its most active fairness keys in the window, then the others
    # folded (app.shares.KeyWindow).
    keys: tuple[KeyShare, ...] = ()
    weight: int = 1  # its tenant's
    # What holds it back now (a lane with ready jobs only), and what held it in the
    # window: the fraction of the window, by reason (app.shares.ShareWindow.held).
    holds: tuple[scheduler.Hold, ...] = ()
    held_in_window: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def paused(self) -> bool:
        return self.tenant_paused or self.type_paused


class StatsService:
    """``GET /v2/stats`` and the metrics' gauges.  Activations in the window (the last
    minute) come from the lanes' running totals (shared by every replica), sampled in
    process every few seconds and at every read (``app.shares``).  A job type fair by
    cost or by worker time has its shares measured in its units instead (ADR 029): the
    lanes' and keys' running counts of units served, in windows of their own."""

    def __init__(
        self,
        db: Database,
        sample_interval_s: float = 5.0,
        window_s: float = STATS_WINDOW_S,
        top_keys: int = 10,
    ) -> None:
        self.db = db
        self.sample_interval_s = sample_interval_s
        self.window = ShareWindow(window_s)
        self.keys = KeyWindow(window_s, top_keys)
        # The same, of units served: the shares of types fair by cost or worker time.
        self.units = ShareWindow(window_s)
        self.key_units = KeyWindow(window_s, top_keys)
        self.throughput = Throughput()
        self.latest: list[LaneSampleRow] = []
        # What holds each lane with ready jobs back, as of the latest sample, and the
        # tenants' and types' configuration it was judged from.
        self.holds: dict[tuple[str, str], list[scheduler.Hold]] = {}
        self.limits = Limits({}, {}, {}, utcnow())
        # Per job type: its running total of activations as last sampled, the monotonic
        # instant of the sample that first saw it there, and whether a sample saw it move
        # (else that instant is when this process first saw the type).
        self._moved: dict[str, tuple[int, float, bool]] = {}

    async def sample(self) -> list[LaneSampleRow]:
        """Sample every lane, and its most active keys, into the windows; the lanes read."""
        await self._sample_keys()
        rows = await metric_reads.lane_samples(self.db)
        self.limits = limits = await read_limits(self.db)
        holds = {
            (r.job_type, r.tenant_id): limits.holds(r.job_type, r.tenant_id)
            for r in rows
            if r.active
        }
        lanes = {
            (r.job_type, r.tenant_id): LaneSample(
                r.activated_total,
                r.active,
                r.weight,
                # A hold the claim left (lanes.held) and the counts no longer show: held
                # still, until a finish releases it.
                h[0].reason.value
                if (h := holds.get((r.job_type, r.tenant_id)))
                else (scheduler.HoldReason.TENANT_CAP.value if r.active and r.held else None),
                r.held_count,
            )
            for r in rows
        }
        units = {
            lane: sample._replace(served=r.units_total)
            for r, (lane, sample) in zip(rows, lanes.items(), strict=True)
        }
        now = time.monotonic()
        self.window.add(now, lanes)
        self.units.add(now, units)
        totals: dict[str, int] = {}
        for r in rows:
            totals[r.job_type] = totals.get(r.job_type, 0) + r.activated_total
        self.throughput.add(now, totals)
        for job_type, total in totals.items():
            seen = self._moved.get(job_type)
            if seen is None:
                self._moved[job_type] = (total, now, False)
            elif seen[0] != total:
                self._moved[job_type] = (total, now, True)
        self.latest = rows
        self.holds = holds
        return rows

    def idle_s(self, job_type: str) -> tuple[float, bool] | None:
        """How long no activation of ``job_type`` was seen (by this process's samples),
        and whether that is a lower bound (none seen since this process first saw the
        type); None: one was seen in the latest interval, or nothing was sampled yet."""
        moved = self._moved.get(job_type)
        latest = self.window.latest_s
        if moved is None or latest is None:
            return None
        total, at, seen_move = moved
        if seen_move and at >= latest:
            return None
        return time.monotonic() - at, not seen_move

    async def _sample_keys(self) -> None:
        tracked = [
            (job_type, tenant, stored_key(key))
            for (job_type, tenant), keys in self.keys.tracked().items()
            for key in keys
        ]
        lanes: dict[tuple[str, str], LaneKeys] = {}
        units: dict[tuple[str, str], LaneKeys] = {}
        for r in await metric_reads.key_samples(self.db, self.keys.top, tracked):
            lane = (r.job_type, r.tenant_id)
            got = lanes.get(lane)
            if got is None:
                got = lanes[lane] = LaneKeys(r.lane_total, r.backlogged_weight, r.least_vtime, {})
                units[lane] = LaneKeys(r.lane_units, r.backlogged_weight, r.least_vtime, {})
            sample = KeySample(r.activated_total, r.active, r.vtime, r.weight)
            got.keys[shown_key(r.fairness_key)] = sample
            units[lane].keys[shown_key(r.fairness_key)] = sample._replace(served=r.units_total)
        now = time.monotonic()
        self.keys.add(now, lanes)
        self.key_units.add(now, units)

    async def lanes(
        self,
        now: datetime,
        job_type: str | None = None,
        visible: Callable[[str, str], bool] | None = None,
        *,
        every_lane: bool = False,
    ) -> list[LaneView]:
        """Every lane with jobs ready, delayed or active (``job_type``'s alone, if
        given), by type and tenant; with ``every_lane``, also the lanes without any
        (counts 0), and without the oldest ready job's key, as the metrics show them
        (counted by a cheaper statement).  With ``visible``, the lanes it admits alone,
        their shares among them alone (a key's scope).  Reads the backlog."""
        sampled = await self.sample()
        tenants = list(self.limits.tenants.values())  # read by the sample
        weights = {r.tenant_id: r.weight for r in tenants}
        paused_tenants = {r.tenant_id for r in tenants if r.paused}
        job_types = list(self.limits.job_types.values())
        paused_types = {r.job_type for r in job_types if r.paused}
        if every_lane:
            rows = _with_caps(await metric_reads.lane_counts(self.db), tenants, job_types)
            if job_type is not None:
                rows = [r for r in rows if r.job_type == job_type]
        else:
            rows = await operating.stats(self.db, job_type)
        lags = _vtime_lags(sampled)
        # A type's cap holds its lanes back whoever's jobs fill it.
        type_active: dict[str, int] = {}
        type_full: dict[str, bool] = {}
        for r in rows:
            type_active[r.job_type] = type_active.get(r.job_type, 0) + r.active
        for r in rows:
            type_full[r.job_type] = r.type_cap is not None and type_active[r.job_type] >= r.type_cap
        if visible is not None:
            rows = [r for r in rows if visible(r.tenant_id, r.job_type)]
            sampled = [s for s in sampled if visible(s.tenant_id, s.job_type)]
        among = None if visible is None else lambda lane: visible(lane[1], lane[0])
        shares = self.window.shares(among)
        # A type fair by cost or worker time: its shares of units served (ADR 029).
        by_units = {r.job_type for r in self.latest if r.fairness_by is not None}
        if by_units:
            # Only there: a lane served activations but no units yet in the window (its
            # leases still out) has no share of them.
            shares = {lane: got for lane, got in shares.items() if lane[0] not in by_units}
            shares.update(
                (lane, got) for lane, got in self.units.shares(among).items() if lane[0] in by_units
            )
        backlogged: dict[str, list[str]] = {}
        for r in rows:
            # A paused tenant is owed nothing while paused: its weight is left out.
            if r.ready > 0 and not r.tenant_paused:
                backlogged.setdefault(r.job_type, []).append(r.tenant_id)
        configured = {
            t: scheduler.configured_shares(weights, tenants) for t, tenants in backlogged.items()
        }
        views = []
        seen = set()
        for r in rows:
            lane = (r.job_type, r.tenant_id)
            seen.add(lane)
            realized, entitled = shares.get(lane, (0.0, 0.0))
            capped = None
            if r.tenant_cap is not None and (r.tenant_active or 0) >= r.tenant_cap:
                capped = "tenant"
            elif type_full[r.job_type]:
                capped = "type"
            views.append(
                LaneView(
                    r.job_type,
                    r.tenant_id,
                    r.ready,
                    r.delayed,
                    r.active,
                    _age_ms(now, r.oldest_ready_at),
                    r.oldest_ready_key,
                    capped,
                    self.window.activated(lane),
                    realized,
                    entitled,
                    configured.get(r.job_type, {}).get(r.tenant_id, 0.0),
                    lags.get(lane),
                    r.tenant_paused,
                    r.type_paused,
                    self._key_shares(lane, by_units),
                    weights.get(r.tenant_id, 1),
                    tuple(self.holds.get(lane, ())) if r.ready else (),
                    self.window.held(lane),
                )
            )
        # Every lane served or held in the window has a row, even with nothing waiting
        # now (a tenant whose jobs are taken as they come); with every_lane, every lane.
        others = set(shares) | {
            lane for lane in self.window.lanes() if among is None or among(lane)
        }
        if every_lane:
            others |= {(s.job_type, s.tenant_id) for s in sampled}
        if others - seen:
            for lane in sorted(others - seen):
                if job_type is not None and lane[0] != job_type:
                    continue
                realized, entitled = shares.get(lane, (0.0, 0.0))
                views.append(
                    LaneView(
                        *lane,
                        0,
                        0,
                        0,
                        None,
                        None,
                        None,
                        self.window.activated(lane),
                        realized,
                        entitled,
                        0.0,
                        lags.get(lane),
                        lane[1] in paused_tenants,
                        lane[0] in paused_types,
                        self._key_shares(lane, by_units),
                        weights.get(lane[1], 1),
                        (),
                        self.window.held(lane),
                    )
                )
        return views

    def _key_shares(self, lane: tuple[str, str], by_units: set[str]) -> tuple[KeyShare, ...]:
        """The lane's keys in the window: listed by activations, their shares of units
        served where its type is fair by cost or worker time."""
        listed = self.keys.shares(lane)
        if lane[0] not in by_units:
            return tuple(listed)
        units = {k.key: k for k in self.key_units.shares(lane, [k.key for k in listed])}
        return tuple(
            dataclasses.replace(k, realized=u.realized, entitled=u.entitled)
            if (u := units.get(k.key)) is not None
            else dataclasses.replace(k, realized=0.0, entitled=0.0)
            for k in listed
        )

    async def stats(
        self,
        now: datetime,
        job_type: str | None = None,
        visible: Callable[[str, str], bool] | None = None,
    ) -> dict[str, Any]:
        """Per job type (``job_type`` alone, if given) and lane: ``pending`` jobs are
        ``ready`` (activatable now) or ``delayed`` (a runAt or a retry back-off still
        ahead).  ``oldestPendingAgeMs`` and ``oldestReadyJobKey`` are those of the
        oldest ready job, timed from when it became ready: a delayed job is not
        waiting.  ``cappedBy`` says which cap, if any, stops the lane from getting more
        jobs now ("tenant": its tenant's, over every type; else "type"), so a lane held
        back by a cap does not look starved; ``paused``, whether the type or the tenant
        is paused.  Configured shares are over the lanes with ready jobs now whose
        tenant is not paused, entitled ones over the lanes backlogged in the window (a
        paused tenant's lanes are held, so not backlogged); all shares are among the
        lanes the caller may see (its key's scope)."""
        types: dict[str, dict[str, Any]] = {}
        for v in await self.lanes(now, job_type, visible):
            t = types.get(v.job_type)
            if t is None:
                t = types[v.job_type] = {
                    "type": v.job_type,
                    "pending": 0,
                    "ready": 0,
                    "delayed": 0,
                    "active": 0,
                    "oldestPendingAgeMs": None,
                    "oldestReadyJobKey": None,
                    "paused": v.type_paused,
                    "tenants": [],
                }
            age = v.oldest_ready_age_ms
            key = None if v.oldest_ready_key is None else str(v.oldest_ready_key)
            pending = v.ready + v.delayed
            t["pending"] += pending
            t["ready"] += v.ready
            t["delayed"] += v.delayed
            t["active"] += v.active
            if age is not None and (
                t["oldestPendingAgeMs"] is None or age > t["oldestPendingAgeMs"]
            ):
                t["oldestPendingAgeMs"], t["oldestReadyJobKey"] = age, key
            t["tenants"].append(
                {
                    "tenantId": v.tenant_id,
                    "pending": pending,
                    "ready": v.ready,
                    "delayed": v.delayed,
                    "active": v.active,
                    "oldestPendingAgeMs": age,
                    "oldestReadyJobKey": key,
                    "cappedBy": v.capped_by,
                    "activatedLastMinute": v.activated_in_window,
                    "realizedShare": round(v.realized_share, 4),
                    "configuredShare": round(v.configured_share, 4),
                    "entitledShare": round(v.entitled_share, 4),
                    "vtimeLag": None if v.vtime_lag is None else round(v.vtime_lag, 6),
                    "paused": v.tenant_paused,
                    "weight": v.weight,
                    **self._minimum(v.tenant_id),
                    "heldBy": [_hold(h) for h in v.holds],
                    "heldInWindow": {r: round(f, 4) for r, f in sorted(v.held_in_window.items())},
                    "keys": [_key_share(k) for k in v.keys],
                }
            )
        await self._key_caps(types)
        # The series sums every tenant's activations: a key that sees only some is not
        # given it (its dashboard draws the series from what it samples itself).
        series = {} if visible is not None else self.throughput.per_minute(time.monotonic())
        for t in types.values():
            t["activatedPerMinute"] = series.get(t["type"]) if visible is None else None
            idle = self.idle_s(t["type"])
            t["noActivationForMs"] = None if idle is None else int(idle[0] * 1000)
            t["noActivationSinceStart"] = idle is not None and idle[1]
        return {"jobTypes": list(types.values()), "windowMs": int(self.window.span_s * 1000)}

    def _minimum(self, tenant_id: str) -> dict[str, Any]:
        """A lane's tenant's minimum (ADR 042) and its ACTIVATED jobs of every type,
        where a cap or a minimum has them counted (as the sample read them)."""
        row = self.limits.tenants.get(tenant_id)
        return {
            "minActiveJobs": None if row is None else row.min_active_jobs,
            "tenantActive": self.limits.active.get(("tenant", tenant_id)),
        }

    async def _key_caps(self, types: dict[str, dict[str, Any]]) -> None:
        """Each listed key's caps and what they count, read at once (ADR 040)."""
        listed = [
            (t["type"], lane["tenantId"], stored_key(k["fairnessKey"]))
            for t in types.values()
            for lane in t["tenants"]
            for k in lane["keys"]
            if k["fairnessKey"] != OTHER_KEYS
        ]
        caps = await operating.key_caps_listed(self.db, listed)
        for t in types.values():
            for lane in t["tenants"]:
                for k in lane["keys"]:
                    found = caps.get((t["type"], lane["tenantId"], stored_key(k["fairnessKey"])))
                    k.update(found or NO_KEY_CAPS)


# A listed key's caps where none was read (on Citus).
NO_KEY_CAPS = {
    "maxActiveJobs": None,
    "maxActivePerKey": None,
    "active": None,
    "activeAllTypes": None,
    "held": False,
    "head": None,
    "headState": None,
}


def _hold(h: scheduler.Hold) -> dict[str, Any]:
    shown: dict[str, Any] = {"reason": h.reason.value}
    if h.limit is not None:
        shown |= {"active": h.active, "limit": h.limit}
    if h.next_token_s is not None:
        shown["nextTokenInMs"] = math.ceil(h.next_token_s * 1000)
    return shown


def _key_share(k: KeyShare) -> dict[str, Any]:
    return {
        "fairnessKey": k.key,
        "activatedLastMinute": k.activated,
        "realizedShare": round(k.realized, 4),
        "entitledShare": round(k.entitled, 4),
        "weight": k.weight,
        "vtimeLag": None if k.vtime_lag is None else round(k.vtime_lag, 6),
    }


@dataclass(frozen=True, slots=True)
class Limits:
    """What the claims check of every lane, read at once: every configured tenant and
    job type (pause, cap, rate bucket), the active jobs counted against the caps, and the
    database's clock when read (the one claims take tokens by)."""

    tenants: dict[str, TenantRow]
    job_types: dict[str, JobTypeRow]
    active: dict[tuple[str, str], int]
    at: datetime

    def holds(self, job_type: str, tenant: str) -> list[scheduler.Hold]:
        """What stops a claim from taking a job of the lane now (app.scheduler.holds)."""
        limits = lane_limits(self.tenants.get(tenant), self.job_types.get(job_type), self.active)
        return scheduler.holds(limits, self.at)


async def read_limits(db: Database) -> Limits:
    tenants = {t.tenant_id: t for t in await operating.list_tenants(db)}
    job_types = {t.job_type: t for t in await operating.list_job_types(db)}
    active = await metric_reads.capped_active(db)
    read_at = [t.read_at for t in tenants.values()] + [t.read_at for t in job_types.values()]
    return Limits(tenants, job_types, active, read_at[0] if read_at else utcnow())


def lane_limits(
    tenant: TenantRow | None,
    job_type: JobTypeRow | None,
    active: dict[tuple[str, str], int],
) -> scheduler.LaneLimits:
    """A lane's limits from its tenant's and type's rows (None: unconfigured) and the
    active jobs counted against their caps (``app.db.metric_reads.capped_active``)."""

    def bucket(row: TenantRow | JobTypeRow | None) -> Bucket | None:
        if row is None or row.rate_per_s is None or row.rate_burst is None:
            return None
        if row.rate_tokens is None or row.rate_at is None:
            return None  # a bucket never drawn from: full
        return Bucket(row.rate_per_s, row.rate_burst, row.rate_tokens, row.rate_at)

    return scheduler.LaneLimits(
        tenant_paused=tenant is not None and tenant.paused,
        type_paused=job_type is not None and job_type.paused,
        tenant_cap=None if tenant is None else tenant.max_active_jobs,
        tenant_active=0 if tenant is None else active.get(("tenant", tenant.tenant_id), 0),
        type_cap=None if job_type is None else job_type.max_active_jobs,
        type_active=0 if job_type is None else active.get(("type", job_type.job_type), 0),
        tenant_bucket=bucket(tenant),
        type_bucket=bucket(job_type),
    )


def _with_caps(
    rows: Sequence[LaneStats],
    tenants: Sequence[TenantRow],
    job_types: Sequence[JobTypeRow],
) -> list[LaneStats]:
    """``rows`` with their caps, their tenants' active jobs (of every type) and whether
    their tenant or type is paused, as the stats statement joins them."""
    by_tenant = {t.tenant_id: t for t in tenants}
    by_type = {t.job_type: t for t in job_types}
    tenant_active: dict[str, int] = {}
    for r in rows:
        tenant_active[r.tenant_id] = tenant_active.get(r.tenant_id, 0) + r.active
    out = []
    for r in rows:
        tenant, job_type = by_tenant.get(r.tenant_id), by_type.get(r.job_type)
        out.append(
            dataclasses.replace(
                r,
                tenant_cap=None if tenant is None else tenant.max_active_jobs,
                type_cap=None if job_type is None else job_type.max_active_jobs,
                tenant_active=tenant_active[r.tenant_id],
                tenant_paused=tenant is not None and tenant.paused,
                type_paused=job_type is not None and job_type.paused,
            )
        )
    return out


def _vtime_lags(rows: Sequence[LaneSampleRow]) -> dict[tuple[str, str], float]:
    """Per backlogged lane: its vtime minus the smallest of its type's backlogged lanes
    not held at a cap (the lane the scheduler picks next has 0); of every backlogged
    lane when all are held."""
    least: dict[str, float] = {}
    least_held: dict[str, float] = {}
    for r in rows:
        if r.active:
            into = least_held if r.held else least
            into[r.job_type] = min(into.get(r.job_type, r.vtime), r.vtime)
    out = {}
    for r in rows:
        if r.active:
            base = least.get(r.job_type, least_held.get(r.job_type, r.vtime))
            out[(r.job_type, r.tenant_id)] = r.vtime - base
    return out


def _age_ms(now: datetime, since: datetime | None) -> int | None:
    if since is None:
        return None
    return max(0, int((now - since).total_seconds() * 1000))
