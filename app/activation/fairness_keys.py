"""One activation call's second level (ADR 027): the fairness keys of the lanes its
picks went to, read and divided (scheduler.split_among_keys), and the keys that came up
short, kept out of the call's later rounds and parked after it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from app.db.store import KeyCountAsk, KeysAsk, Store
from app.scheduler import Key, LaneKey, split_among_keys

# The capped keys one round locks and counts at most: each is an advisory lock, and
# PostgreSQL's lock table is shared by every session (max_locks_per_transaction x
# max_connections: 6,400 by default).  A call needing more takes them in further rounds.
KEY_LOCKS_PER_ROUND = 256
# Lanes read beyond maxJobs, to cover lanes that turn out empty or capped.
LANE_SLACK = 8
# A round that found lanes short or at their caps reads twice as many lanes in the next,
# up to this many: a call meeting thousands of tenants newly at their caps (each then held
# out of later reads, ADR 016) gets past them in tens of rounds, not hundreds.  Bounded
# because a capped round takes one cap lock per capped tenant read.
WIDEST_READ = 128


class KeysRead:
    """One call's second level (ADR 027): each round reads the keys of the lanes its
    picks went to and divides each lane's picks among them (scheduler.split_among_keys);
    keys that came up short (drained, or heads held by another activator) or were met
    empty are excluded from the call's later rounds and parked after it, as lanes are."""

    def __init__(self) -> None:
        self.exclude: set[LaneKey] = set()
        self.short: set[LaneKey] = set()  # to park after the call
        self.widen = 1
        self.counts: dict[LaneKey, int] = {}
        self.weights: dict[LaneKey, int] = {}
        self.caps: dict[LaneKey, int] = {}  # the own caps of the keys last read (ADR 040)
        self.room: dict[LaneKey, int] = {}  # the room of the keys last counted
        # The lanes of the latest read whose every active key not excluded was seen, and
        # none of which had a ready job.
        self.exhausted: set[str] = set()

    def emptied(self, keys: Sequence[LaneKey]) -> None:
        """Keys a carried charge found emptied: parked after the call."""
        self.short.update(keys)
        self.exclude.update(keys)

    async def read(
        self,
        store: Store,
        job_type: str,
        lane_counts: Mapping[str, int],
        owed: Mapping[LaneKey, tuple[int, float]] | None = None,
        probe: Sequence[str] = (),
    ) -> dict[str, list[Key]]:
        """The first keys of each lane given picks (read now, in ``store``: the capped
        claim's transaction, or the database), with ``owed`` key charges not yet written
        added (ADR 036), and each key's own cap in ``caps``; and whether the ``probe``
        lanes (the others read) have a ready key not held at its cap: a lane whose keys
        are all held is found in the same read as the others (``exhausted``), so a call
        gets past a thousand of them in a few rounds, not one a round (ADR 040)."""
        slack = LANE_SLACK * self.widen
        wants = {t: 1 for t in probe}
        wants.update({t: k + slack for t, k in lane_counts.items() if k > 0})
        read = await store.read_keys(KeysAsk(job_type, wants, sorted(self.exclude), owed))
        self.emptied(read.empty)
        ready = {t: [Key(k, v, w) for k, v, w, _ in found] for t, found in read.ready.items()}
        self.caps = {
            (t, k): cap
            for t, found in read.ready.items()
            for k, _, _, cap in found
            if cap is not None
        }
        self.weights = {(t, k.key): k.weight for t, found in ready.items() for k in found}
        self.exhausted = {t for t in wants if t not in ready and t not in read.more}
        return ready

    def capped(self, ready: Mapping[str, Sequence[Key]], per_key: int | None) -> list[LaneKey]:
        """The keys read that have a cap (their own, or the type's ``per_key``): a claim
        from them counts under their cap locks (ADR 040)."""
        return [
            (t, k.key)
            for t, found in ready.items()
            for k in found
            if per_key is not None or (t, k.key) in self.caps
        ]

    def split(
        self,
        lane_counts: Mapping[str, int],
        ready: Mapping[str, Sequence[Key]],
        room: Mapping[LaneKey, int] | None = None,
    ) -> dict[LaneKey, int]:
        """Each lane's picks divided among the keys read for it, each key at most its
        ``room`` (counted under its cap lock; absent: no cap)."""
        if room:
            ready = {
                t: [replace(k, headroom=room.get((t, k.key))) for k in found]
                for t, found in ready.items()
            }
        self.counts = split_among_keys(lane_counts, ready)
        return self.counts

    async def split_counted(
        self,
        tx: Store,
        job_type: str,
        lane_counts: Mapping[str, int],
        owed: Mapping[LaneKey, tuple[int, float]] | None,
        per_key: int | None,
        lanes_read: Sequence[str] = (),
    ) -> dict[LaneKey, int]:
        """In a capped claim's transaction: the keys read, those with a cap (their own,
        or the type's ``per_key``) locked and counted (lock_and_count_keys, after the
        type's and the tenants' locks), and each lane's picks divided among its keys
        within their room (ADR 040).  Where keys have caps, every lane read is probed
        for a key not held (``read``'s ``probe``)."""
        keyed = per_key is not None or bool(self.caps) or bool(self.room)
        probe = [t for t in lanes_read if t not in lane_counts] if keyed else []
        ready = await self.read(tx, job_type, lane_counts, owed, probe)
        capped = self.capped(ready, per_key)
        counted = _first_of_each(capped, KEY_LOCKS_PER_ROUND)
        self.room = (
            await tx.lock_and_count_keys(KeyCountAsk(job_type, counted, per_key)) if counted else {}
        )
        # Capped keys past the round's bound get nothing this round (not held, not
        # excluded: a later round of the call counts them).
        room = {**dict.fromkeys(capped, 0), **self.room}
        return self.split(lane_counts, ready, room)

    async def hold_full(self, tx: Store, job_type: str, claimed: Mapping[LaneKey, int]) -> None:
        """After the claim, before its locks go: the counted keys it left at their caps
        held out of later key reads, and out of the call's later rounds (not parked:
        they have ready jobs)."""
        full = [k for k, room in self.room.items() if room <= claimed.get(k, 0)]
        if full:
            await tx.hold_keys(job_type, full)
            self.exclude.update(full)

    def claimed(self, per_key: Mapping[LaneKey, int]) -> None:
        """After the claim: the keys that came up short are out of the call (and parked if
        empty); the next read of keys reads further."""
        came_short = {tk for tk, k in self.counts.items() if per_key.get(tk, 0) < k}
        self.short |= came_short
        self.exclude |= came_short
        if came_short:
            self.widen = min(self.widen * 2, WIDEST_READ // LANE_SLACK)


def _first_of_each(keys: Sequence[LaneKey], n: int) -> list[LaneKey]:
    """At most ``n`` of ``keys`` (in each lane's read order), taken a lane at a time in
    turn: every lane read keeps its first keys."""
    if len(keys) <= n:
        return list(keys)
    by_lane: dict[str, list[LaneKey]] = {}
    for tk in keys:
        by_lane.setdefault(tk[0], []).append(tk)
    out: list[LaneKey] = []
    depth = 0
    while len(out) < n:
        row = [lane[depth] for lane in by_lane.values() if depth < len(lane)]
        if not row:
            break
        out += row[: n - len(out)]
        depth += 1
    return out
