"""The pure scheduler's guaranteed minimums (ADR 042): a lane whose tenant is below its
minimum is given picks first, up to its deficit, by weight among such lanes when their
deficits exceed the round; caps, tokens and the type's headroom bound those picks too;
what is left goes by stride from the virtual times as they were, and the picks below a
minimum are not charged."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler import FairnessBy, Lane, round_charges, trim_to_caps


class _Job:
    def __init__(self, tenant_id: str) -> None:
        self.tenant_id, self.fairness_key, self.cost = tenant_id, "", 1.0
        self.charged = self.lane_charge = self.key_charge = None


def test_a_lane_below_its_minimum_is_served_first_whatever_its_virtual_time():
    lanes = [Lane("big", 0.0, 10), Lane("small", 1e6, 1)]
    plan = trim_to_caps(lanes, 10, None, None, {}, minimums={"small": (3, 0)})
    assert plan.allocation.counts == {"small": 3, "big": 7}
    assert plan.allocation.picks[:3] == ("small",) * 3
    assert plan.exempt == {"small": 3}
    # Without the minimum its virtual time keeps it out of this round.
    assert trim_to_caps(lanes, 10, None, None, {}).allocation.counts == {"big": 10}


def test_a_minimum_not_used_is_not_held_back_from_the_others():
    lanes = [Lane("a", 0.0, 1), Lane("b", 0.0, 1)]
    plan = trim_to_caps(lanes, 10, None, None, {}, minimums={"a": (2, 2), "gone": (5, 0)})
    assert plan.allocation.counts == {"a": 5, "b": 5}
    assert plan.exempt == {}


def test_minimums_beyond_the_round_are_served_by_weight_among_the_lanes_below_theirs():
    lanes = [Lane("a", 0.0, 3), Lane("b", 0.0, 1), Lane("c", 0.0, 1)]
    plan = trim_to_caps(lanes, 8, None, None, {}, minimums={"a": (100, 0), "b": (100, 0)})
    assert plan.allocation.counts == {"a": 6, "b": 2}
    assert plan.exempt == {"a": 6, "b": 2}


def test_minimums_beyond_the_workers_take_turns_across_calls_whatever_the_virtual_times():
    """One job a call: the picks below a minimum do not move a lane's virtual time, so
    they cannot order the lanes below theirs; their ACTIVATED jobs per weight do."""
    vtimes = {"a": 0.0, "b": 0.001}  # a thousandth of a stride apart: a would take all
    active = {"a": 0, "b": 0}
    got = []
    for _ in range(4):
        lanes = [Lane(t, v, 1) for t, v in vtimes.items()]
        plan = trim_to_caps(lanes, 1, None, None, {}, minimums={t: (4, active[t]) for t in active})
        [t] = plan.allocation.picks
        active[t] += 1
        got.append(t)
    assert got == ["a", "b", "a", "b"]


def test_caps_tokens_and_the_types_headroom_win_over_a_minimum():
    lanes = [Lane("a", 0.0, 1), Lane("b", 0.0, 1), Lane("c", 0.0, 1)]
    minimums = {"a": (5, 0), "b": (5, 0), "c": (1, 0)}
    plan = trim_to_caps(lanes, 10, 6, 0, {"a": 2}, tokens={"b": 1}, minimums=minimums)
    assert plan.allocation.counts["a"] == 2 and plan.allocation.counts["b"] == 1
    assert plan.allocation.total == 6
    assert plan.exempt == {"a": 2, "b": 1, "c": 1}
    assert plan.capped_out == {"a"} and plan.rate_out == {"b"}


def test_the_picks_below_a_minimum_are_not_charged():
    jobs = [_Job("a")] * 4 + [_Job("b")] * 2
    keys = {("a", ""): 1, ("b", ""): 1}
    charges = round_charges(jobs, FairnessBy.ACTIVATIONS, {"a": 2, "b": 1}, keys, {}, {"a": 3})
    assert charges.lanes == {"a": 4, "b": 2}  # all served
    assert abs(charges.lanes["a"] * charges.strides["a"] - 1 / 2) < 1e-12  # one of four
    assert abs(charges.lanes["b"] * charges.strides["b"] - 2) < 1e-12


lanes_st = st.lists(
    # weight, virtual time, deficit, room (None: no cap)
    st.tuples(
        st.integers(1, 10), st.floats(0, 100), st.integers(0, 12),
        st.one_of(st.none(), st.integers(0, 8)),
    ),
    min_size=1,
    max_size=6,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(lanes_st, st.integers(1, 40), st.one_of(st.none(), st.integers(0, 30)))
def test_minimums_are_reached_where_there_is_room_and_nothing_is_exceeded(spec, n, type_room):
    lanes = [Lane(f"t{i}", v, w) for i, (w, v, _, _) in enumerate(spec)]
    deficits = {f"t{i}": d for i, (_, _, d, _) in enumerate(spec)}
    minimums = {t: (d + 1, 1) for t, d in deficits.items()}  # one active, d short
    room = {f"t{i}": r for i, (_, _, _, r) in enumerate(spec) if r is not None}
    active = None if type_room is None else 0
    plan = trim_to_caps(lanes, n, type_room, active, room, minimums=minimums)
    counts = Counter(plan.allocation.picks)
    assert counts == Counter(plan.allocation.counts)
    limit = n if type_room is None else min(n, type_room)
    # Never more than asked, than the type allows, than a tenant's room.
    assert plan.allocation.total <= limit
    for t, r in room.items():
        assert counts[t] <= r
    # Exempt picks only below a minimum, at most the deficit.
    for t, e in plan.exempt.items():
        assert 0 < e <= min(deficits[t], counts[t])
    # Work conservation: as many picks as the limits allow.
    allowed = sum(room.get(t.tenant_id, limit) for t in lanes)
    assert plan.allocation.total == min(limit, allowed)
    # Minimums first: a lane left below its minimum with room means the exempt picks
    # took the whole limit.
    short = [t for t, d in deficits.items() if plan.exempt.get(t, 0) < min(d, room.get(t, d))]
    if short:
        assert sum(plan.exempt.values()) == limit
