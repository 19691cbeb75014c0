"""The pure parts of the metrics: the share window's arithmetic, binning a batch of
observations, the tenant labels' switch, and the text the exposition writes."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.db.rows import TenantSet
from app.domain import utcnow
from app.metrics.events import OTHER, Metrics, TenantLabels, observe_all
from app.metrics.scrape import render
from app.shares import KeySample, KeyWindow, LaneKeys, LaneSample, ShareWindow, interval


def lanes(**spec: tuple) -> dict[tuple[str, str], LaneSample]:
    """``tenant=(activated_total, backlogged, weight[, held_by])`` lanes of job type "t"."""
    return {("t", tenant): LaneSample(*values) for tenant, values in spec.items()}


def test_an_interval_entitles_the_backlogged_lanes_by_weight():
    before = lanes(a=(0, True, 1), b=(0, True, 3), idle=(5, False, 1))
    after = lanes(a=(10, True, 1), b=(30, True, 3), idle=(5, False, 1))
    got = interval(before, after)
    assert got == {("t", "a"): (10, 10.0), ("t", "b"): (30, 30.0)}


def test_a_lane_that_comes_halfway_is_owed_a_share_of_what_came_after_alone():
    window = ShareWindow(60)
    window.add(0, lanes(a=(0, True, 1)))
    window.add(5, lanes(a=(20, True, 1)))  # a alone: all 20 are its own
    window.add(10, lanes(a=(30, True, 1), b=(10, True, 1)))  # b came: 10 and 10 of 20
    shares = window.shares()
    assert shares[("t", "a")] == (30 / 40, 30 / 40)
    assert shares[("t", "b")] == (10 / 40, 10 / 40)


def test_a_starved_lane_is_owed_what_it_did_not_get():
    window = ShareWindow(60)
    window.add(0, lanes(a=(0, True, 1), b=(0, True, 1)))
    window.add(5, lanes(a=(40, True, 1), b=(0, True, 1)))
    assert window.shares()[("t", "b")] == (0.0, 0.5)


def test_the_window_forgets_intervals_older_than_it_and_keeps_one_that_spans_its_start():
    window = ShareWindow(10)
    window.add(0, lanes(a=(0, True, 1)))
    window.add(5, lanes(a=(7, True, 1)))
    window.add(12, lanes(a=(10, True, 1)))
    assert window.activated(("t", "a")) == 10 and window.span_s == 12
    window.add(16, lanes(a=(11, True, 1)))  # the first interval ended more than 10 s ago
    assert window.activated(("t", "a")) == 4 and window.span_s == 11
    window.add(40, lanes(a=(11, False, 1)))
    assert window.lanes() == [] and window.span_s == 24


@given(
    st.lists(
        st.dictionaries(
            st.sampled_from("abcd"),
            st.tuples(st.integers(0, 50), st.booleans(), st.integers(1, 5), st.booleans()),
            min_size=1,
        ),
        min_size=2,
        max_size=8,
    )
)
def test_realised_and_entitled_shares_each_add_up_to_one(steps):
    window = ShareWindow(1000)
    totals: dict[str, int] = {}
    for at, step in enumerate(steps):
        sample = {}
        for tenant, (more, backlogged, weight, held) in step.items():
            totals[tenant] = totals.get(tenant, 0) + more
            reason = "tenantCap" if held else None
            sample[("t", tenant)] = LaneSample(totals[tenant], backlogged, weight, reason)
        window.add(float(at), sample)
    shares = window.shares()
    if sum(window.activated(lane) for lane in shares):
        assert abs(sum(r for r, _ in shares.values()) - 1) < 1e-9
        assert abs(sum(e for _, e in shares.values()) - 1) < 1e-9


def test_a_lane_held_at_its_cap_is_owed_what_it_took_and_the_rest_goes_by_weight():
    before = lanes(a=(0, True, 1, "tenantCap"), b=(0, True, 1), c=(0, True, 2))
    after = lanes(a=(2, True, 1, "tenantCap"), b=(8, True, 1), c=(14, True, 2))
    # 24 made: a's weighted share is 6, it could take 2; the other 22 go 1:2.
    assert interval(before, after) == {
        ("t", "a"): (2, 2.0),
        ("t", "b"): (8, 22 / 3),
        ("t", "c"): (14, 44 / 3),
    }
    # Held at one end only, it could still have taken its share: owed no more than that.
    after = lanes(a=(9, True, 1), b=(5, True, 1), c=(10, True, 2))
    assert interval(before, after)[("t", "a")] == (9, 6.0)


def test_the_time_held_is_counted_by_halves_and_by_what_held_it():
    window = ShareWindow(60)
    window.add(0, lanes(a=(0, True, 1)))
    window.add(10, lanes(a=(1, True, 1, "tenantCap")))
    window.add(20, lanes(a=(2, True, 1, "tenantRate")))
    window.add(40, lanes(a=(2, False, 1, "tenantRate")))  # no ready jobs: not waiting
    assert window.held(("t", "a")) == {"tenantCap": 10 / 40, "tenantRate": 15 / 40}


@given(st.lists(st.floats(-1, 5000, allow_nan=False), max_size=50))
def test_binning_a_batch_is_observing_each(values):
    bounds = (0.01, 0.5, 1.0, 60.0)
    one = Histogram("one", "", ["x"], buckets=bounds, registry=CollectorRegistry())
    all_ = Histogram("all", "", ["x"], buckets=bounds, registry=CollectorRegistry())
    child = one.labels("x")
    for v in values:
        child.observe(max(0.0, v))
    observe_all(all_.labels("x"), values)

    def samples(h: Histogram) -> list[tuple[str, dict[str, str], float]]:
        [family] = h.collect()
        return [(s.name.split("_", 1)[1], s.labels, round(s.value, 6)) for s in family.samples]

    assert samples(one) == samples(all_)


async def test_labels_switch_to_a_published_set_at_its_instant():
    labels = TenantLabels()
    now = utcnow()
    soon = now + timedelta(milliseconds=50)
    labels.apply(
        [TenantSet(now - timedelta(hours=1), frozenset({"a"})), TenantSet(soon, frozenset({"b"}))],
        now,
    )
    assert labels.of("a") == "a" and labels.of("b") == OTHER
    await asyncio.sleep(0.2)
    assert labels.of("a") == OTHER and labels.of("b") == "b"
    labels.close()


def test_the_text_is_prometheus_client_s_and_folds_what_has_no_label():
    m = Metrics(1)  # one labelled tenant: the first event's; the next is folded
    m.count(m.created, [("t", "a"), ("t", "a"), ("t", "b")])
    m.sync()
    text = render(m.registry.collect()).decode()
    assert text == generate_latest(m.registry).decode()  # prometheus-client's own text
    assert "jobfair_waiters 0.0\n" in text
    assert 'jobfair_jobs_created_total{tenant="a",type="t"} 2.0\n' in text
    assert 'jobfair_jobs_created_total{tenant="<other>",type="t"} 1.0\n' in text
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert {"jobfair_jobs_created_total", "jobfair_waiters", "jobfair_db_pool_in_use"} <= names


def test_tenants_are_labelled_at_once_while_there_is_room_and_a_set_decides_the_edge():
    labels = TenantLabels(top=2)
    assert [labels.of(t) for t in ("a", "b", "c", "a")] == ["a", "b", OTHER, "a"]
    assert labels.shown("c") == OTHER and labels.labelled == {"a", "b"}
    now = utcnow()
    # The leader's set in force names c and a: b, admitted here, gives way (room 0).
    labels.apply([TenantSet(now - timedelta(seconds=1), frozenset({"c", "a"}))], now)
    assert labels.labelled == {"a", "c"} and labels.of("b") == OTHER
    labels.close()


def test_a_hold_between_two_samples_counts_as_held_for_the_interval():
    """Capped at 2 and freed between rounds: free at both samples, but a claim held it
    at its cap in between (lanes.held_count moved)."""
    before = {("t", "a"): LaneSample(0, True, 3, None, 5), ("t", "b"): LaneSample(0, True, 1)}
    after = {("t", "a"): LaneSample(2, True, 3, None, 9), ("t", "b"): LaneSample(18, True, 1)}
    assert interval(before, after) == {("t", "a"): (2, 2.0), ("t", "b"): (18, 18.0)}
    window = ShareWindow(60)
    window.add(0, before)
    window.add(10, after)
    assert window.held(("t", "a")) == {"tenantCap": 1.0} and window.held(("t", "b")) == {}


def test_a_lane_that_ran_out_of_jobs_was_given_all_it_had():
    """A trickle beside a flood: its one job taken, nothing left at the interval's end;
    entitled to what it took, the rest to the flood."""
    before = lanes(flood=(0, True, 1), trickle=(0, True, 1))
    after = lanes(flood=(19, True, 1), trickle=(1, False, 1))
    assert interval(before, after) == {("t", "flood"): (19, 19.0), ("t", "trickle"): (1, 1.0)}


def test_a_lane_held_with_nothing_then_quiet_leaves_the_window_without_a_crash():
    """Found by a probe: a lane's sums were deleted when they reached 0 while a later
    interval still named it (entitled 0, served 0: held at its cap); when that interval
    expired, KeyError -- and the sampler's death stopped the server."""
    window = ShareWindow(10)
    window.add(0, lanes(a=(0, True, 1, "tenantCap"), b=(0, True, 1)))
    window.add(5, lanes(a=(0, True, 1, "tenantCap"), b=(5, True, 1)))
    window.add(6, lanes(a=(0, True, 1, "tenantCap"), b=(6, True, 1)))
    window.add(30, lanes(a=(0, True, 1, "tenantCap"), b=(6, True, 1)))
    window.add(60, lanes(a=(0, True, 1, "tenantCap"), b=(6, True, 1)))
    assert window.activated(("t", "b")) == 0


def test_a_key_that_ran_out_beside_its_siblings_leaves_the_window_without_a_crash():
    window = KeyWindow(10, top=5)

    def sample(a: int, b: int, a_ready: bool) -> dict:
        keys = {"a": KeySample(a, a_ready, 0.0, 1), "b": KeySample(b, True, 0.0, 1)}
        return {("t", "x"): LaneKeys(a + b, 2 if a_ready else 1, 0.0, keys)}

    window.add(0, sample(0, 0, True))
    window.add(1, sample(1, 1, False))  # a ran out
    window.add(2, sample(1, 3, False))  # a sampled, not owed, served nothing: (0, 0)
    window.add(40, sample(1, 3, False))
    window.add(80, sample(1, 3, False))
    assert [k.activated for k in window.shares(("t", "x"))] == [0, 0]


@given(
    st.lists(
        st.tuples(
            st.floats(0.1, 30),
            st.dictionaries(
                st.sampled_from("abc"),
                st.tuples(st.integers(0, 5), st.booleans(), st.sampled_from([None, "tenantCap"])),
            ),
        ),
        max_size=25,
    )
)
def test_the_window_keeps_the_sums_of_the_intervals_it_keeps(steps):
    """Whatever the samples, adding and forgetting never fails, and the window's sums are
    those of the intervals it keeps."""
    window = ShareWindow(20)
    totals: dict[str, int] = {}
    at = 0.0
    for gap, step in steps:
        at += gap
        sample = {}
        for tenant, (more, ready, held) in step.items():
            totals[tenant] = totals.get(tenant, 0) + more
            sample[("t", tenant)] = LaneSample(totals[tenant], ready, 1, held)
        window.add(at, sample)
        for lane in {("t", t) for t in "abc"}:
            kept = sum(i.counts.get(lane, (0, 0))[0] for i in window._intervals)
            assert window.activated(lane) == round(kept)
