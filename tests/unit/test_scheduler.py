"""The pure scheduler: stride shares, caps and aging bounds (hypothesis properties)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.scheduler import (
    Aging,
    Lane,
    allocate,
    effective_priority,
    max_wait_to_top_ms,
    reentry_vtime,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

weights = st.lists(st.integers(1, 50), min_size=1, max_size=8)


def run(lanes: list[Lane], rounds: int, per_call: int) -> Counter[str]:
    """Repeated activation calls, each advancing the lanes as the store would."""
    got: Counter[str] = Counter()
    vt = {lane.tenant_id: lane.vtime for lane in lanes}
    w = {lane.tenant_id: lane.weight for lane in lanes}
    for _ in range(rounds):
        alloc = allocate([Lane(t, vt[t], w[t]) for t in vt], per_call)
        for t, k in alloc.counts.items():
            vt[t] += k / w[t]
            got[t] += k
    return got


def test_equal_weights_alternate():
    alloc = allocate([Lane("a", 0.0, 1), Lane("b", 0.0, 1)], 6)
    assert alloc.picks == ("a", "b", "a", "b", "a", "b")


def test_lane_behind_in_virtual_time_goes_first():
    alloc = allocate([Lane("a", 5.0, 1), Lane("b", 2.0, 1)], 4)
    assert alloc.picks == ("b", "b", "b", "a")


@settings(max_examples=200, deadline=None)
@given(weights, st.integers(1, 400), st.integers(1, 50))
def test_shares_converge_to_weights_within_the_stride_bound(ws, total, per_call):
    lanes = [Lane(f"t{i}", 0.0, w) for i, w in enumerate(ws)]
    rounds = max(1, total // per_call)
    got = run(lanes, rounds, per_call)
    n_picks = sum(got.values())
    assert n_picks == rounds * per_call
    W = sum(ws)
    n = len(ws)
    for i, w in enumerate(ws):
        ideal = n_picks * w / W
        # Stride scheduling: T·w/W − n·w/W ≤ picks ≤ T·w/W + 1 (see DESIGN §1.1).
        assert ideal - n * w / W - 1e-9 <= got[f"t{i}"] <= ideal + 1 + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    weights,
    st.lists(st.integers(0, 20), min_size=8, max_size=8),
    st.integers(1, 100),
    st.one_of(st.none(), st.integers(0, 100)),
)
def test_caps_are_never_exceeded(ws, headrooms, n, type_headroom):
    lanes = [
        Lane(f"t{i}", float(i % 3), w, headrooms[i] if i % 2 else None) for i, w in enumerate(ws)
    ]
    alloc = allocate(lanes, n, type_headroom)
    assert alloc.total <= n
    if type_headroom is not None:
        assert alloc.total <= type_headroom
    for lane in lanes:
        if lane.headroom is not None:
            assert alloc.counts.get(lane.tenant_id, 0) <= lane.headroom
    # Work-conserving: it stops short only when every lane is out of headroom.
    uncapped = any(lane.headroom is None for lane in lanes)
    room = sum(lane.headroom or 0 for lane in lanes)
    limit = n if type_headroom is None else min(n, type_headroom)
    if uncapped:
        assert alloc.total == limit
    else:
        assert alloc.total == min(limit, room)


def test_capped_lane_keeps_its_place():
    # b is at its cap: a is served, b's virtual time does not move.
    alloc = allocate([Lane("a", 1.0, 1), Lane("b", 0.0, 1, headroom=0)], 3)
    assert alloc.counts == {"a": 3}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 100), st.integers(1, 10_000), st.integers(1, 100), st.integers(0, 10_000_000))
@example(priority=0, interval_ms=4007, step=1, wait_ms=4007)  # float ms: 4006.9999999999995
def test_aging_bound_holds(priority, interval_ms, step, wait_ms):
    aging = Aging(interval_ms, step)
    now = T0 + timedelta(milliseconds=wait_ms)
    eff = effective_priority(priority, T0, now, aging)
    assert priority <= eff <= 100
    assert eff == min(100, priority + step * (wait_ms // interval_ms))
    # No job waits longer than ceil((100 - p) / step) intervals to be top priority.
    bound = max_wait_to_top_ms(priority, aging)
    if wait_ms >= bound:
        assert eff == 100


@given(st.integers(0, 100), st.integers(0, 100), st.integers(0, 1_000_000))
def test_aging_is_monotonic_in_wait(p, q, wait):
    aging = Aging(60_000, 10)
    a = effective_priority(p, T0, T0 + timedelta(milliseconds=wait), aging)
    b = effective_priority(p, T0, T0 + timedelta(milliseconds=wait + 60_000), aging)
    assert b >= a


def test_no_aging_with_step_zero():
    aging = Aging(1, 0)
    assert effective_priority(10, T0, T0 + timedelta(days=1), aging) == 10
    assert max_wait_to_top_ms(10, aging) == float("inf")


@given(st.floats(0, 1e6), st.one_of(st.none(), st.floats(0, 1e6)), st.floats(0, 1e6))
def test_reentry_never_banks_credit(own, min_active, max_all):
    v = reentry_vtime(own, min_active, max_all)
    assert v >= own
    assert v >= (min_active if min_active is not None else max_all)
