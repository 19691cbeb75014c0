"""What a pick costs: the units an activation is charged, by activations, cost or worker
time, and how a finish settles a worker-time charge (ADR 029); the shares shown."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import StrEnum


class FairnessBy(StrEnum):
    """What a job type's lanes are charged by (``PUT /v2/job-types/{type}``
    ``fairnessBy``; ADR 029)."""

    ACTIVATIONS = "activations"
    WORKER_TIME = "workerTime"
    COST = "cost"


# A job's cost, when it declares none; and the worker-time estimate (seconds) of a lane
# none of whose jobs has finished yet, when its type has no estimate either.
DEFAULT_COST = 1.0
DEFAULT_LEASE_ESTIMATE_S = 1.0
# How far one observation moves a lane's estimate: n observations at once move it
# 1 - (1 - ESTIMATE_ALPHA) ** n of the way to their mean.
ESTIMATE_ALPHA = 0.2


def job_units(mode: FairnessBy, cost: float, estimate_s: float | None) -> float:
    """What one activation is charged, in units of virtual time x weight: 1 by
    activations; the job's ``cost`` by cost; by worker time, the lane's estimate of the
    seconds its lease will be held (``estimate_s``; None: DEFAULT_LEASE_ESTIMATE_S), to be
    settled when the lease ends (:func:`settlement`)."""
    if mode is FairnessBy.COST:
        return cost
    if mode is FairnessBy.WORKER_TIME:
        return DEFAULT_LEASE_ESTIMATE_S if estimate_s is None else estimate_s
    return 1.0


def lane_unit(mode: FairnessBy, estimate_s: float | None) -> float:
    """What a round expects a pick of a lane to cost (:class:`Lane`'s ``unit``): by
    worker time the lane's estimate (as :func:`job_units` charges it); otherwise 1.  By
    cost a lane's next cost is not known before its claim, and 1 keeps the bound: the
    charge is exact, and a lane a round over-gave waits its turn in the next ones."""
    if mode is FairnessBy.WORKER_TIME:
        return job_units(mode, DEFAULT_COST, estimate_s)
    return 1.0


def settlement(mode: FairnessBy, charged: float, held_s: float) -> float:
    """The units a finished activation adds to (or, negative, takes back from) the
    ``charged`` it paid at activation, its lease having been held ``held_s`` seconds:
    by worker time, the difference; otherwise nothing (the charge was exact).  After it,
    a lane has been charged exactly the seconds its finished leases were held."""
    if mode is FairnessBy.WORKER_TIME:
        return max(0.0, held_s) - charged
    return 0.0


def mixed_estimate(old: float | None, total: float, n: int) -> float | None:
    """A lane's estimate after ``n`` observations summing to ``total`` (lease seconds,
    or costs): an exponentially weighted mean, each observation ESTIMATE_ALPHA of the way;
    the first observations set it.  Unchanged when there are none."""
    if n <= 0:
        return old
    mean = total / n
    if old is None:
        return mean
    return old + (1.0 - (1.0 - ESTIMATE_ALPHA) ** n) * (mean - old)


def retry_at(now: datetime, retry_backoff_ms: int) -> datetime:
    return now + timedelta(milliseconds=max(0, retry_backoff_ms))


def shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: (v / total if total else 0.0) for k, v in counts.items()}


def configured_shares(weights: dict[str, int], backlogged: Sequence[str]) -> dict[str, float]:
    total = sum(weights.get(t, 1) for t in backlogged)
    return {t: weights.get(t, 1) / total for t in backlogged} if total else {}
