"""The dashboard's 15-minute series (app.shares.Throughput): per minute, from samples of
running totals at given instants."""

from __future__ import annotations

from app.shares import Throughput


def test_each_minute_counts_the_activations_between_its_bounds():
    series = Throughput(minutes=3)
    # A sample every 30 s; 10 activations of "a" a minute, "b" starts at the second minute.
    for i in range(8):
        at = 1000.0 + 30 * i
        series.add(at, {"a": 5 * i, **({"b": 7 * (i - 2)} if i >= 2 else {})})
    now = 1000.0 + 30 * 7  # the last sample
    got = series.per_minute(now)
    assert got["a"] == [10, 10, 10]
    # "b" is absent from the samples before 1060: no lane yet, so no activations (0), and
    # its first minute (1030 to 1090) saw 7.
    assert got["b"] == [7, 14, 14]


def test_a_minute_before_the_first_sample_is_unknown_not_zero():
    series = Throughput(minutes=15)
    series.add(500.0, {"a": 100})
    series.add(530.0, {"a": 142})
    got = series.per_minute(530.0)["a"]
    assert got[:-1] == [None] * 14
    assert got[-1] == 42  # the minute the first sample fell in counts from it


def test_old_samples_go_but_one_stays_for_the_oldest_minute():
    series = Throughput(minutes=2)
    for i in range(100):
        series.add(float(i * 10), {"a": i})
    assert len(series.samples) <= 14
    assert series.samples[0][0] <= 990.0 - 120
    assert series.per_minute(990.0)["a"] == [6, 6]


def test_a_total_that_falls_counts_as_no_activations():
    series = Throughput(minutes=1)
    series.add(0.0, {"a": 10})
    series.add(60.0, {"a": 3})  # a lane's row went away
    assert series.per_minute(60.0)["a"] == [0]
