"""The pure scheduler's second level (ADR 027): a lane's picks divided among its fairness
keys.  Hypothesis properties against a reference model written from the ADR alone --
pick by pick: the backlogged tenant with the least virtual time (ties by id), then its
backlogged key with the least virtual time (ties by key), each advanced by one over its
weight -- and the Sybil property: spreading a tenant's jobs over more keys never raises
its share (nor lowers it)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler import Key, Lane, allocate, allocate_keys, split_among_keys
from app.scheduler.stride import advance

# A tenant: (weight, its keys' weights).
Tenants = dict[str, tuple[int, list[int]]]


def reference(tenants: Tenants, picks: int) -> Counter[tuple[str, str]]:
    """``picks`` picks, one at a time, every key backlogged throughout."""
    tv = dict.fromkeys(tenants, 0.0)
    kv = {(t, f"k{i:03}"): 0.0 for t, (_, ks) in tenants.items() for i in range(len(ks))}
    got: Counter[tuple[str, str]] = Counter()
    for _ in range(picks):
        t = min(tv, key=lambda x: (tv[x], x))
        tv[t] += 1 / tenants[t][0]
        k = min((tk for tk in kv if tk[0] == t), key=lambda tk: (kv[tk], tk[1]))
        kv[k] += 1 / tenants[t][1][int(k[1][1:])]
        got[k] += 1
    return got


def rounds(tenants: Tenants, n_rounds: int, per_call: int) -> Counter[tuple[str, str]]:
    """Activation rounds as the service makes them: the lanes' picks (allocate), each
    lane's divided among its keys (split_among_keys), then the lanes and keys charged as
    the store charges them."""
    tv = dict.fromkeys(tenants, 0.0)
    kv = {(t, f"k{i:03}"): 0.0 for t, (_, ks) in tenants.items() for i in range(len(ks))}
    got: Counter[tuple[str, str]] = Counter()
    for _ in range(n_rounds):
        lanes = allocate([Lane(t, tv[t], w) for t, (w, _) in tenants.items()], per_call)
        keys = {
            t: [Key(f"k{i:03}", kv[(t, f"k{i:03}")], w) for i, w in enumerate(ks)]
            for t, (_, ks) in tenants.items()
        }
        for t, n in lanes.counts.items():
            tv[t] += n / tenants[t][0]
        for (t, k), n in split_among_keys(lanes.counts, keys).items():
            kv[(t, k)] += n / tenants[t][1][int(k[1:])]
            got[(t, k)] += n
    return got


def per_tenant(got: Counter[tuple[str, str]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for (t, _), n in got.items():
        out[t] += n
    return out


def tenant_sets(weights: st.SearchStrategy[int]) -> st.SearchStrategy[Tenants]:
    return st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.tuples(weights, st.lists(weights, min_size=1, max_size=30)),
        min_size=1,
    )


# Powers of two where one-at-a-time and round-by-round charges are compared, so that
# virtual times add up exactly in floating point (ties then break alike).
exact = tenant_sets(st.sampled_from([1, 2, 4, 8, 16]))
any_weights = tenant_sets(st.integers(1, 10_000))


@settings(max_examples=150, deadline=None)
@given(exact, st.integers(1, 30), st.integers(1, 40))
def test_rounds_of_two_level_picks_are_the_reference_models_picks(tenants, n_rounds, per_call):
    """Dividing the picks round by round gives what picking one at a time gives: stride
    scheduling keeps no state but the virtual times, at either level."""
    assert rounds(tenants, n_rounds, per_call) == reference(tenants, n_rounds * per_call)


@settings(max_examples=150, deadline=None)
@given(
    any_weights,
    st.lists(st.integers(1, 10_000), min_size=1, max_size=300),
    st.integers(1, 30),
    st.integers(1, 40),
)
def test_spreading_a_tenants_jobs_over_more_keys_never_changes_its_share(
    tenants, sybil_weights, n_rounds, per_call
):
    """Tenant "a" with one key, and with any number of keys of any weights: every
    tenant's picks are the same, after every number of rounds -- and the same as one
    level of stride scheduling over the tenants alone gives."""
    one = {**tenants, "a": (tenants.get("a", (1, [1]))[0], [1])}
    many = {**one, "a": (one["a"][0], sybil_weights)}
    alone = run_one_level({t: w for t, (w, _) in one.items()}, n_rounds, per_call)
    assert per_tenant(rounds(one, n_rounds, per_call)) == alone
    assert per_tenant(rounds(many, n_rounds, per_call)) == alone


def run_one_level(weights: dict[str, int], n_rounds: int, per_call: int) -> Counter[str]:
    vt = dict.fromkeys(weights, 0.0)
    got: Counter[str] = Counter()
    for _ in range(n_rounds):
        lanes = [Lane(t, vt[t], w) for t, w in weights.items()]
        for t, n in allocate(lanes, per_call).counts.items():
            vt[t] += n / weights[t]
            got[t] += n
    return got


@settings(max_examples=150, deadline=None)
@given(any_weights, st.integers(1, 30), st.integers(1, 40))
def test_each_tenants_keys_share_its_picks_by_weight_within_the_stride_bound(
    tenants, n_rounds, per_call
):
    """Inside a tenant the keys get what one level of stride scheduling gives lanes:
    after T picks of the tenant, key i has between T*w/W - n*w/W and T*w/W + 1 (n keys,
    W their weights), whatever the other tenants do."""
    got = rounds(tenants, n_rounds, per_call)
    by_tenant = per_tenant(got)
    for t, (_, ks) in tenants.items():
        total, weight, n = by_tenant[t], sum(ks), len(ks)
        for i, w in enumerate(ks):
            ideal = total * w / weight
            assert ideal - n * w / weight - 1e-9 <= got[(t, f"k{i:03}")] <= ideal + 1 + 1e-9


def test_a_lane_without_keys_read_gets_nothing_and_others_are_unchanged():
    counts = split_among_keys({"a": 3, "b": 2}, {"b": [Key("x", 0.0, 1), Key("y", 0.5, 1)]})
    assert counts == {("b", "x"): 1, ("b", "y"): 1}


def test_a_key_behind_in_its_lanes_virtual_time_goes_first():
    assert allocate_keys([Key("x", 3.5, 1), Key("y", 1.0, 1)], 3) == {"y": 3}
    assert allocate_keys([Key("x", 0.0, 1), Key("y", 0.0, 4)], 5) == {"x": 1, "y": 4}


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(
        st.tuples(
            st.floats(0, 10, allow_nan=False),
            st.integers(1, 5),
            st.none() | st.integers(0, 4),
        ),
        min_size=1,
        max_size=8,
    ),
    n=st.integers(0, 40),
)
def test_keys_with_room_take_at_most_their_room_and_the_rest_goes_to_the_others(keys, n):
    """Issue 44: a key's picks never exceed its room (its caps less its running jobs,
    ADR 040), and no pick is lost while another key has room: the lane gets
    min(n, total room) picks, as many as a reference that skips full keys pick by pick."""
    ks = [Key(f"k{i}", v, w, headroom=h) for i, (v, w, h) in enumerate(keys)]
    got = allocate_keys(ks, n)
    for k in ks:
        assert got.get(k.key, 0) <= (n if k.headroom is None else k.headroom)
    room = sum(n if k.headroom is None else k.headroom for k in ks)
    assert sum(got.values()) == min(n, room)
    # The reference: pick by pick, the key with room and the least (vtime, key).
    vt = {k.key: k.vtime for k in ks}
    left = {k.key: k.headroom for k in ks}
    want: Counter[str] = Counter()
    for _ in range(n):
        open_ = [k for k in ks if left[k.key] is None or left[k.key] > 0]
        if not open_:
            break
        k = min(open_, key=lambda x: (vt[x.key], x.key))
        want[k.key] += 1
        vt[k.key] = advance(vt[k.key], k.stride)
        if left[k.key] is not None:
            left[k.key] -= 1
    assert Counter(got) == want
