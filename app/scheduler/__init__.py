"""Every fairness decision, pure: no clock, no database, nothing else of the app imported.
Everything takes ``now``.  Its modules: ``stride`` (the picks, aging, caps, rate buckets),
``units`` (what a pick costs), ``charges`` (what claims charge, and how charges written
later add up), ``rates`` (buckets at rest between rounds), ``holds`` (what holds a lane
back).  Their names are all here.

Where fairness is decided:

* Between tenants: stride scheduling over lanes (one lane per job type and tenant).  Each
  lane carries a virtual time ``vtime``; a pick takes the lane with the smallest
  ``vtime`` (ties by tenant id, so it is deterministic) and advances it by ``1/weight``.
  A lane at its cap is skipped and keeps its ``vtime``, so it keeps its place.  A lane that
  comes back from idle re-enters at the current virtual time (:func:`reentry_vtime`), so
  it cannot bank credit while it was away.
* Inside a tenant, between its fairness keys: the same stride scheduling one level down
  (ADR 027).  The picks a lane gets are divided among its backlogged keys
  (:func:`allocate_keys`, :func:`split_among_keys`), each with a virtual time of its own
  inside the lane, advanced by ``1/key weight``; a key back from idle re-enters at its
  lane's key virtual time (:func:`reentry_vtime` again).  A tenant's share is decided
  above, by its lane alone, so spreading its jobs over more keys never raises it.
* Inside a key: effective priority (aging), then FIFO.  The claim ranks a key's head
  rows with the same formula as :func:`effective_priority` (its twin in SQL).  Priority
  does not cross keys: an urgent job is ahead of its own key's other jobs, not of
  another key's turn.
* Caps: a round's allocation is trimmed by the headroom counted under the cap locks
  (:func:`trim_to_caps`), and the lanes a claim leaves at their caps are held out of
  later reads (:func:`left_at_cap`).
* Rate limits (ADR 028): a tenant's or a job type's token :class:`Bucket`, read under the
  same locks, trims the allocation by its whole tokens as a cap's headroom does, so a lane
  out of tokens is skipped and its picks go to the others in the same round.  It is not
  charged, and a rate-limited lane behind the unlimited lanes read with it is lifted to
  the least of their virtual times (:func:`rate_floor`): it keeps its place while it is
  in step, and cannot bank credit while its bucket holds it back (nor hold back the
  virtual time that lanes re-enter at).

* What a pick costs (ADR 029, issue 28 section 3): by default a lane is charged one unit
  per activation.  A job type may charge by ``cost`` (each job declares one) or by
  ``workerTime`` (the seconds its lease was held): :func:`job_units` is what an activation
  is charged, the lane's ``unit`` (:class:`Lane`) what the round expects its next pick to
  cost, :func:`settlement` the correction a finish applies to a ``workerTime`` charge (the
  held time less the estimate charged), and :func:`mixed_estimate` how a lane's estimate
  follows what its jobs really held.

Four rules exist twice, here and in SQL, and name each other: the effective priority
(``app.db.claims.CLAIM``), the re-entry virtual time of a lane and of a key
(``app.db.lanes`` and alembic 0004's ``jobfair_release_holds``), the first pick of a
lane and of its key (``app.db.claims.CLAIM_LEAD``) and a worker-time settlement with its
estimate (``settle_lanes`` in app/db/sql/settling.sql).
``tests/integration/test_twins.py`` checks on a real database that each pair agrees.
"""

from __future__ import annotations

from app.scheduler.charges import (
    Charges,
    ClaimedJob,
    EndedLease,
    LaneKey,
    Owed,
    OwedSettlements,
    Settled,
    round_charges,
)
from app.scheduler.holds import (
    LANE_REASONS,
    Hold,
    HoldReason,
    LaneLimits,
    holds,
    key_holds,
)
from app.scheduler.rates import (
    RESTING_AT_MOST_S,
    Buckets,
    Rests,
)
from app.scheduler.stride import (
    MAX_PRIORITY,
    MIN_STRIDE,
    VTIME_RESOLUTION,
    Aging,
    Allocation,
    Bucket,
    Key,
    Lane,
    PickedJob,
    RateLimit,
    RoundPlan,
    advance,
    allocate,
    allocate_keys,
    as_claimed,
    effective_priority,
    in_pick_order,
    left_at_cap,
    max_wait_to_top_ms,
    rate_floor,
    reentry_vtime,
    split_among_keys,
    trim_to_caps,
)
from app.scheduler.units import (
    DEFAULT_COST,
    DEFAULT_LEASE_ESTIMATE_S,
    ESTIMATE_ALPHA,
    FairnessBy,
    configured_shares,
    job_units,
    lane_unit,
    mixed_estimate,
    retry_at,
    settlement,
    shares,
)

__all__ = [
    "Aging",
    "Allocation",
    "Bucket",
    "Buckets",
    "Charges",
    "ClaimedJob",
    "DEFAULT_COST",
    "DEFAULT_LEASE_ESTIMATE_S",
    "ESTIMATE_ALPHA",
    "EndedLease",
    "FairnessBy",
    "Hold",
    "LANE_REASONS",
    "HoldReason",
    "Key",
    "Lane",
    "LaneKey",
    "LaneLimits",
    "MAX_PRIORITY",
    "MIN_STRIDE",
    "Owed",
    "OwedSettlements",
    "RESTING_AT_MOST_S",
    "RateLimit",
    "Rests",
    "RoundPlan",
    "Settled",
    "VTIME_RESOLUTION",
    "advance",
    "allocate",
    "allocate_keys",
    "as_claimed",
    "in_pick_order",
    "PickedJob",
    "configured_shares",
    "effective_priority",
    "holds",
    "key_holds",
    "job_units",
    "lane_unit",
    "left_at_cap",
    "max_wait_to_top_ms",
    "mixed_estimate",
    "rate_floor",
    "reentry_vtime",
    "retry_at",
    "round_charges",
    "settlement",
    "shares",
    "split_among_keys",
    "trim_to_caps",
]
