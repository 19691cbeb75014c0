"""Fairness measured: each lane's realised share of its job type's activations over a
sliding window, against the share it was entitled to.  Pure: it is given samples of the
lanes and their instants, and computes.

The entitlement is computed per interval between two samples, then summed over the
window: in an interval where a job type made ``A`` activations, a lane backlogged in it
was entitled to ``A * weight / W`` of them, ``W`` the weights of the type's lanes
backlogged in it.  A lane is backlogged in an interval when it was backlogged (active,
not held at a cap) at either end of it, or was activated in it.  So a tenant that joins
halfway through the window is entitled only to a share of the activations made after
it came, not of the window's; and over any window the entitled shares of a type add up
to 1, as the realised ones do.  ``realised / entitled`` is then exact for lanes
backlogged throughout, and errs, at the window's edges, by at most one interval's worth
of activations for the others.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

Lane = tuple[str, str]  # (job type, tenant)


class LaneSample(NamedTuple):
    """One lane at one sample: its running count of activations (``lanes.activated_total``),
    whether the scheduler was choosing among it (active and not held at a cap), and its
    tenant's weight."""

    activated_total: int
    backlogged: bool
    weight: int


@dataclass(frozen=True, slots=True)
class _Interval:
    start_s: float
    end_s: float
    # Per lane with anything in it: (activations, entitled activations).
    counts: dict[Lane, tuple[int, float]]


class ShareWindow:
    """The last ``window_s`` of samples, as running sums per lane.  Kept as the stats
    view always kept it: the oldest interval starts at least ``window_s`` before the
    newest sample, so "the last minute" is never less than a minute once there is one."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: tuple[float, Mapping[Lane, LaneSample]] | None = None
        self._intervals: deque[_Interval] = deque()
        self._activated: dict[Lane, int] = {}
        self._entitled: dict[Lane, float] = {}

    def add(self, at_s: float, lanes: Mapping[Lane, LaneSample]) -> None:
        """A sample of every lane at ``at_s`` (monotonic seconds, increasing)."""
        if self._last is not None:
            start_s, before = self._last
            counts = interval(before, lanes)
            self._intervals.append(_Interval(start_s, at_s, counts))
            for lane, (a, e) in counts.items():
                self._activated[lane] = self._activated.get(lane, 0) + a
                self._entitled[lane] = self._entitled.get(lane, 0.0) + e
        self._last = (at_s, lanes)
        # Keep the newest interval that began at least a window ago, not more.
        while len(self._intervals) > 1 and self._intervals[0].end_s <= at_s - self.window_s:
            old = self._intervals.popleft()
            for lane, (a, e) in old.counts.items():
                left_a = self._activated[lane] - a
                left_e = self._entitled[lane] - e
                if left_a == 0 and left_e < 1e-9:
                    del self._activated[lane], self._entitled[lane]
                else:
                    self._activated[lane], self._entitled[lane] = left_a, max(0.0, left_e)

    @property
    def span_s(self) -> float:
        """How long the window covers now (0 until two samples were taken)."""
        if not self._intervals:
            return 0.0
        return self._intervals[-1].end_s - self._intervals[0].start_s

    def activated(self, lane: Lane) -> int:
        """The lane's activations in the window."""
        return self._activated.get(lane, 0)

    def entitled(self, lane: Lane) -> float:
        """The activations the lane was entitled to in the window."""
        return self._entitled.get(lane, 0.0)

    def lanes(self) -> list[Lane]:
        """The lanes with activations or an entitlement in the window."""
        return list(self._activated)

    def shares(
        self, among: Callable[[Lane], bool] | None = None
    ) -> dict[Lane, tuple[float, float]]:
        """Per lane in the window: (realised, entitled) shares of its type's activations;
        with ``among``, of those of the lanes it admits alone (each share renormalised
        over them)."""
        made: dict[str, int] = {}
        owed: dict[str, float] = {}
        lanes = [lane for lane in self._activated if among is None or among(lane)]
        for lane in lanes:
            made[lane[0]] = made.get(lane[0], 0) + self._activated[lane]
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
) -> dict[Lane, tuple[int, float]]:
    """Per lane, between two samples: (activations, entitled activations), for the
    lanes with either (see the module's docstring)."""
    by_type: dict[str, list[tuple[Lane, int, int]]] = {}
    made: dict[str, int] = {}
    for lane, now in after.items():
        then = before.get(lane)
        # A lane first seen now was made in the interval, its count from 0.
        a = max(0, now.activated_total - (then.activated_total if then else 0))
        if a or now.backlogged or (then is not None and then.backlogged):
            by_type.setdefault(lane[0], []).append((lane, a, now.weight))
            made[lane[0]] = made.get(lane[0], 0) + a
    out: dict[Lane, tuple[int, float]] = {}
    for job_type, members in by_type.items():
        total = made[job_type]
        if not total:
            continue  # nothing made: nobody was owed anything
        weights = sum(w for _, _, w in members)
        for lane, a, w in members:
            out[lane] = (a, total * w / weights)
    return out


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
