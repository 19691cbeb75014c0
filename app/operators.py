"""Operator services: tenant and job-type configuration, search, health (the stats view is
app.stats)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.db import Database, listing, operating
from app.db.rows import JobRow, JobTypeRow, TenantRow
from app.domain import shown_key, stored_key
from app.errors import InvalidArgument, NotFound
from app.scheduler import Aging, Bucket, FairnessBy, RateLimit


class ConfigService:
    def __init__(self, db: Database, resolve_aging: Callable[[int | None, int | None], Aging]):
        self.db = db
        # The server-wide defaults fill what a job type leaves unset (Rounds).
        self.resolve_aging = resolve_aging

    async def put_tenant(
        self,
        tenant_id: str,
        weight: int,
        cap: int | None,
        rate: RateLimit | None = None,
        minimum: int | None = None,
    ) -> dict[str, Any]:
        """A tenant's weight, cap, rate limit and minimum.  A changed rate limit starts
        with a full bucket; the same one set again keeps its bucket (ADR 028)."""
        if minimum is not None and cap is not None and minimum > cap:
            raise InvalidArgument(
                f"minActiveJobs: {minimum} is more than maxActiveJobs ({cap}); a minimum"
                " is at most the cap"
            )
        return _tenant(
            await operating.upsert_tenant(self.db, tenant_id, weight, cap, rate, minimum)
        )

    async def get_tenant(self, tenant_id: str) -> dict[str, Any]:
        row = await operating.get_tenant(self.db, tenant_id)
        if row is None:
            # An unconfigured tenant has the defaults; it is not an error to look at it,
            # and the answer says it is not configured.
            return _unconfigured_tenant(tenant_id)
        return _tenant(row)

    async def pause_tenant(self, tenant_id: str) -> dict[str, Any]:
        """Paused: its lanes are held out of every activation until it is resumed."""
        return _tenant(await operating.pause_tenant(self.db, tenant_id))

    async def resume_tenant(self, tenant_id: str) -> dict[str, Any]:
        """Resumed: its lanes re-enter at the type's virtual time (no banked credit)."""
        row = await operating.resume_tenant(self.db, tenant_id)
        return _unconfigured_tenant(tenant_id) if row is None else _tenant(row)

    async def list_tenants(self) -> list[dict[str, Any]]:
        return [_tenant(r) for r in await operating.list_tenants(self.db)]

    async def delete_tenant(self, tenant_id: str) -> None:
        if not await operating.delete_tenant(self.db, tenant_id):
            raise NotFound(f"tenant {tenant_id} has no configuration")

    async def put_key(
        self, tenant_id: str, fairness_key: str, weight: int, cap: int | None = None
    ) -> dict[str, Any]:
        """A fairness key's weight inside its tenant (the next activation on every server
        divides the tenant's share by it, for the jobs already waiting too) and its cap
        on ACTIVATED jobs of every type (exact, ADR 040)."""
        got = await operating.upsert_key_weight(
            self.db, tenant_id, stored_key(fairness_key), weight, cap
        )
        return _key(tenant_id, fairness_key, got)

    async def get_key(self, tenant_id: str, fairness_key: str) -> dict[str, Any]:
        got = await operating.get_key_weight(self.db, tenant_id, stored_key(fairness_key))
        return _key(tenant_id, fairness_key, got)

    async def delete_key(self, tenant_id: str, fairness_key: str) -> None:
        if not await operating.delete_key_weight(self.db, tenant_id, stored_key(fairness_key)):
            raise NotFound(f"key {fairness_key} of tenant {tenant_id} has no weight of its own")

    async def put_job_type(
        self,
        job_type: str,
        cap: int | None,
        interval_ms: int | None,
        step: int | None,
        rate: RateLimit | None = None,
        fairness_by: FairnessBy = FairnessBy.ACTIVATIONS,
        per_key: int | None = None,
        key_ordering: str | None = None,
    ) -> dict[str, Any]:
        return self._job_type(
            await operating.upsert_job_type(
                self.db, job_type, cap, interval_ms, step, rate, fairness_by, per_key, key_ordering
            )
        )

    async def get_job_type(self, job_type: str) -> dict[str, Any]:
        row = await operating.get_job_type(self.db, job_type)
        return self._unconfigured_job_type(job_type) if row is None else self._job_type(row)

    async def pause_job_type(self, job_type: str) -> dict[str, Any]:
        """Paused: no activation gives a job of the type until it is resumed."""
        return self._job_type(await operating.pause_job_type(self.db, job_type))

    async def resume_job_type(self, job_type: str) -> dict[str, Any]:
        row = await operating.resume_job_type(self.db, job_type)
        return self._unconfigured_job_type(job_type) if row is None else self._job_type(row)

    def _unconfigured_job_type(self, job_type: str) -> dict[str, Any]:
        aging = self.resolve_aging(None, None)
        return {
            "type": job_type,
            "maxActiveJobs": None,
            "agingIntervalMs": aging.interval_ms,
            "agingStep": aging.step,
            "rateLimit": None,
            "fairnessBy": FairnessBy.ACTIVATIONS.value,
            "maxActivePerKey": None,
            "keyOrdering": None,
            "paused": False,
            "configured": False,
        }

    async def list_job_types(self) -> list[dict[str, Any]]:
        return [self._job_type(r) for r in await operating.list_job_types(self.db)]

    def _job_type(self, row: JobTypeRow) -> dict[str, Any]:
        aging = self.resolve_aging(row.aging_interval_ms, row.aging_step)
        return {
            "type": row.job_type,
            "maxActiveJobs": row.max_active_jobs,
            "agingIntervalMs": aging.interval_ms,
            "agingStep": aging.step,
            "rateLimit": _rate(row),
            "fairnessBy": row.fairness_by or FairnessBy.ACTIVATIONS.value,
            "maxActivePerKey": row.max_active_per_key,
            "keyOrdering": row.key_ordering,
            "paused": row.paused,
            "configured": True,
        }


def _tenant(row: TenantRow) -> dict[str, Any]:
    return {
        "tenantId": row.tenant_id,
        "weight": row.weight,
        "maxActiveJobs": row.max_active_jobs,
        "minActiveJobs": row.min_active_jobs,
        "rateLimit": _rate(row),
        "paused": row.paused,
        "configured": True,
    }


def _rate(row: TenantRow | JobTypeRow) -> dict[str, float] | None:
    """A rate limit as the API shows it (None: no limit), with the tokens its bucket
    holds as the row was read (by the database's clock, the one claims take them by)."""
    if row.rate_per_s is None or row.rate_burst is None:
        return None
    shown = {"perSecond": _number(row.rate_per_s), "burst": _number(row.rate_burst)}
    if row.rate_tokens is not None and row.rate_at is not None:
        bucket = Bucket(row.rate_per_s, row.rate_burst, row.rate_tokens, row.rate_at)
        shown["tokens"] = round(bucket.tokens_at(row.read_at), 3)
    return shown


def _number(x: float) -> float:
    """A whole number shown as an integer (50, not 50.0), as it was most likely sent."""
    return int(x) if x.is_integer() else x


def _key(tenant_id: str, fairness_key: str, got: tuple[int, int | None] | None) -> dict[str, Any]:
    return {
        "tenantId": tenant_id,
        "fairnessKey": shown_key(stored_key(fairness_key)),
        "weight": 1 if got is None else got[0],
        "maxActiveJobs": None if got is None else got[1],
        "configured": got is not None,
    }


def _unconfigured_tenant(tenant_id: str) -> dict[str, Any]:
    return {
        "tenantId": tenant_id,
        "weight": 1,
        "maxActiveJobs": None,
        "minActiveJobs": None,
        "rateLimit": None,
        "paused": False,
        "configured": False,
    }


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
        return await listing.search_jobs(self.db, filters, sort, limit, offset)


class HealthService:
    """What ``/readyz`` and ``/metrics`` ask of the database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def schema_revision(self) -> tuple[str | None, str | None]:
        """The schema's revision and the oldest server revision it serves, after a ping:
        StoreUnavailable if the database cannot answer."""
        await operating.ping(self.db)
        return await operating.schema_revision(self.db)

    def pool_sizes(self) -> tuple[int, int]:
        """Connections open in the pool, and of those idle."""
        return self.db.get_size(), self.db.get_idle_size()
