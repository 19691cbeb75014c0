"""Rate limits between rounds: when a bucket found used up gives its next token.

A capped round reads the buckets under the cap locks and trims by their whole tokens
(:func:`trim_to_caps`).  What it learns lasts beyond it: tokens only come with time
(other processes only take them), so a bucket found used up gives none before its next
token is due.  :class:`Rests` remembers those instants, so that later rounds give its
lanes nothing without locking and reading the bucket, and waiters that a round left
without jobs wake when a token is due (ADR 028).  The clock is passed in: seconds of a
monotonic clock (``at``), as the caller reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from app.scheduler.stride import Bucket

# A bucket found used up is given nothing, without its lock and read, until its next
# token is due, or for this long at most: a limit raised meanwhile (a new full bucket)
# applies on this process within this time.
RESTING_AT_MOST_S = 1.0


@dataclass(frozen=True, slots=True)
class Buckets:
    """A rate-limited claim's buckets as read: the database's instant, the type's (None:
    no limit) and each limited tenant's."""

    now: datetime
    job_type: Bucket | None
    tenants: dict[str, Bucket]

    def type_tokens(self) -> int | None:
        return None if self.job_type is None else self.job_type.room(self.now)

    def tenant_tokens(self) -> dict[str, int]:
        return {t: b.room(self.now) for t, b in self.tenants.items()}


class Rests:
    """The buckets of one process found used up, and when waiters are owed a look."""

    def __init__(self, at_most_s: float = RESTING_AT_MOST_S) -> None:
        self.at_most_s = at_most_s
        # Until when a bucket found used up gives no token: a tenant's ("", tenant) or a
        # job type's (type, None).  Bounded by the tenants and types limited; an entry
        # past its instant is merely ignored.
        self._resting: dict[tuple[str, str | None], float] = {}
        # Per job type, when the earliest bucket a round used up gives its next token.
        self._token_due: dict[str, float] = {}

    def type_rests_until(self, job_type: str, at: float) -> float | None:
        """Until when the type's bucket gives no token (None: it may give one at ``at``);
        waiters are owed a look then."""
        until = self._resting.get((job_type, None), 0.0)
        if until <= at:
            return None
        self._owe_token(job_type, until)
        return until

    def resting_tenants(self, job_type: str, limited: Iterable[str], at: float) -> set[str]:
        """Of the rate-limited tenants ``limited``, those whose buckets give no token at
        ``at``: given nothing (and lifted) without their locks, as if read empty."""
        resting = {t for t in limited if self._resting.get(("", t), 0.0) > at}
        if resting:
            self._owe_token(job_type, min(self._resting[("", t)] for t in resting))
        return resting

    def used_up(
        self,
        job_type: str,
        buckets: Buckets,
        rate_out: Iterable[str],
        taken: Mapping[str, int],
        total: int,
        at: float,
    ) -> None:
        """A round took ``taken`` jobs per tenant (``total`` in all) and left the tenants
        ``rate_out`` out of tokens: remember when their buckets, and the type's if it is
        used up, give their next token (at most ``at_most_s`` from ``at``, so that a
        limit raised meanwhile applies soon)."""
        now = buckets.now
        waits = []
        for tenant in rate_out:
            bucket = buckets.tenants.get(tenant)
            if bucket is not None:
                wait_s = bucket.take(taken.get(tenant, 0), now).next_token_s(now)
                self._resting[("", tenant)] = at + min(wait_s, self.at_most_s)
                waits.append(wait_s)
        if buckets.job_type is not None:
            after = buckets.job_type.take(total, now)
            if after.room(now) == 0:
                wait_s = after.next_token_s(now)
                self._resting[(job_type, None)] = at + min(wait_s, self.at_most_s)
                waits.append(wait_s)
        if waits:
            self._owe_token(job_type, at + min(waits))

    def _owe_token(self, job_type: str, due: float) -> None:
        """Waiters of ``job_type`` that a round left without jobs are owed a look at
        ``due``, when a bucket that held them back gives a token.  Every such round
        records it: ``token_due`` forgets an instant once it has passed."""
        self._token_due[job_type] = min(due, self._token_due.get(job_type, due))

    def token_due(self, job_type: str, at: float) -> float | None:
        """Seconds from ``at`` until the earliest bucket a round of ``job_type`` found
        used up gives its next token (None: none was); 0 once it is due."""
        due = self._token_due.get(job_type)
        if due is None:
            return None
        left = due - at
        if left <= 0:
            del self._token_due[job_type]
            return 0.0
        return left
