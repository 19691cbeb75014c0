"""Fairness by cost and by worker time (issue 28 section 3; ADR 029), in the pure
scheduler: a simulated pool of workers takes stride picks (``scheduler.allocate``) from
always-backlogged lanes, each activation is charged ``job_units``, and each finish settles
the charge (``settlement``) and moves the lane's estimate (``mixed_estimate``), as the
store is to do.  The properties are the bounds ADR 029 states:

* by cost, every lane's cost per weight stays within one round's worth of the largest
  cost of every other's (stride scheduling's bound with unequal charges);
* by worker time, every lane's finished worker time per weight stays within
  ``(E + W x (H + E)) / min weight`` of every other's, H the longest lease, E the largest
  estimate, W the workers: the in-flight estimates and the settlements not yet made are
  all that separates the charges from the worker time really used;
* by activations, the charges are the dispatch counts, as before (units of 1).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler import (
    DEFAULT_LEASE_ESTIMATE_S,
    MIN_STRIDE,
    FairnessBy,
    Lane,
    advance,
    allocate,
    job_units,
    mixed_estimate,
    settlement,
)


@dataclass
class _Lane:
    weight: int
    mean_s: float  # the mean lease its jobs hold (worker time), or their mean cost
    vtime: float = 0.0
    estimate: float | None = None
    held: float = 0.0  # worker time of finished jobs, or cost of activated ones
    activations: int = 0
    in_flight: list[float] = field(default_factory=list)


def _draw(rng: random.Random, mean: float, jitter: float) -> float:
    return max(1e-6, mean * (1 + rng.uniform(-jitter, jitter)))


def _simulate_worker_time(
    lanes: dict[str, _Lane],
    workers: int,
    finishes: int,
    jitter: float,
    seed: int,
    mode: FairnessBy = FairnessBy.WORKER_TIME,
) -> tuple[float, float]:
    """Runs ``workers`` workers over ``lanes`` until ``finishes`` jobs finished; answers
    the largest gap seen between two lanes' worker time per weight, and the bound."""
    rng = random.Random(seed)
    running: list[tuple[float, int, str, float, float]] = []  # (end, seq, lane, charged, held)
    now, seq, done, worst = 0.0, 0, 0, 0.0
    longest = max(lane.mean_s for lane in lanes.values()) * (1 + jitter)
    largest_estimate = max(longest, DEFAULT_LEASE_ESTIMATE_S)
    w_min = min(lane.weight for lane in lanes.values())
    bound = (largest_estimate + workers * (longest + largest_estimate)) / w_min
    free = workers
    while done < finishes:
        if free:
            # The free workers' picks in one round, as an activation of maxJobs=free.
            picked = allocate(
                [
                    Lane(
                        name,
                        lane.vtime,
                        lane.weight,
                        unit=job_units(mode, 1.0, lane.estimate),
                    )
                    for name, lane in lanes.items()
                ],
                free,
            )
            for name in picked.picks:
                lane = lanes[name]
                charged = job_units(mode, 1.0, lane.estimate)
                lane.vtime += charged / lane.weight
                lane.activations += 1
                held = _draw(rng, lane.mean_s, jitter)
                seq += 1
                heapq.heappush(running, (now + held, seq, name, charged, held))
            free = 0
        now, _, name, charged, held = heapq.heappop(running)
        lane = lanes[name]
        lane.vtime += settlement(mode, charged, held) / lane.weight
        lane.estimate = mixed_estimate(lane.estimate, held, 1)
        lane.held += held
        free += 1
        done += 1
        per_weight = [x.held / x.weight for x in lanes.values()]
        worst = max(worst, max(per_weight) - min(per_weight))
    return worst, bound


lane_specs = st.lists(
    st.tuples(st.integers(1, 5), st.sampled_from([0.01, 0.03, 0.1, 0.25, 1.0])),
    min_size=2,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(lane_specs, st.integers(1, 12), st.sampled_from([0.0, 0.2, 0.5]), st.integers(0, 10**6))
def test_worker_time_per_weight_stays_within_the_bound(specs, workers, jitter, seed):
    lanes = {f"t{i}": _Lane(w, mean) for i, (w, mean) in enumerate(specs)}
    worst, bound = _simulate_worker_time(lanes, workers, 1500, jitter, seed)
    assert worst <= bound, (worst, bound)


def test_worker_time_shares_one_to_one_where_dispatch_counts_give_ten_to_one():
    """Issue 28 section 5's scenario in the pure core: A's jobs take 100 ms, B's 10 ms,
    equal weights.  By worker time they get 1:1 of the workers' time; by activations
    (the control: the test can fail) A gets about ten times B's."""
    shares = {}
    for mode in (FairnessBy.WORKER_TIME, FairnessBy.ACTIVATIONS):
        lanes = {"A": _Lane(1, 0.100), "B": _Lane(1, 0.010)}
        _simulate_worker_time(lanes, 8, 20_000, 0.2, 7, mode)
        shares[mode] = lanes["A"].held / (lanes["A"].held + lanes["B"].held)
    assert abs(shares[FairnessBy.WORKER_TIME] - 0.5) <= 0.025, shares
    assert shares[FairnessBy.ACTIVATIONS] > 0.85, shares


def test_worker_time_weights_one_to_three():
    lanes = {"A": _Lane(1, 0.05), "B": _Lane(3, 0.02)}
    _simulate_worker_time(lanes, 6, 20_000, 0.5, 11)
    share_b = lanes["B"].held / (lanes["A"].held + lanes["B"].held)
    assert abs(share_b - 0.75) <= 0.02, share_b


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 5), st.sampled_from([0.5, 1.0, 3.0, 10.0])),
        min_size=2,
        max_size=5,
    ),
    st.integers(1, 20),
    st.integers(0, 10**6),
)
def test_cost_per_weight_stays_within_one_round_of_the_largest_cost(specs, per_round, seed):
    """Rounds of ``per_round`` picks allocated by each lane's estimated cost, charged the
    costs the jobs declare (drawn around each lane's mean, up to twice it): at every
    round's end, two lanes' cost per weight differ by at most ``per_round`` x the largest
    cost / the least weight."""
    rng = random.Random(seed)
    lanes = {f"t{i}": _Lane(w, mean) for i, (w, mean) in enumerate(specs)}
    largest = 2 * max(mean for _, mean in specs)
    bound = (per_round + 1) * largest / min(w for w, _ in specs)
    for _ in range(300):
        picked = allocate(
            [Lane(n, x.vtime, x.weight, unit=x.estimate or 1.0) for n, x in lanes.items()],
            per_round,
        )
        for name, k in picked.counts.items():
            lane = lanes[name]
            costs = [rng.uniform(lane.mean_s / 2, 2 * lane.mean_s) for _ in range(k)]
            units = sum(job_units(FairnessBy.COST, c, None) for c in costs)
            lane.vtime += units / lane.weight
            lane.held += units
            lane.estimate = mixed_estimate(lane.estimate, units, k)
            assert settlement(FairnessBy.COST, units, 123.0) == 0.0
        per_weight = [x.held / x.weight for x in lanes.values()]
        assert max(per_weight) - min(per_weight) <= bound, (per_weight, bound)


@given(st.lists(st.tuples(st.text(min_size=1, max_size=3), st.integers(1, 9)), max_size=6))
def test_by_activations_a_unit_is_one_and_the_picks_are_unchanged(lanes):
    plain = [Lane(t, 0.0, w) for t, w in dict(lanes).items()]
    units = [
        Lane(t, 0.0, w, unit=job_units(FairnessBy.ACTIVATIONS, 7.0, 3.0))
        for t, w in dict(lanes).items()
    ]
    assert allocate(plain, 50) == allocate(units, 50)
    assert settlement(FairnessBy.ACTIVATIONS, 1.0, 99.0) == 0.0


@given(
    st.one_of(st.none(), st.floats(0.001, 100)),
    st.lists(st.floats(0.001, 100), min_size=1, max_size=50),
)
def test_an_estimate_stays_between_what_it_was_and_what_it_saw(old, seen):
    est = mixed_estimate(old, sum(seen), len(seen))
    assert est is not None
    low = min([*seen, *([old] if old is not None else [])])
    high = max([*seen, *([old] if old is not None else [])])
    assert low - 1e-9 <= est <= high + 1e-9
    assert mixed_estimate(old, 0.0, 0) == old


def test_a_settlement_makes_the_charge_the_time_held():
    charged = job_units(FairnessBy.WORKER_TIME, 1.0, 0.25)
    assert charged == 0.25
    assert charged + settlement(FairnessBy.WORKER_TIME, charged, 0.1) == 0.1
    assert job_units(FairnessBy.WORKER_TIME, 1.0, None) == DEFAULT_LEASE_ESTIMATE_S


@given(
    st.floats(-1e18, 1e18, allow_nan=False),
    st.floats(0.0, 1e9, allow_nan=False),
    st.integers(1, 1000),
)
def test_a_pick_always_moves_its_lane(vtime, stride, n):
    """A pick's advance is never rounded away (helper report, issue 28 section 3: a
    stride of 1e-10 at a virtual time of 1e9 added nothing), and it is the stride
    itself wherever the float8 can hold it."""
    moved = advance(vtime, stride, n)
    assert moved > vtime
    assert advance(moved, stride) > moved
    if stride >= max(abs(vtime) * 1e-12, MIN_STRIDE):
        assert abs((moved - vtime) - n * stride) <= 1e-9 * n * stride + abs(vtime) * 1e-15
    assert advance(vtime, stride, 0) == vtime


@given(st.floats(0.0, 1e15), st.integers(2, 6), st.integers(2, 60))
def test_lanes_tied_where_their_strides_round_away_take_turns(vtime, lanes, picks):
    """Lanes at one virtual time with strides far below its resolution: stride picks
    share them out evenly (within one pick), as equal strides would, rather than give
    every pick to the first by id."""
    got = allocate([Lane(f"t{i}", vtime, 10_000, unit=1e-6) for i in range(lanes)], picks)
    assert max(got.counts.values()) - min(got.counts.get(f"t{i}", 0) for i in range(lanes)) <= 1
