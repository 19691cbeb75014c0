"""Fairness measured: each lane's realised share of its job type's activations over a
sliding window, against the share it was entitled to, and how long it was held back (by
a cap, a rate limit or a pause).  Pure: it is given samples of the lanes and their
instants, and computes.

The entitlement is computed per interval between two samples, then summed over the
window: in an interval where a job type made ``A`` activations, the lanes backlogged in
it share them by weight, as the scheduler does -- except that a lane held back (at a cap,
out of tokens, paused) at either end of the interval could take no more than it took:
it is entitled to the lesser of its weighted share and what it got, and what it leaves
is shared by weight among the others (water-filling, as max-min fairness with caps); so
is a lane that ran out of ready jobs by the interval's end (it was given all it had: a
tenant whose few jobs are taken as they come is not shown starved).  A
lane is backlogged in an interval when it had ready jobs at either end of it, or was
activated in it.  So a tenant that joins halfway through the window is entitled only to
a share of the activations made after it came, not of the window's; a tenant capped at
1 is not shown starved of a share its cap forbids; and over any window the entitled
shares of a type add up to 1, as the realised ones do.  ``realised / entitled`` is then
exact for lanes backlogged throughout, and errs, at the window's edges, by at most one
interval's worth of activations for the others.

The time a lane was held is counted by halves: an interval's first half by what held it
at its start, its second half by what held it at its end.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

Lane = tuple[str, str]  # (job type, tenant)


class LaneSample(NamedTuple):
    """One lane at one sample: its running count of what it was served (activations,
    ``lanes.activated_total``; or, for a job type fair by cost or worker time, its units,
    ``lanes.units_total``), whether it has ready jobs (active), its tenant's weight, and
    what holds it back if anything does (``app.scheduler.Hold.reason``: a cap, a rate
    limit, a pause; None: the scheduler is choosing among it)."""

    served: float
    backlogged: bool
    weight: int
    held_by: str | None = None
    # How many times a claim held it at its tenant's cap (``lanes.held_count``): moved
    # between two samples, it was held in the interval, however briefly.
    held_count: int = 0


@dataclass(frozen=True, slots=True)
class _Interval:
    start_s: float
    end_s: float
    # Per lane with anything in it: (served, entitled to be served).
    counts: dict[Lane, tuple[float, float]]
    # Per lane held at either end: seconds held, by what.
    held: dict[Lane, dict[str, float]]


class ShareWindow:
    """The last ``window_s`` of samples, as running sums per lane.  Kept as the stats
    view always kept it: the oldest interval starts at least ``window_s`` before the
    newest sample, so "the last minute" is never less than a minute once there is one."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: tuple[float, Mapping[Lane, LaneSample]] | None = None
        self._intervals: deque[_Interval] = deque()
        self._activated: dict[Lane, float] = {}
        self._entitled: dict[Lane, float] = {}
        self._held: dict[Lane, dict[str, float]] = {}
        # Per lane: how many kept intervals name it.  Its sums go when the last does (a
        # sum that reaches 0 while a later interval still names the lane stays).
        self._refs: dict[Lane, int] = {}

    def add(self, at_s: float, lanes: Mapping[Lane, LaneSample]) -> None:
        """A sample of every lane at ``at_s`` (monotonic seconds, increasing)."""
        if self._last is not None:
            start_s, before = self._last
            counts = interval(before, lanes)
            held = held_in(before, lanes, at_s - start_s)
            self._intervals.append(_Interval(start_s, at_s, counts, held))
            for lane, (a, e) in counts.items():
                self._activated[lane] = self._activated.get(lane, 0) + a
                self._entitled[lane] = self._entitled.get(lane, 0.0) + e
            for lane, by in held.items():
                sums = self._held.setdefault(lane, {})
                for reason, s in by.items():
                    sums[reason] = sums.get(reason, 0.0) + s
            for lane in counts.keys() | held.keys():
                self._refs[lane] = self._refs.get(lane, 0) + 1
        self._last = (at_s, lanes)
        # Keep the newest interval that began at least a window ago, not more.
        while len(self._intervals) > 1 and self._intervals[0].end_s <= at_s - self.window_s:
            self._forget(self._intervals.popleft())

    def _forget(self, old: _Interval) -> None:
        for lane, (a, e) in old.counts.items():
            self._activated[lane] -= a
            self._entitled[lane] = max(0.0, self._entitled[lane] - e)
        for lane, by in old.held.items():
            sums = self._held[lane]
            for reason, s in by.items():
                sums[reason] = max(0.0, sums[reason] - s)
        for lane in old.counts.keys() | old.held.keys():
            self._refs[lane] -= 1
            if self._refs[lane] == 0:
                del self._refs[lane]
                self._activated.pop(lane, None)
                self._entitled.pop(lane, None)
                self._held.pop(lane, None)

    @property
    def latest_s(self) -> float | None:
        """The instant of the latest sample (None: none yet)."""
        return None if self._last is None else self._last[0]

    @property
    def span_s(self) -> float:
        """How long the window covers now (0 until two samples were taken)."""
        if not self._intervals:
            return 0.0
        return self._intervals[-1].end_s - self._intervals[0].start_s

    def activated(self, lane: Lane) -> int:
        """What the lane was served in the window (activations: fed activation counts),
        rounded."""
        return round(self._activated.get(lane, 0))

    def entitled(self, lane: Lane) -> float:
        """The activations the lane was entitled to in the window."""
        return self._entitled.get(lane, 0.0)

    def held(self, lane: Lane) -> dict[str, float]:
        """What held the lane back in the window, each with the fraction of the window
        it held it (0 to 1; empty: nothing did)."""
        span = self.span_s
        if not span:
            return {}
        return {
            reason: min(1.0, s / span) for reason, s in self._held.get(lane, {}).items() if s > 1e-9
        }

    def lanes(self) -> list[Lane]:
        """The lanes with activations or an entitlement in the window, then those held
        in it."""
        return [
            lane
            for lane in self._refs
            if self._activated.get(lane, 0) > 1e-9
            or self._entitled.get(lane, 0) > 1e-9
            or any(s > 1e-9 for s in self._held.get(lane, {}).values())
        ]

    def shares(
        self, among: Callable[[Lane], bool] | None = None
    ) -> dict[Lane, tuple[float, float]]:
        """Per lane in the window: (realised, entitled) shares of its type's activations;
        with ``among``, of those of the lanes it admits alone (each share renormalised
        over them)."""
        made: dict[str, float] = {}
        owed: dict[str, float] = {}
        lanes = [lane for lane in self._activated if among is None or among(lane)]
        for lane in lanes:
            made[lane[0]] = made.get(lane[0], 0.0) + self._activated[lane]
            owed[lane[0]] = owed.get(lane[0], 0.0) + self._entitled[lane]
        out = {}
        for lane in lanes:
            a, e = made[lane[0]], owed[lane[0]]
            out[lane] = (
                self._activated[lane] / a if a else 0.0,
                self._entitled[lane] / e if e else 0.0,
            )
        return out


def interval(
    before: Mapping[Lane, LaneSample], after: Mapping[Lane, LaneSample]
) -> dict[Lane, tuple[float, float]]:
    """Per lane, between two samples: (activations, entitled activations), for the
    lanes with either (see the module's docstring)."""
    by_type: dict[str, list[_Member]] = {}
    made: dict[str, float] = {}
    for lane, now in after.items():
        then = before.get(lane)
        # A lane first seen now was made in the interval, its count from 0.
        a = max(0.0, now.served - (then.served if then else 0.0))
        if a or now.backlogged or (then is not None and then.backlogged):
            # It could take no more than it took: held back (at either end, or by a hold
            # in between), or out of jobs at the end (it was given all it had).
            held = (
                now.held_by is not None
                or (then is not None and then.held_by is not None)
                or (then is not None and now.held_count > then.held_count)
                or not now.backlogged
            )
            by_type.setdefault(lane[0], []).append(_Member(lane, a, now.weight, held))
            made[lane[0]] = made.get(lane[0], 0.0) + a
    out: dict[Lane, tuple[float, float]] = {}
    for job_type, members in by_type.items():
        total = made[job_type]
        if not total:
            continue  # nothing made: nobody was owed anything
        owed = water_fill(total, members)
        for m in members:
            out[m.lane] = (m.served, owed.get(m.lane, 0.0))
    return out


class _Member(NamedTuple):
    lane: Lane
    served: float
    weight: int
    held: bool  # held back at either end of the interval: could take no more than it did


def water_fill(total: float, members: Sequence[_Member]) -> dict[Lane, float]:
    """``total`` shared by weight, a held member given no more than it got: it keeps what
    it got, and the rest is shared again among the others, until no held member is
    offered more than it got."""
    owed: dict[Lane, float] = {}
    left, open_ = total, list(members)
    while open_:
        weights = sum(m.weight for m in open_)
        if weights <= 0:
            break
        short = [m for m in open_ if m.held and m.served < left * m.weight / weights]
        if not short:
            for m in open_:
                owed[m.lane] = left * m.weight / weights
            break
        for m in short:
            owed[m.lane] = m.served
            left -= m.served
        open_ = [m for m in open_ if m not in short]
    return owed


def held_in(
    before: Mapping[Lane, LaneSample], after: Mapping[Lane, LaneSample], span_s: float
) -> dict[Lane, dict[str, float]]:
    """Per lane held in an interval of ``span_s``: the seconds it was held, by what --
    half the interval for each end it was held at, or the whole of it at its tenant's cap
    when a claim held it there in between (its ``held_count`` moved: the cap held it
    back in the interval's rounds, however briefly each time)."""
    out: dict[Lane, dict[str, float]] = {}
    for samples in (before, after):
        for lane, s in samples.items():
            if s.held_by is not None and s.backlogged:
                by = out.setdefault(lane, {})
                by[s.held_by] = by.get(s.held_by, 0.0) + span_s / 2
    for lane, s in after.items():
        then = before.get(lane)
        if then is not None and s.held_count > then.held_count:
            out[lane] = {CAP_HELD: span_s}
    return out


CAP_HELD = "tenantCap"  # what a claim's hold (lanes.held_count) is: its tenant's cap


class Throughput:
    """Each job type's activations per minute over the last ``minutes`` (the dashboard's
    time series), from samples of the types' running totals (the sums of their lanes'
    ``activated_total``, shared by every replica) kept in this process.  Pure: it is
    given the instants.  A minute that ended before this process's first sample is None,
    not 0; the minute that sample fell in counts from it."""

    def __init__(self, minutes: int = 15) -> None:
        self.minutes = minutes
        self.samples: deque[tuple[float, Mapping[str, int]]] = deque()

    def add(self, at: float, totals: Mapping[str, int]) -> None:
        self.samples.append((at, totals))
        # Keep one sample at or before the oldest minute's start, for its baseline.
        horizon = at - self.minutes * 60.0
        while len(self.samples) > 2 and self.samples[1][0] <= horizon:
            self.samples.popleft()

    def per_minute(self, now: float) -> dict[str, list[int | None]]:
        """Per job type, the activations of each of the last ``minutes`` minutes, oldest
        first, the last one ending at ``now``."""
        times = [at for at, _ in self.samples]
        bounds = [now - (self.minutes - i) * 60.0 for i in range(self.minutes + 1)]
        # The latest sample at or before each bound (None before the first sample).
        at_bound = [bisect.bisect_right(times, b) - 1 for b in bounds]
        types = {t for _, totals in self.samples for t in totals}
        series: dict[str, list[int | None]] = {}
        for job_type in types:
            values = [None if i < 0 else self.samples[i][1].get(job_type, 0) for i in at_bound]
            # The minute this process's first sample fell in counts from that sample.
            first = self.samples[0][1].get(job_type, 0) if self.samples else 0
            series[job_type] = [
                None if b is None else max(0, b - (first if a is None else a))
                for a, b in zip(values, values[1:], strict=False)
            ]
        return series


# -- the second level (ADR 027): fairness keys inside their lanes --------------------------

OTHER_KEYS = "<other>"  # every key of a lane without a row of its own (not a key's name)


class KeySample(NamedTuple):
    """One fairness key at one sample: its running count of what it was served
    (``lane_keys.activated_total``, or ``units_total``: as LaneSample's), whether it is
    backlogged (active), its virtual time inside its lane and its weight."""

    served: float
    backlogged: bool
    vtime: float
    weight: int


class LaneKeys(NamedTuple):
    """A lane's keys at one sample: the lane's running count of what it was served, the total
    weight of its backlogged keys and the least of their virtual times (None: none is
    backlogged), and the keys sampled by name (the most active; ``KeyWindow``)."""

    served: float
    backlogged_weight: int
    least_vtime: float | None
    keys: dict[str, KeySample]


@dataclass(frozen=True, slots=True)
class KeyShare:
    """A key's place in its lane over the window: its activations, its realised and
    entitled shares of its lane's, and (backlogged keys only) its virtual time minus the
    least of its lane's backlogged keys' (0: served next)."""

    key: str
    activated: int
    realized: float
    entitled: float
    weight: int
    vtime_lag: float | None


def key_interval(before: LaneKeys | None, after: LaneKeys) -> dict[str, tuple[float, float]]:
    """One lane's keys between two samples: per key sampled at both (activations,
    entitled activations), and the rest under OTHER_KEYS.  A key sampled now but not
    before is counted from its next interval (its count so far is not this interval's),
    unless the lane itself is new.  A key is owed a share when it was backlogged at either
    end or was activated; the weight it competed against is the lane's backlogged weight,
    the keys not sampled counted at the larger of the two ends."""
    made = after.served - (before.served if before else 0.0)
    if made <= 0:
        return {}
    counted: dict[str, tuple[float, int]] = {}  # key -> (served, weight if owed else 0)
    for key, now in after.keys.items():
        then = before.keys.get(key) if before else None
        if before is not None and then is None:
            continue
        a = max(0.0, now.served - (then.served if then else 0.0))
        owed = a > 0 or now.backlogged or (then is not None and then.backlogged)
        counted[key] = (a, now.weight if owed else 0)
    other_a = max(0.0, made - sum(a for a, _ in counted.values()))

    def untracked_weight(s: LaneKeys | None) -> int:
        if s is None:
            return 0
        tracked = sum(k.weight for name, k in s.keys.items() if k.backlogged and name in counted)
        return max(0, s.backlogged_weight - tracked)

    other_w = max(untracked_weight(before), untracked_weight(after))
    if other_a and not other_w:
        other_w = 1  # keys activated, yet seen backlogged at neither end: weight unknown
    total_w = sum(w for _, w in counted.values()) + other_w
    out = {key: (a, made * w / total_w if total_w else 0.0) for key, (a, w) in counted.items()}
    if other_a or other_w:
        out[OTHER_KEYS] = (other_a, made * other_w / total_w if total_w else 0.0)
    return out


class KeyWindow:
    """The last ``window_s`` of key samples, per lane: ShareWindow one level down.  Each
    sample reads, per lane, the ``top`` keys most active in the window (``tracked``: what
    the next sample should read by name) and, for keys new to it, the most active ever;
    every other key is folded into OTHER_KEYS.  Pure: it is given samples and instants."""

    def __init__(self, window_s: float, top: int) -> None:
        self.window_s = window_s
        self.top = top
        self._last: tuple[float, Mapping[Lane, LaneKeys]] | None = None
        self._intervals: deque[tuple[float, float, dict[Lane, dict[str, tuple[float, float]]]]]
        self._intervals = deque()
        self._sums: dict[Lane, dict[str, list[float]]] = {}
        # Per lane and key: how many kept intervals name it (its sums go with the last).
        self._refs: dict[Lane, dict[str, int]] = {}

    def add(self, at_s: float, lanes: Mapping[Lane, LaneKeys]) -> None:
        """A sample of every lane's keys at ``at_s`` (monotonic seconds, increasing)."""
        if self._last is not None:
            start_s, before = self._last
            counts = {lane: key_interval(before.get(lane), now) for lane, now in lanes.items()}
            counts = {lane: c for lane, c in counts.items() if c}
            self._intervals.append((start_s, at_s, counts))
            for lane, per_key in counts.items():
                sums = self._sums.setdefault(lane, {})
                refs = self._refs.setdefault(lane, {})
                for key, (a, e) in per_key.items():
                    got = sums.setdefault(key, [0.0, 0.0])
                    got[0] += a
                    got[1] += e
                    refs[key] = refs.get(key, 0) + 1
        self._last = (at_s, lanes)
        while len(self._intervals) > 1 and self._intervals[0][1] <= at_s - self.window_s:
            _, _, old = self._intervals.popleft()
            for lane, per_key in old.items():
                sums, refs = self._sums[lane], self._refs[lane]
                for key, (a, e) in per_key.items():
                    got = sums[key]
                    got[0] -= a
                    got[1] = max(0.0, got[1] - e)
                    refs[key] -= 1
                    if refs[key] == 0:
                        del sums[key], refs[key]
                if not sums:
                    del self._sums[lane], self._refs[lane]

    def tracked(self) -> dict[Lane, list[str]]:
        """Per lane, the keys the next sample should read by name: the ``top`` most
        active in the window (OTHER_KEYS aside)."""
        out = {}
        for lane, sums in self._sums.items():
            ranked = sorted((k for k in sums if k != OTHER_KEYS), key=lambda k: (-sums[k][0], k))
            out[lane] = ranked[: self.top]
        return out

    def shares(self, lane: Lane, order: Sequence[str] | None = None) -> list[KeyShare]:
        """The lane's keys over the window, the most active first (at most ``top``, then
        OTHER_KEYS if anything was folded into it); with ``order``, those keys listed in
        that order and every other folded (another window's listing, so that shares of
        units line up with the keys listed by activations)."""
        sums = self._sums.get(lane, {})
        latest = self._last[1].get(lane) if self._last is not None else None
        made = sum(a for a, _ in sums.values())
        owed = sum(e for _, e in sums.values())
        names = [k for k in sums if k != OTHER_KEYS]
        if latest is not None:
            names += [k for k in latest.keys if k not in sums]
        names.sort(key=lambda k: (-(sums[k][0] if k in sums else 0), k))
        cut = self.top
        if order is not None:
            listed = [k for k in order if k != OTHER_KEYS]
            names = listed + [k for k in names if k not in set(listed)]
            cut = len(listed)
        out = []
        for key in names[:cut]:
            a, e = sums.get(key, (0.0, 0.0))
            sample = latest.keys.get(key) if latest is not None else None
            lag = None
            if sample is not None and sample.backlogged and latest is not None:
                lag = sample.vtime - (latest.least_vtime or sample.vtime)
            out.append(
                KeyShare(
                    key,
                    int(a),
                    a / made if made else 0.0,
                    e / owed if owed else 0.0,
                    sample.weight if sample is not None else 1,
                    lag,
                )
            )
        folded = [sums[k] for k in (*names[cut:], OTHER_KEYS) if k in sums]
        if folded:
            a = sum(x for x, _ in folded)
            e = sum(y for _, y in folded)
            out.append(
                KeyShare(
                    OTHER_KEYS,
                    int(a),
                    a / made if made else 0.0,
                    e / owed if owed else 0.0,
                    0,
                    None,
                )
            )
        return out
