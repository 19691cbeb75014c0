"""Why is this job waiting?  ``GET /v2/jobs/{jobKey}/explain``: for one job, the reasons it
is not running now, each with its figures, read from what the next activation reads --
the tenant's and type's rows (pause, cap, rate bucket), the active jobs counted against
the caps, the key's queue ranked by the claim's effective priority, the lane's keys and
virtual time -- and judged by the scheduler's own rules (``app.scheduler.holds``,
``allocate_keys``), not a re-derivation.  Plus an estimate of when it starts, from the
lane's service rate in the stats window; labelled as one, null when there is none."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from app import scheduler
from app.db import Database, job_rows, operating
from app.db.rows import JobRow
from app.domain import JobState, public_state, rfc3339, shown_key
from app.errors import NotFound
from app.scheduler import Aging
from app.stats import StatsService, read_limits

# Counting the jobs ahead stops here ("at least"): an explanation is not a backlog scan.
AHEAD_BOUND = 10_000
# No request for its type for this long reads "nobody is asking".
NOBODY_ASKING_S = 60.0


class ExplainService:
    def __init__(
        self,
        db: Database,
        stats: StatsService,
        resolve_aging: Callable[[int | None, int | None], Aging],
        waiting: Callable[[str], bool],
        flush_sightings: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.flush_sightings = flush_sightings  # this process's worker names, written
        self.db = db
        self.stats = stats
        self.resolve_aging = resolve_aging  # (interval_ms, step) -> Aging
        self.waiting = waiting  # job type -> whether a long poll or stream waits here

    async def job(self, job_key: int) -> JobRow:
        found = await job_rows.get(self.db, job_key)
        if found is None:
            raise NotFound(f"job {job_key} does not exist")
        return found.job

    async def explain(
        self, job: JobRow, now: datetime, visible: Callable[[str, str], bool] | None = None
    ) -> dict[str, Any]:
        """The explanation of ``job`` (read by :meth:`job`) at ``now``; with ``visible``
        (a scoped key's), its lane's shares among the lanes it admits."""
        out: dict[str, Any] = {
            "jobKey": str(job.job_key),
            "type": job.job_type,
            "tenantId": job.tenant_id,
            "fairnessKey": shown_key(job.fairness_key),
            "state": public_state(job.state).value,
            "at": rfc3339(now),
            "activatableNow": False,
            "nextInLane": False,
            "reasons": [],
            "estimatedStartAt": None,
        }
        if job.state is JobState.ACTIVATED:
            out["reasons"].append(
                {
                    "reason": "activated",
                    "worker": job.worker,
                    "activatedAt": rfc3339(job.activated_at),
                    "leaseUntil": rfc3339(job.deadline),
                    "activationCount": job.activation_count,
                }
            )
            return out
        if job.state not in (JobState.CREATED, JobState.SCHEDULED):
            out["reasons"].append(_finished(job))
            return out
        await self._waiting(job, now, out, visible)
        return out

    async def _waiting(
        self,
        job: JobRow,
        now: datetime,
        out: dict[str, Any],
        visible: Callable[[str, str], bool] | None,
    ) -> None:
        reasons: list[dict[str, Any]] = out["reasons"]
        limits = await read_limits(self.db)
        job_type = limits.job_types.get(job.job_type)
        aging: Aging = self.resolve_aging(
            None if job_type is None else job_type.aging_interval_ms,
            None if job_type is None else job_type.aging_step,
        )
        if job.state is JobState.SCHEDULED:
            # Activated before (a restore's fence moves counts on without activating).
            retry = job.activation_count > 0 and job.activated_at is not None
            reasons.append(
                {
                    "reason": "delayed",
                    "until": rfc3339(job.run_at),
                    "by": "retryBackOff" if retry else "runAt",
                }
            )
        # What the claim checks of its lane, at the database's clock (the claims').
        holds = limits.holds(job.job_type, job.tenant_id)
        holds += scheduler.key_holds(
            *await operating.key_caps_of(self.db, job.job_type, job.tenant_id, job.fairness_key)
        )
        behind_head = False
        if job_type is not None and job_type.key_ordering == "fifo":
            # A FIFO key gives its head alone (ADR 041): the job it waits behind.
            head = await operating.key_head(self.db, job.job_type, job.tenant_id, job.fairness_key)
            behind_head = head is not None and head[0] != job.job_key
            if head is not None and behind_head:
                reasons.append(
                    {
                        "reason": "keyHead",
                        "head": str(head[0]),
                        "headState": public_state(JobState(head[1])).value,
                    }
                )
        at = limits.at
        for h in holds:
            shown: dict[str, Any] = {"reason": h.reason.value}
            if h.limit is not None:
                shown |= {"active": h.active, "limit": h.limit}
            if h.next_token_s is not None:
                shown["nextTokenAt"] = rfc3339(at + timedelta(seconds=h.next_token_s))
            reasons.append(shown)
        # Below its tenant's minimum (ADR 042): its lane is served before the weighted
        # share, whatever its virtual time (caps, rate limits and pauses still first).
        tenant = limits.tenants.get(job.tenant_id)
        minimum = None if tenant is None else tenant.min_active_jobs
        tenant_active = limits.active.get(("tenant", job.tenant_id), 0)
        below = bool(minimum) and tenant_active < (minimum or 0)
        if below:
            reasons.append({"reason": "belowMinimum", "active": tenant_active, "minimum": minimum})
        eff = scheduler.effective_priority(job.priority, job.queued_at, now, aging)
        priority: dict[str, Any] = {"priority": job.priority, "effective": eff}
        if eff < scheduler.MAX_PRIORITY and aging.step > 0:
            waited = max(timedelta(0), now - job.queued_at)
            step = timedelta(milliseconds=aging.interval_ms)
            priority["nextStepAt"] = _shifted(job.queued_at, (waited // step + 1) * step)
            top = scheduler.max_wait_to_top_ms(job.priority, aging)
            priority["topAt"] = _shifted(job.queued_at, timedelta(milliseconds=top))
        out["priority"] = priority
        # Its place: in its key, among its lane's keys, among its type's lanes.
        ahead, ready = await operating.jobs_ahead(
            self.db, job.job_key, now, aging.interval_ms, aging.step, AHEAD_BOUND
        )
        keys = await operating.lane_keys_of(self.db, job.job_type, job.tenant_id)
        backlogged = [scheduler.Key(k, v, w) for k, v, a, w in keys if a]
        first = scheduler.allocate_keys(backlogged, 1)
        next_key = next(iter(first), None)
        mine = next((w for k, _, _, w in keys if k == job.fairness_key), 1)
        key_weight = sum(k.weight for k in backlogged) or mine
        views = await self.stats.lanes(now, job.job_type, visible)
        lane = next((v for v in views if v.tenant_id == job.tenant_id), None)
        lag = None if lane is None else lane.vtime_lag
        out["queue"] = {
            "aheadInKey": ahead,
            "aheadInKeyAtLeast": ahead >= AHEAD_BOUND,
            "readyInLane": ready,
            "readyInLaneAtLeast": ready >= AHEAD_BOUND,
            "keysBacklogged": len(backlogged),
            "nextKey": None if next_key is None else shown_key(next_key),
            "keyWeight": mine,
            "vtimeLag": None if lag is None else round(lag, 6),
        }
        if ahead:
            reasons.append({"reason": "behindInKey", "ahead": ahead})
        if job.state is JobState.CREATED and next_key is not None and next_key != job.fairness_key:
            reasons.append({"reason": "otherKeysFirst", "nextKey": shown_key(next_key)})
        if lag is not None and lag > 0 and not holds and not below:
            reasons.append({"reason": "otherLanesFirst", "vtimeLag": round(lag, 6)})
        if lane is not None:
            out["lane"] = {
                "weight": lane.weight,
                "realizedShare": round(lane.realized_share, 4),
                "entitledShare": round(lane.entitled_share, 4),
                "configuredShare": round(lane.configured_share, 4),
                "activatedLastMinute": lane.activated_in_window,
                "heldInWindow": {r: round(f, 4) for r, f in sorted(lane.held_in_window.items())},
            }
        # Demand: is anyone asking for its type?  (This process's sightings written first,
        # as GET /v2/workers does: a worker that just asked here is seen.)
        if self.flush_sightings is not None:
            await self.flush_sightings()
        asked = await operating.last_asked(self.db, job.job_type)
        here = self.waiting(job.job_type)
        out["demand"] = {"lastAskedAt": rfc3339(asked), "waitingHere": here}
        quiet = asked is None or (now - asked).total_seconds() > NOBODY_ASKING_S
        if quiet and not here:
            reasons.append(
                {"reason": "nobodyAsking", "lastAskedAt": rfc3339(asked), "forS": NOBODY_ASKING_S}
            )
        due = job.state is JobState.CREATED
        out["activatableNow"] = due and not holds and not behind_head
        out["nextInLane"] = out["activatableNow"] and ahead == 0 and next_key == job.fairness_key
        # Behind a FIFO head, it starts when that ends: nothing here can tell when.
        out["estimatedStartAt"] = (
            None
            if behind_head
            else self._estimate(
                job, lane, holds, ahead, mine, key_weight, now, next_in_lane=out["nextInLane"]
            )
        )

    def _estimate(
        self,
        job: JobRow,
        lane: Any,
        holds: list[scheduler.Hold],
        ahead: int,
        weight: int,
        key_weights: int,
        now: datetime,
        *,
        next_in_lane: bool,
    ) -> str | None:
        """Now plus the work ahead of it in its key over its key's part of its lane's
        service rate in the window (None: held, or its lane was not served)."""
        if holds or lane is None or ahead >= AHEAD_BOUND:
            return None
        span = self.stats.window.span_s
        served = lane.activated_in_window
        start = max(now, job.run_at)
        if next_in_lane and lane.vtime_lag == 0:
            return rfc3339(start)
        if not span or not served:
            return None
        rate = served / span * weight / max(weight, key_weights)
        return _shifted(start, timedelta(seconds=math.ceil((ahead + 1) / rate * 10) / 10))


def _shifted(at: datetime, by: timedelta) -> str | None:
    """``at + by`` as RFC 3339, None past the calendar's end (year 9999)."""
    try:
        return rfc3339(at + by)
    except OverflowError:
        return None


def _finished(job: JobRow) -> dict[str, Any]:
    """A job in a final state: what ended it, and what revives it."""
    state = job.state
    if state is JobState.COMPLETED:
        return {"reason": "completed", "finishedAt": rfc3339(job.completed_at)}
    if state is JobState.FAILED:
        return {
            "reason": "failed",
            "finishedAt": rfc3339(job.completed_at),
            "errorMessage": job.error_message,
            "revivedBy": "PATCH /v2/jobs/{jobKey} with retries > 0, or POST /v2/jobs/retry",
        }
    if state is JobState.ERROR_THROWN:
        return {
            "reason": "errorThrown",
            "finishedAt": rfc3339(job.completed_at),
            "errorCode": job.error_code,
            "errorMessage": job.error_message,
            "revivedBy": None,
        }
    return {"reason": "canceled", "finishedAt": rfc3339(job.completed_at), "revivedBy": None}
