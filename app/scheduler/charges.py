"""What activations charge their lanes and keys, and how charges written later add up.

A claim's charges are decided here (:func:`round_charges`) and written behind the answer
(app.activation.charging): the sums they make until then (:class:`Owed`) and the
worker-time settlements that finishes owe (:class:`OwedSettlements`, ADR 029) follow the
rules below, so that what is written is what was decided, however the writes batch.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol, TypeVar

from app.scheduler.units import FairnessBy, job_units, settlement

LaneKey = tuple[str, str]  # (tenant, fairness key) of one job type
_K = TypeVar("_K")


class Charges(NamedTuple):
    """Lane and key charges: jobs claimed per tenant and each tenant's stride (1 /
    weight); jobs claimed per (tenant, key) and each key's stride (1 / key weight); the
    virtual times rate-limited lanes were lifted to (:func:`rate_floor`), each such
    lane in ``lanes`` too, with 0 jobs if it got none; and what the jobs served their
    lanes and keys in units counted at activation (by cost, their costs; none is 0),
    added to ``units_total``."""

    lanes: Counter[str]
    strides: Mapping[str, float]
    keys: Counter[LaneKey]
    key_strides: Mapping[LaneKey, float]
    floors: Mapping[str, float] = {}
    served: Mapping[str, float] = {}
    key_served: Mapping[LaneKey, float] = {}


class Settled(NamedTuple):
    """A lane's worker-time settlement: its units (held less charged, summed) and the
    leases observed for its estimate (how many, and their held seconds)."""

    units: float
    n: int
    held_s: float
    # Virtual time taken back as it is (the estimates' lane_charge or key_charge), not
    # divided by a weight.
    refund: float = 0.0


class ClaimedJob(Protocol):
    """What a charge reads of a claimed job (app.db.rows.JobRow has it)."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def fairness_key(self) -> str: ...
    @property
    def cost(self) -> float: ...
    @property
    def charged(self) -> float | None: ...
    @property
    def lane_charge(self) -> float | None: ...
    @property
    def key_charge(self) -> float | None: ...


class EndedLease(Protocol):
    """What a settlement reads of a lease that ended (app.db.rows.Ended has it)."""

    @property
    def job_type(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def fairness_key(self) -> str: ...
    @property
    def activated_at(self) -> datetime | None: ...
    @property
    def charged(self) -> float | None: ...
    @property
    def lane_charge(self) -> float | None: ...
    @property
    def key_charge(self) -> float | None: ...


def round_charges(
    jobs: Sequence[ClaimedJob],
    mode: FairnessBy,
    weights: Mapping[str, int],
    key_weights: Mapping[LaneKey, int],
    lifted: Mapping[str, float],
    exempt: Mapping[str, int] | None = None,
) -> Charges:
    """What a claim of ``jobs`` charges their lanes and keys: each job's units
    (:func:`job_units`: 1, its cost, or the estimate its activation was charged) per
    weight, as a stride per job claimed; the lanes ``lifted`` to a floor, charged it
    even if they got no job; and by cost, the costs served (by worker time the units
    served are the seconds held, counted as the leases end).  A lane's ``exempt`` jobs
    (given below its tenant's minimum, ADR 042) are counted as served and not charged: its
    charge is that share of the jobs' units less (keys are charged in full: a minimum is
    a tenant's, and its keys share what it gets by their weights as ever)."""
    lanes_n: Counter[str] = Counter(dict.fromkeys(lifted, 0))
    keys_n: Counter[LaneKey] = Counter()
    units: defaultdict[str, float] = defaultdict(float)
    key_units: defaultdict[LaneKey, float] = defaultdict(float)
    owed: defaultdict[str, float] = defaultdict(float)
    key_owed: defaultdict[LaneKey, float] = defaultdict(float)
    for job in jobs:
        key = (job.tenant_id, job.fairness_key)
        # The claim decided the job's mode where it wrote ``charged`` (by worker time),
        # and the virtual time that is for its lane and key (its settlement takes back
        # exactly those, ADR 029).
        u = job.charged if job.charged is not None else job_units(mode, job.cost, None)
        lanes_n[job.tenant_id] += 1
        keys_n[key] += 1
        units[job.tenant_id] += u
        key_units[key] += u
        owed[job.tenant_id] += (
            job.lane_charge if job.lane_charge is not None else u / weights[job.tenant_id]
        )
        key_owed[key] += job.key_charge if job.key_charge is not None else u / key_weights[key]
    by_cost = mode is FairnessBy.COST
    free = exempt or {}
    return Charges(
        lanes_n,
        {
            t: owed[t] * (n - min(n, free.get(t, 0))) / n / n if n else 0.0
            for t, n in lanes_n.items()
        },
        keys_n,
        {k: key_owed[k] / n for k, n in keys_n.items()},
        lifted,
        {t: units[t] for t in lanes_n} if by_cost else {},
        dict(key_units) if by_cost else {},
    )


def _per_job(owed: Mapping[_K, float], claimed: Counter[_K]) -> dict[_K, float]:
    """The stride to charge each of ``claimed``'s jobs so that they add up to what is
    ``owed`` (0 for a lane in only to be lifted to its floor)."""
    return {k: owed[k] / n if n else 0.0 for k, n in claimed.items()}


class Owed:
    """One job type's charges not yet written, summed: the virtual time owed per lane and
    per key (jobs x stride, summed: the charges of rounds whose jobs cost different
    units, or whose weights changed between them, add up; ADR 029), the highest floor
    each lane was lifted to (floors only lift: GREATEST in the charge), and the units
    served."""

    def __init__(self) -> None:
        self.claimed: Counter[str] = Counter()
        self.owed: defaultdict[str, float] = defaultdict(float)
        self.keys: Counter[LaneKey] = Counter()
        self.key_owed: defaultdict[LaneKey, float] = defaultdict(float)
        self.floors: dict[str, float] = {}
        self.served: defaultdict[str, float] = defaultdict(float)
        self.key_served: defaultdict[LaneKey, float] = defaultdict(float)

    def add(self, charges: Charges) -> None:
        self.claimed.update(charges.lanes)
        for tenant, n in charges.lanes.items():
            self.owed[tenant] += n * charges.strides.get(tenant, 0.0)
        self.keys.update(charges.keys)
        for key, n in charges.keys.items():
            self.key_owed[key] += n * charges.key_strides[key]
        for tenant, floor in charges.floors.items():
            self.floors[tenant] = max(floor, self.floors.get(tenant, floor))
        for tenant, units in charges.served.items():
            self.served[tenant] += units
        for key, units in charges.key_served.items():
            self.key_served[key] += units

    def as_charges(self) -> Charges:
        """Everything owed, as one charge: a copy, which later adds do not change (a read
        counting what is owed holds it while more is added, ADR 036)."""
        return Charges(
            Counter(self.claimed),
            _per_job(self.owed, self.claimed),
            Counter(self.keys),
            _per_job(self.key_owed, self.keys),
            dict(self.floors),
            dict(self.served),
            dict(self.key_served),
        )


class OwedSettlements:
    """Worker-time settlements owed by leases that ended (ADR 029), summed per job type,
    lane and key until they are written."""

    def __init__(self) -> None:
        self.lanes: defaultdict[str, dict[str, Settled]] = defaultdict(dict)
        self.keys: defaultdict[str, dict[LaneKey, Settled]] = defaultdict(dict)

    def add(self, ended: Iterable[EndedLease], now: datetime, *, seen: bool = True) -> set[str]:
        """Owe the settlements of ``ended`` leases, ended at ``now``: held from activation
        until then, or (``seen`` false: given back to the queue before their caller got
        them) not at all, and then observed by no estimate.  The job types now owed."""
        types = set()
        for e in ended:
            if e.charged is None or e.activated_at is None:
                continue  # not charged by worker time: nothing to settle
            held = max(0.0, (now - e.activated_at).total_seconds()) if seen else 0.0
            # The held seconds go on at the weights as they are now; the estimate comes off
            # as the virtual time it added (``lane_charge``, ``key_charge``), or, for an
            # activation by a server before alembic 0013, at the weights now.
            old = settlement(FairnessBy.WORKER_TIME, e.charged, held)
            lane = (held, e.lane_charge) if e.lane_charge is not None else (old, 0.0)
            key = (held, e.key_charge) if e.key_charge is not None else (old, 0.0)
            _owe(self.lanes[e.job_type], e.tenant_id, *lane, int(seen), held)
            _owe(self.keys[e.job_type], (e.tenant_id, e.fairness_key), *key, int(seen), held)
            types.add(e.job_type)
        return types

    def take(self, job_type: str) -> tuple[dict[str, Settled], dict[LaneKey, Settled]] | None:
        """What ``job_type`` owes, to be written now (None: nothing)."""
        if not self.lanes.get(job_type):
            return None
        return self.lanes.pop(job_type), self.keys.pop(job_type, {})


def _owe(
    owed: dict[_K, Settled], at: _K, units: float, refund: float, n: int, held_s: float
) -> None:
    was = owed.get(at, Settled(0.0, 0, 0.0))
    owed[at] = Settled(was.units + units, was.n + n, was.held_s + held_s, was.refund + refund)
