"""The pure scheduler's rate limits (ADR 028): token buckets trim a round as caps do, the
limit is exact over any window, the share a limited lane cannot take goes to the others
in the same round, and a limited lane neither loses its place nor banks credit."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler import Bucket, Lane, allocate, rate_floor, trim_to_caps

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def bucket(per_s: float, burst: float, tokens: float | None = None) -> Bucket:
    return Bucket(per_s, burst, burst if tokens is None else tokens, T0)


def test_a_bucket_refills_at_its_rate_up_to_its_burst():
    b = bucket(10, 5, tokens=0)
    assert b.room(T0) == 0
    assert b.room(T0 + timedelta(milliseconds=250)) == 2  # 2.5 tokens: 2 whole
    assert b.room(T0 + timedelta(seconds=60)) == 5  # never past the burst
    assert b.next_token_s(T0) == 0.1
    assert b.next_token_s(T0 + timedelta(milliseconds=150)) == 0


def test_taking_leaves_the_fraction_and_moves_the_instant():
    b = bucket(10, 5, tokens=0).take(2, T0 + timedelta(milliseconds=250))
    assert b.at == T0 + timedelta(milliseconds=250)
    assert abs(b.tokens - 0.5) < 1e-9
    assert abs(b.next_token_s(b.at) - 0.05) < 1e-9


def test_an_instant_before_the_buckets_own_refills_nothing():
    b = bucket(10, 5, tokens=1)
    earlier = T0 - timedelta(seconds=1)
    assert b.tokens_at(earlier) == 1
    assert b.take(1, earlier).at == T0  # the instant never goes back


def test_a_lane_out_of_tokens_is_skipped_and_its_picks_go_to_the_others():
    lanes = [Lane("a", 0.0, 1), Lane("b", 0.0, 1), Lane("c", 0.0, 1)]
    plan = trim_to_caps(lanes, 9, None, None, {}, tokens={"a": 0})
    assert plan.allocation.total == 9
    assert plan.allocation.counts == {"b": 5, "c": 4}
    assert plan.rate_out == {"a"}
    assert plan.capped_out == frozenset()


def test_a_lane_with_some_tokens_takes_them_and_no_more():
    lanes = [Lane("a", 0.0, 1), Lane("b", 0.0, 1)]
    plan = trim_to_caps(lanes, 10, None, None, {}, tokens={"a": 2})
    assert plan.allocation.counts == {"a": 2, "b": 8}
    assert plan.rate_out == {"a"}


def test_the_lesser_of_a_cap_and_a_bucket_binds():
    lanes = [Lane("a", 0.0, 1), Lane("b", 0.0, 1)]
    plan = trim_to_caps(lanes, 10, None, None, {"a": 3}, tokens={"a": 1})
    assert plan.allocation.counts["a"] == 1
    assert plan.rate_out == {"a"} and plan.capped_out == frozenset()
    plan = trim_to_caps(lanes, 10, None, None, {"a": 1}, tokens={"a": 3})
    assert plan.allocation.counts["a"] == 1
    assert plan.capped_out == {"a"} and plan.rate_out == frozenset()


def test_a_job_types_bucket_bounds_the_whole_round():
    lanes = [Lane("a", 0.0, 1), Lane("b", 0.0, 1)]
    plan = trim_to_caps(lanes, 10, 8, 2, {}, type_tokens=4)
    assert plan.allocation.total == 4 and plan.type_headroom == 4
    plan = trim_to_caps(lanes, 10, 8, 6, {}, type_tokens=4)
    assert plan.allocation.total == 2 and plan.type_headroom == 2


def test_a_limited_lane_behind_the_others_is_lifted_to_them():
    lanes = [Lane("a", 1.0, 1), Lane("b", 7.0, 1), Lane("c", 9.0, 1)]
    assert rate_floor(lanes, {"a"}) == {"a": 7.0}
    # In step (or ahead) it keeps its own place; with no unlimited lane, no floor.
    assert rate_floor([Lane("a", 8.0, 1), Lane("b", 7.0, 1)], {"a"}) == {}
    assert rate_floor([Lane("a", 1.0, 1), Lane("b", 7.0, 1)], {"a", "b"}) == {}
    plan = trim_to_caps(lanes, 4, None, None, {}, tokens={"a": 5})
    assert plan.lifted == {"a": 7.0}
    # Lifted to b's place, a alternates with b instead of taking all 4 to catch up.
    assert plan.allocation.picks == ("a", "b", "a", "b")


def test_ample_tokens_change_nothing_for_a_lane_in_step():
    lanes = [Lane("a", 0.5, 2), Lane("b", 0.0, 1), Lane("c", 0.25, 3)]
    plan = trim_to_caps(lanes, 17, None, None, {}, tokens={"a": 1000})
    assert plan.allocation == allocate(lanes, 17)
    assert plan.rate_out == frozenset() and plan.lifted == {}


def simulate(
    weights: list[int],
    limit: tuple[float, float],
    steps: list[tuple[int, int]],
) -> tuple[list[tuple[float, int]], list[Counter[str]], list[int]]:
    """Rounds of ``n`` picks every ``ms`` milliseconds (``steps``) over lanes that always
    have jobs, lane ``t0`` limited to ``limit`` (per second, burst), each round's jobs
    charged as the store charges them (from the lifted floor).  Per round: the instant
    (s) and t0's activations; the counts; and what the round could have given (n)."""
    per_s, burst = limit
    b = Bucket(per_s, burst, burst, T0)
    vt = {f"t{i}": 0.0 for i in range(len(weights))}
    w = {f"t{i}": wt for i, wt in enumerate(weights)}
    now = T0
    taken: list[tuple[float, int]] = []
    counts: list[Counter[str]] = []
    asked: list[int] = []
    for ms, n in steps:
        now += timedelta(milliseconds=ms)
        lanes = [Lane(t, vt[t], w[t]) for t in vt]
        plan = trim_to_caps(lanes, n, None, None, {}, tokens={"t0": b.room(now)})
        got = Counter(plan.allocation.counts)
        for t, floor in plan.lifted.items():
            vt[t] = max(vt[t], floor)
        for t, k in got.items():
            vt[t] += k / w[t]
        b = b.take(got["t0"], now)
        taken.append(((now - T0).total_seconds(), got["t0"]))
        counts.append(got)
        asked.append(n)
    return taken, counts, asked


limits = st.tuples(st.floats(0.5, 200), st.floats(1, 50))
rounds = st.lists(st.tuples(st.integers(0, 500), st.integers(1, 60)), min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=1, max_size=5), limits, rounds)
def test_in_any_window_a_limited_lane_gets_at_most_burst_plus_rate_times_its_length(
    weights, limit, steps
):
    taken, _, _ = simulate(weights, limit, steps)
    per_s, burst = limit
    for i in range(len(taken)):
        for j in range(i, len(taken)):
            window_s = taken[j][0] - taken[i][0]
            got = sum(k for _, k in taken[i : j + 1])
            assert got <= burst + per_s * window_s + 1e-6


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=2, max_size=5), limits, rounds)
def test_every_round_gives_all_it_was_asked_for_whatever_the_limit(weights, limit, steps):
    """Work conservation: the others always have jobs, so the share the limited lane
    cannot take is taken by them in the same round."""
    _, counts, asked = simulate(weights, limit, steps)
    assert [sum(c.values()) for c in counts] == asked


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=2, max_size=5), limits, rounds)
def test_the_unlimited_lanes_share_what_is_left_by_their_weights(weights, limit, steps):
    _, counts, _ = simulate(weights, limit, steps)
    total = Counter[str]()
    for c in counts:
        total.update(c)
    others = {f"t{i}": wt for i, wt in enumerate(weights) if i}
    left = sum(total[t] for t in others)
    W = sum(others.values())
    for t, wt in others.items():
        # The stride bound between the unlimited lanes (DESIGN §1.1), plus one pick for
        # the limited lane's lifts reordering ties.
        assert abs(total[t] - left * wt / W) <= len(weights) + 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 10), min_size=2, max_size=5),
    st.floats(0.5, 50),
    st.integers(1, 20),
    st.lists(st.integers(1, 40), min_size=5, max_size=40),
)
def test_a_lane_whose_limit_binds_gets_its_tokens_and_banks_nothing_when_it_lifts(
    weights, per_s, burst, ns
):
    """While the bucket binds, the limited lane's virtual time is never left behind the
    unlimited lanes'; once the limit is lifted (ample tokens), it takes no more than its
    fair share from the first round on: no credit banked while it was held back."""
    steps = [(50, n) for n in ns]
    per_s, burst = float(per_s), float(burst)
    b = Bucket(per_s, burst, burst, T0)
    vt = {f"t{i}": 0.0 for i in range(len(weights))}
    w = {f"t{i}": wt for i, wt in enumerate(weights)}
    now = T0
    for ms, n in steps:
        now += timedelta(milliseconds=ms)
        lanes = [Lane(t, vt[t], w[t]) for t in vt]
        plan = trim_to_caps(lanes, n, None, None, {}, tokens={"t0": b.room(now)})
        for t, floor in plan.lifted.items():
            vt[t] = max(vt[t], floor)
        for t, k in plan.allocation.counts.items():
            vt[t] += k / w[t]
        b = b.take(plan.allocation.counts.get("t0", 0), now)
        least_other = min(v for t, v in vt.items() if t != "t0")
        # Lifted to the others each round, then charged what it took: never behind by
        # more than the round's spread of the others' virtual times.
        assert vt["t0"] >= least_other - max(ns) / min(weights[1:]) - 1e-9
    # The limit gone: one round of n picks gives t0 at most its stride share, plus the
    # catch-up of one round's spread (not the whole time it was held back).
    n = 100
    lanes = [Lane(t, vt[t], w[t]) for t in vt]
    after = allocate(lanes, n)
    fair = n * weights[0] / sum(weights)
    spread = max(vt.values()) - vt["t0"]
    assert after.counts.get("t0", 0) <= fair + spread * weights[0] + len(weights)
