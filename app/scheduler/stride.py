"""Stride picks over lanes and their keys, aging, caps and rate buckets (the package's
docstring says how they decide)."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

MAX_PRIORITY = 100


@dataclass(frozen=True, slots=True)
class Aging:
    interval_ms: int
    step: int


def effective_priority(priority: int, queued_at: datetime, now: datetime, aging: Aging) -> int:
    """``min(100, priority + step * floor(wait / interval))``; never below ``priority``.
    Twin: the ``eff`` of ``app.db.claims.CLAIM``'s heads."""
    # Whole microseconds, not float seconds: 4.007 s * 1000 is 4006.9999999999995 ms, and
    # the job would age one interval late (SQL's numeric arithmetic does not).
    wait_us = max(0, (now - queued_at) // timedelta(microseconds=1))
    boost = aging.step * (wait_us // (aging.interval_ms * 1000))
    return min(MAX_PRIORITY, priority + boost) if priority < MAX_PRIORITY else priority


def max_wait_to_top_ms(priority: int, aging: Aging) -> float:
    """How long a job of ``priority`` can wait before it is top priority in its lane."""
    if priority >= MAX_PRIORITY:
        return 0.0
    if aging.step == 0:
        return math.inf
    return math.ceil((MAX_PRIORITY - priority) / aging.step) * aging.interval_ms


@dataclass(frozen=True, slots=True)
class Lane:
    """What one activation call knows of a backlogged lane."""

    tenant_id: str
    vtime: float
    weight: int
    # How many more jobs this lane may be given now (tenant cap minus active), None = no cap.
    headroom: int | None = None
    # What a pick of this lane is expected to be charged (ADR 029): 1 when charging by
    # activations, the lane's estimate of its next job's cost or lease seconds otherwise.
    unit: float = 1.0

    @property
    def stride(self) -> float:
        return self.unit / self.weight


# A virtual time is a float8, whose resolution is relative: a stride below half a unit
# in the last place of a lane's virtual time would add nothing, and lanes tied there
# would tie forever, every pick going to the first by id (a lane whose jobs cost 1e-6
# at weight 10,000 beside virtual times of 1e9, ADR 029).  So a pick advances its lane by
# its stride, by VTIME_RESOLUTION of the lane's virtual time (2^-50: at least four units
# in its last place), or by MIN_STRIDE, whichever is most: where that rounds a stride up,
# lanes tied at one virtual time take turns rather than one of them every pick.
VTIME_RESOLUTION = 2.0**-50
# The least stride a job's cost gives (1e-6 at weight 10,000): a stride of 0 (a lease
# estimate of 0 s) at virtual time 0 would advance nothing either.
MIN_STRIDE = 1e-10


def advance(vtime: float, stride: float, n: int = 1) -> float:
    """``vtime`` after ``n`` picks of ``stride``, each at least VTIME_RESOLUTION of
    ``vtime`` and at least MIN_STRIDE (the lane charge's twin: app.db.lanes._CHARGE)."""
    if n <= 0:
        return vtime
    return vtime + n * max(stride, abs(vtime) * VTIME_RESOLUTION, MIN_STRIDE)


@dataclass(frozen=True, slots=True)
class Allocation:
    # tenant id -> number of jobs to claim from its lane, in the order lanes were first picked.
    counts: dict[str, int]
    picks: tuple[str, ...]

    @property
    def total(self) -> int:
        return len(self.picks)


def allocate(lanes: Iterable[Lane], n: int, type_headroom: int | None = None) -> Allocation:
    """Simulate ``n`` stride picks over ``lanes``.

    Bounded by ``type_headroom`` (the job type's cap minus its active jobs) and by each
    lane's own headroom.  Cost O(n log L).  Its first pick has a twin in SQL:
    ``app.db.claims.CLAIM_LEAD`` picks the same lane among those it probes.
    """
    if type_headroom is not None:
        n = min(n, max(0, type_headroom))
    entries = [
        (lane.vtime, lane.tenant_id, lane.stride, lane.headroom)
        for lane in lanes
        if lane.headroom is None or lane.headroom > 0
    ]
    counts, picks = _stride(entries, n)
    return Allocation(counts=counts, picks=tuple(picks))


def _stride(
    entries: list[tuple[float, str, float, int | None]], n: int
) -> tuple[dict[str, int], list[str]]:
    """``n`` stride picks over (vtime, id, stride, headroom) entries: the smallest vtime
    first, ties by id; each pick advances its entry by its stride, and an entry whose
    headroom (None: none) it uses up leaves.  The counts per id, in first-pick order,
    and the picks."""
    heapq.heapify(entries)
    counts: dict[str, int] = {}
    picks: list[str] = []
    while entries and len(picks) < n:
        vtime, name, stride, headroom = heapq.heappop(entries)
        counts[name] = counts.get(name, 0) + 1
        picks.append(name)
        if headroom is not None:
            headroom -= 1
            if headroom <= 0:
                continue
        heapq.heappush(entries, (advance(vtime, stride), name, stride, headroom))
    return counts, picks


@dataclass(frozen=True, slots=True)
class Key:
    """What a round knows of one backlogged fairness key of a lane: its virtual time
    inside the lane and its weight there."""

    key: str
    vtime: float
    weight: int
    # How many more jobs the key may be given now (its caps minus its active jobs, ADR
    # 040), None = no cap.
    headroom: int | None = None

    @property
    def stride(self) -> float:
        return 1.0 / self.weight


def allocate_keys(keys: Iterable[Key], n: int) -> dict[str, int]:
    """Divide a lane's ``n`` picks among its ``keys``: stride picks over the keys'
    virtual times, as :func:`allocate` over lanes (ties by key), each key at most its
    headroom.  The counts per key, in first-pick order.  Its first pick has a twin in
    SQL: ``app.db.claims.CLAIM_LEAD`` takes the same key of its lead lane."""
    entries = [
        (k.vtime, k.key, k.stride, k.headroom) for k in keys if k.headroom is None or k.headroom > 0
    ]
    counts, _ = _stride(entries, n)
    return counts


def split_among_keys(
    counts: Mapping[str, int], keys: Mapping[str, Sequence[Key]]
) -> dict[tuple[str, str], int]:
    """A round's allocation one level down: each lane's count (``counts``, per tenant)
    divided among that lane's ``keys`` (per tenant, those read for it); a lane without
    keys gets nothing this round.  Counts per (tenant, key)."""
    out: dict[tuple[str, str], int] = {}
    for tenant, n in counts.items():
        for key, k in allocate_keys(keys.get(tenant, ()), n).items():
            out[(tenant, key)] = k
    return out


def reentry_vtime(own_vtime: float, min_active_vtime: float | None, max_vtime: float) -> float:
    """Virtual time of a lane that becomes backlogged again.  Twin: ``_REENTRY_VTIME``
    in ``app.db.lanes`` (and alembic 0004's ``jobfair_release_holds``), where "backlogged"
    excludes lanes held at their caps.  The same rule places a fairness key that becomes
    backlogged again among its lane's keys (``_KEY_REENTRY_VTIME``).

    The system's virtual time is the smallest ``vtime`` of the backlogged lanes or, when
    none is backlogged, the largest of all lanes.  A returning lane starts there, never
    behind it: credit does not accumulate while idle.
    """
    now_v = min_active_vtime if min_active_vtime is not None else max_vtime
    return max(own_vtime, now_v)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A tenant's or a job type's limit: ``per_s`` activations a second, ``burst`` at
    once (the bucket's size)."""

    per_s: float
    burst: float


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket as stored (alembic 0011's ``rate_*`` columns): ``tokens`` at the
    instant ``at``, refilled at ``per_s`` tokens a second up to ``burst``.  An activation
    takes one token.  Only whole tokens are taken, so over any window of ``T`` seconds a
    bucket gives at most ``burst + per_s * T`` activations."""

    per_s: float
    burst: float
    tokens: float
    at: datetime

    def tokens_at(self, now: datetime) -> float:
        """``min(burst, tokens + elapsed * per_s)``; time before ``at`` refills nothing."""
        elapsed_s = max(0.0, (now - self.at).total_seconds())
        return min(self.burst, self.tokens + elapsed_s * self.per_s)

    def room(self, now: datetime) -> int:
        """How many activations the bucket allows at ``now``: its whole tokens."""
        return max(0, math.floor(self.tokens_at(now)))

    def take(self, n: int, now: datetime) -> Bucket:
        """The bucket after ``n`` activations at ``now`` (at most :meth:`room`)."""
        return replace(self, tokens=self.tokens_at(now) - n, at=max(self.at, now))

    def next_token_s(self, now: datetime) -> float:
        """Seconds from ``now`` until the bucket allows an activation (0: it does)."""
        have = self.tokens_at(now)
        return 0.0 if have >= 1 else (1 - have) / self.per_s


def rate_floor(lanes: Sequence[Lane], limited: Iterable[str]) -> dict[str, float]:
    """The virtual times that rate-limited lanes (``limited``: their tenants) are lifted
    to this round: the least vtime of the lanes read without a tenant limit, for each
    limited lane behind it.  Lanes are read in vtime order, so that least vtime is where
    the unlimited lanes stand.  A limited lane held back by its bucket while the others
    move on would otherwise bank their progress: taken at once when its limit is raised,
    and given to every lane that re-enters meanwhile (they start at the least active
    vtime).  None of the lanes read unlimited: no lift."""
    limited = set(limited)
    free = [lane.vtime for lane in lanes if lane.tenant_id not in limited]
    if not free:
        return {}
    floor = min(free)
    return {
        lane.tenant_id: floor for lane in lanes if lane.tenant_id in limited and lane.vtime < floor
    }


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """One activation round's decision: how many jobs to claim from which lanes (in pick
    order), and, where caps or rate limits were counted, the type's headroom (the least
    of its cap's and its bucket's), the lanes at their caps and the lanes out of tokens
    (none of whose jobs this round may take more of), and the rate-limited lanes lifted
    to a virtual-time floor (:func:`rate_floor`), to be charged it."""

    allocation: Allocation
    type_headroom: int | None = None
    capped_out: frozenset[str] = field(default_factory=frozenset)
    rate_out: frozenset[str] = field(default_factory=frozenset)
    lifted: Mapping[str, float] = field(default_factory=dict)
    # Of the allocation, the picks each lane was given below its tenant's minimum: served
    # before the weighted share and not charged to its virtual time (ADR 042).
    exempt: Mapping[str, int] = field(default_factory=dict)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def trim_to_caps(
    lanes: Sequence[Lane],
    n: int,
    type_cap: int | None,
    type_active: int | None,
    room: Mapping[str, int],
    *,
    type_tokens: int | None = None,
    tokens: Mapping[str, int] | None = None,
    minimums: Mapping[str, tuple[int, int]] | None = None,
) -> RoundPlan:
    """The allocation of ``n`` picks over ``lanes`` within the type's cap (``type_cap``
    minus its ``type_active`` jobs), each capped tenant's ``room`` (cap minus active),
    the type's whole ``type_tokens`` and each rate-limited tenant's ``tokens``, all
    counted under their cap locks.  A lane is capped out (rate out) if it had no room (no
    token), or if this allocation uses all it had; its picks went to the other lanes.
    Rate-limited lanes are first lifted to :func:`rate_floor`.

    Lanes whose tenants are below their minimum (``minimums``: each one's minimum and its
    ACTIVATED jobs, counted under its lock) are given picks first, each up to what it
    lacks and within every limit above; when they lack more together than the round
    gives, by weight among themselves, in concurrency: the fewest ACTIVATED jobs per
    weight first (their virtual times do not move for these picks, so they cannot order
    them).  Those picks are ``exempt``: not charged, so the rest go by stride among every
    lane from the virtual times as they were (ADR 042)."""
    tokens = tokens or {}
    type_headroom = None
    if type_cap is not None and type_active is not None:
        type_headroom = max(0, type_cap - type_active)
    type_headroom = _least(type_headroom, type_tokens)
    lifted = rate_floor(lanes, tokens)
    capped = [
        replace(
            lane,
            vtime=lifted.get(lane.tenant_id, lane.vtime),
            headroom=_least(room.get(lane.tenant_id), tokens.get(lane.tenant_id)),
        )
        for lane in lanes
    ]
    first = allocate(_below_minimum(capped, minimums or {}), n, type_headroom)
    if first.total:
        capped = [
            replace(lane, headroom=lane.headroom - first.counts.get(lane.tenant_id, 0))
            if lane.headroom is not None
            else lane
            for lane in capped
        ]
    rest = allocate(
        capped,
        n - first.total,
        None if type_headroom is None else type_headroom - first.total,
    )
    allocation = _joined(first, rest)

    def used_up(limits: Mapping[str, int]) -> frozenset[str]:
        return frozenset(
            lane.tenant_id
            for lane in lanes
            if lane.tenant_id in limits
            and allocation.counts.get(lane.tenant_id, 0) >= limits[lane.tenant_id]
        )

    return RoundPlan(
        allocation, type_headroom, used_up(room), used_up(tokens), lifted, first.counts
    )


def _below_minimum(lanes: Sequence[Lane], minimums: Mapping[str, tuple[int, int]]) -> list[Lane]:
    """The lanes of tenants below their minimum, each allowed at most what it lacks, at
    the virtual time of its ACTIVATED jobs per weight (a pick adds one job)."""
    below = []
    for lane in lanes:
        minimum, active = minimums.get(lane.tenant_id, (0, 0))
        if active < minimum:
            below.append(
                replace(
                    lane,
                    vtime=active / lane.weight,
                    unit=1.0,
                    headroom=_least(lane.headroom, minimum - active),
                )
            )
    return below


def _joined(first: Allocation, then: Allocation) -> Allocation:
    """``first``'s picks, then ``then``'s."""
    counts = dict(first.counts)
    for tenant, k in then.counts.items():
        counts[tenant] = counts.get(tenant, 0) + k
    return Allocation(counts, first.picks + then.picks)


def left_at_cap(room: Mapping[str, int], taken: Mapping[str, int]) -> list[str]:
    """The capped tenants a claim that took ``taken`` jobs per tenant leaves with no room
    (their lanes are held until capacity frees), in key order."""
    return sorted(t for t, n in room.items() if n - taken.get(t, 0) <= 0)


def as_claimed(
    plan: RoundPlan, room: Mapping[str, int], tokens: Mapping[str, int], taken: Mapping[str, int]
) -> RoundPlan:
    """``plan`` with only the lanes its claim left at their caps (out of tokens) counted
    so: a lane allotted all its room whose claim came up short (a key of it drained, or
    its heads held by another activator) still has room, and the call's next rounds may
    give it more."""

    def used_up(lanes: frozenset[str], limits: Mapping[str, int]) -> frozenset[str]:
        return frozenset(t for t in lanes if taken.get(t, 0) >= limits.get(t, 0))

    return replace(
        plan, capped_out=used_up(plan.capped_out, room), rate_out=used_up(plan.rate_out, tokens)
    )


class PickedJob(Protocol):
    """What the response order reads of a claimed job (app.db.rows.JobRow has it)."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def queued_at(self) -> datetime: ...
    @property
    def job_key(self) -> int: ...


_J = TypeVar("_J", bound=PickedJob)


def in_pick_order(claimed: list[_J], picks: list[str]) -> list[_J]:
    """Order the response as the stride picks were made: each pick takes its lane's next
    best job (the store returns them unordered)."""
    by_lane: dict[str, list[_J]] = defaultdict(list)
    for row in claimed:
        by_lane[row.tenant_id].append(row)
    for rows in by_lane.values():
        rows.sort(key=lambda r: (-r.priority, r.queued_at, r.job_key), reverse=True)
    out: list[_J] = []
    for tenant in picks:
        lane = by_lane.get(tenant)
        if lane:
            out.append(lane.pop())
    for rows in by_lane.values():
        out.extend(reversed(rows))
    return out
