"""Operator services: tenant and job-type configuration, and the stats view."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from app import scheduler
from app.db import Database
from app.db import operators as stored
from app.db.rows import JobRow, JobTypeRow, TenantRow
from app.errors import NotFound
from app.scheduler import Aging

STATS_WINDOW_S = 60.0


class ConfigService:
    def __init__(self, db: Database, resolve_aging: Callable[[int | None, int | None], Aging]):
        self.db = db
        # The server-wide defaults fill what a job type leaves unset (ActivationService).
        self.resolve_aging = resolve_aging

    async def put_tenant(self, tenant_id: str, weight: int, cap: int | None) -> dict[str, Any]:
        return _tenant(await stored.upsert_tenant(self.db, tenant_id, weight, cap))

    async def get_tenant(self, tenant_id: str) -> dict[str, Any]:
        row = await stored.get_tenant(self.db, tenant_id)
        if row is None:
            # An unconfigured tenant has the defaults; it is not an error to look at it,
            # and the answer says it is not configured.
            return _unconfigured_tenant(tenant_id)
        return _tenant(row)

    async def pause_tenant(self, tenant_id: str) -> dict[str, Any]:
        """Paused: its lanes are held out of every activation until it is resumed."""
        return _tenant(await stored.pause_tenant(self.db, tenant_id))

    async def resume_tenant(self, tenant_id: str) -> dict[str, Any]:
        """Resumed: its lanes re-enter at the type's virtual time (no banked credit)."""
        row = await stored.resume_tenant(self.db, tenant_id)
        return _unconfigured_tenant(tenant_id) if row is None else _tenant(row)

    async def list_tenants(self) -> list[dict[str, Any]]:
        return [_tenant(r) for r in await stored.list_tenants(self.db)]

    async def delete_tenant(self, tenant_id: str) -> None:
        if not await stored.delete_tenant(self.db, tenant_id):
            raise NotFound(f"tenant {tenant_id} has no configuration")

    async def put_job_type(
        self, job_type: str, cap: int | None, interval_ms: int | None, step: int | None
    ) -> dict[str, Any]:
        return self._job_type(
            await stored.upsert_job_type(self.db, job_type, cap, interval_ms, step)
        )

    async def get_job_type(self, job_type: str) -> dict[str, Any]:
        row = await stored.get_job_type(self.db, job_type)
        return self._unconfigured_job_type(job_type) if row is None else self._job_type(row)

    async def pause_job_type(self, job_type: str) -> dict[str, Any]:
        """Paused: no activation gives a job of the type until it is resumed."""
        return self._job_type(await stored.pause_job_type(self.db, job_type))

    async def resume_job_type(self, job_type: str) -> dict[str, Any]:
        row = await stored.resume_job_type(self.db, job_type)
        return self._unconfigured_job_type(job_type) if row is None else self._job_type(row)

    def _unconfigured_job_type(self, job_type: str) -> dict[str, Any]:
        aging = self.resolve_aging(None, None)
        return {
            "type": job_type,
            "maxActiveJobs": None,
            "agingIntervalMs": aging.interval_ms,
            "agingStep": aging.step,
            "paused": False,
            "configured": False,
        }

    async def list_job_types(self) -> list[dict[str, Any]]:
        return [self._job_type(r) for r in await stored.list_job_types(self.db)]

    def _job_type(self, row: JobTypeRow) -> dict[str, Any]:
        aging = self.resolve_aging(row.aging_interval_ms, row.aging_step)
        return {
            "type": row.job_type,
            "maxActiveJobs": row.max_active_jobs,
            "agingIntervalMs": aging.interval_ms,
            "agingStep": aging.step,
            "paused": row.paused,
            "configured": True,
        }


def _tenant(row: TenantRow) -> dict[str, Any]:
    return {
        "tenantId": row.tenant_id,
        "weight": row.weight,
        "maxActiveJobs": row.max_active_jobs,
        "paused": row.paused,
        "configured": True,
    }


def _unconfigured_tenant(tenant_id: str) -> dict[str, Any]:
    return {
        "tenantId": tenant_id,
        "weight": 1,
        "maxActiveJobs": None,
        "paused": False,
        "configured": False,
    }


class StatsService:
    """``GET /v2/stats``.  Activations in the last minute come from the lanes' running
    totals (shared by every replica), sampled in process every few seconds."""

    def __init__(self, db: Database, sample_interval_s: float = 5.0) -> None:
        self.db = db
        self.sample_interval_s = sample_interval_s
        self.samples: deque[tuple[float, dict[tuple[str, str], int]]] = deque()

    async def sample(self) -> dict[tuple[str, str], int]:
        totals = {
            (r.job_type, r.tenant_id): r.activated_total for r in await stored.lane_totals(self.db)
        }
        now = time.monotonic()
        self.samples.append((now, totals))
        # Keep one sample at least a window old, so "last minute" has a baseline.
        while len(self.samples) > 2 and self.samples[1][0] <= now - STATS_WINDOW_S:
            self.samples.popleft()
        return totals

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
        is paused.  Configured shares are over the lanes with ready jobs whose tenant is
        not paused."""
        base = self.samples[0][1] if self.samples else {}
        current = await self.sample()
        rows = await stored.stats(self.db, job_type)
        # A type's cap holds its lanes back whoever's jobs fill it; the rest is of the
        # lanes the caller may see (its key's scope), shares among them alone.
        type_active: dict[str, int] = {}
        for r in rows:
            type_active[r.job_type] = type_active.get(r.job_type, 0) + r.active
        if visible is not None:
            rows = [r for r in rows if visible(r.tenant_id, r.job_type)]
        weights = {r.tenant_id: r.weight for r in await stored.list_tenants(self.db)}
        types: dict[str, dict[str, Any]] = {}
        type_caps: dict[str, int | None] = {}
        for r in rows:
            t = types.get(r.job_type)
            if t is None:
                t = types[r.job_type] = {
                    "type": r.job_type,
                    "pending": 0,
                    "ready": 0,
                    "delayed": 0,
                    "active": 0,
                    "oldestPendingAgeMs": None,
                    "oldestReadyJobKey": None,
                    "paused": r.type_paused,
                    "tenants": [],
                }
                type_caps[r.job_type] = r.type_cap
            age = _age_ms(now, r.oldest_ready_at)
            key = None if r.oldest_ready_key is None else str(r.oldest_ready_key)
            pending = r.ready + r.delayed
            t["pending"] += pending
            t["ready"] += r.ready
            t["delayed"] += r.delayed
            t["active"] += r.active
            if age is not None and (
                t["oldestPendingAgeMs"] is None or age > t["oldestPendingAgeMs"]
            ):
                t["oldestPendingAgeMs"], t["oldestReadyJobKey"] = age, key
            lane = (r.job_type, r.tenant_id)
            tenant_cap = r.tenant_cap
            t["tenants"].append(
                {
                    "tenantId": r.tenant_id,
                    "pending": pending,
                    "ready": r.ready,
                    "delayed": r.delayed,
                    "active": r.active,
                    "oldestPendingAgeMs": age,
                    "oldestReadyJobKey": key,
                    "cappedBy": "tenant"
                    if tenant_cap is not None and (r.tenant_active or 0) >= tenant_cap
                    else None,
                    "activatedLastMinute": current.get(lane, 0) - base.get(lane, 0),
                    "paused": r.tenant_paused,
                }
            )
        for t in types.values():
            type_cap = type_caps[t["type"]]
            type_full = type_cap is not None and type_active[t["type"]] >= type_cap
            counts = {x["tenantId"]: x["activatedLastMinute"] for x in t["tenants"]}
            realized = scheduler.shares(counts)
            # A paused tenant is owed nothing while paused: its weight is left out.
            backlogged = [x["tenantId"] for x in t["tenants"] if x["ready"] > 0 and not x["paused"]]
            configured = scheduler.configured_shares(weights, backlogged)
            for x in t["tenants"]:
                if x["cappedBy"] is None and type_full:
                    x["cappedBy"] = "type"
                x["realizedShare"] = round(realized.get(x["tenantId"], 0.0), 4)
                x["configuredShare"] = round(configured.get(x["tenantId"], 0.0), 4)
        return {"jobTypes": list(types.values())}


def _age_ms(now: datetime, since: datetime | None) -> int | None:
    if since is None:
        return None
    return max(0, int((now - since).total_seconds() * 1000))


class SearchService:
    """Job search (Camunda's ``POST /v2/jobs/search``) over the operator statements."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def search(
        self,
        filters: dict[str, list[Any]],
        sort: list[tuple[str, bool]],
        limit: int,
        offset: int,
    ) -> tuple[list[JobRow], int, bool]:
        """The jobs matching, the total counted up to a bound, and whether there are more
        than that."""
        return await stored.search_jobs(self.db, filters, sort, limit, offset)


class HealthService:
    """What ``/readyz`` and ``/metrics`` ask of the database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def schema_revision(self) -> str | None:
        """The schema's revision, after a ping: StoreUnavailable if the database cannot
        answer."""
        await stored.ping(self.db)
        return await stored.schema_revision(self.db)

    def pool_sizes(self) -> tuple[int, int]:
        """Connections open in the pool, and of those idle."""
        return self.db.get_size(), self.db.get_idle_size()
