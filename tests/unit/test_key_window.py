"""The second level's share window (app.shares.KeyWindow): a lane's keys, their realised
and entitled shares of the lane over the window, the most active by name and the rest
folded."""

from __future__ import annotations

from app.shares import OTHER_KEYS, KeySample, KeyShare, KeyWindow, LaneKeys, key_interval

LANE = ("t", "a")


def lane(total: int, weight: int, least: float | None, **keys: KeySample) -> LaneKeys:
    return LaneKeys(total, weight, least, dict(keys))


def test_a_new_lanes_keys_count_from_zero_and_share_by_weight() -> None:
    after = lane(40, 4, 1.0, x=KeySample(10, True, 10.0, 1), y=KeySample(30, True, 10.0, 3))
    assert key_interval(None, after) == {"x": (10, 10.0), "y": (30, 30.0)}


def test_a_key_first_sampled_in_a_known_lane_counts_from_its_next_interval() -> None:
    before = lane(100, 2, 0.0, x=KeySample(100, True, 100.0, 1))
    after = lane(150, 2, 0.0, x=KeySample(125, True, 125.0, 1), new=KeySample(900, True, 1.0, 1))
    got = key_interval(before, after)
    # x got 25 of the lane's 50; the new one's 900 so far are not this interval's, so its
    # activations in it are among the others'.
    assert got["x"] == (25, 25.0)
    assert got[OTHER_KEYS] == (25, 25.0)


def test_the_window_keeps_the_most_active_by_name_and_folds_the_rest() -> None:
    window = KeyWindow(60.0, top=2)
    window.add(0.0, {LANE: lane(0, 4, 0.0, **{k: KeySample(0, True, 0.0, 1) for k in "wxyz"})})
    counts = {"w": 40, "x": 30, "y": 20, "z": 10}
    after = {k: KeySample(n, True, n / 1, 1) for k, n in counts.items()}
    window.add(5.0, {LANE: lane(100, 4, 10.0, **after)})
    shares = window.shares(LANE)
    assert [s.key for s in shares] == ["w", "x", OTHER_KEYS]
    assert [s.activated for s in shares] == [40, 30, 30]
    assert [round(s.realized, 2) for s in shares] == [0.4, 0.3, 0.3]
    assert [round(s.entitled, 2) for s in shares] == [0.25, 0.25, 0.5]
    assert [s.vtime_lag for s in shares] == [30.0, 20.0, None]
    assert window.tracked() == {LANE: ["w", "x"]}


def test_intervals_older_than_the_window_leave_it() -> None:
    window = KeyWindow(10.0, top=5)
    window.add(0.0, {LANE: lane(0, 1, 0.0, x=KeySample(0, True, 0.0, 1))})
    window.add(5.0, {LANE: lane(10, 1, 10.0, x=KeySample(10, True, 10.0, 1))})
    window.add(30.0, {LANE: lane(10, 0, None, x=KeySample(10, False, 10.0, 1))})
    window.add(35.0, {LANE: lane(10, 0, None, x=KeySample(10, False, 10.0, 1))})
    # The key is still sampled (shown, idle), with nothing in the window.
    assert window.shares(LANE) == [KeyShare("x", 0, 0.0, 0.0, 1, None)]
