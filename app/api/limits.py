"""What one key may hold in this process: its request rate and its waiter places."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from app.errors import TooManyRequests
from app.keys import Principal


class KeyLimits:
    """Per key, in this process: a token bucket of ``rate`` requests per second (0: none)
    with ``burst`` at most, and at most ``max_waiters`` long polls and streams held."""

    def __init__(self, rate: float, burst: int, max_waiters: int) -> None:
        self.rate = rate
        self.burst = burst
        self.max_waiters = max_waiters
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, at)
        self.waiting: dict[str, int] = {}

    def admit(self, caller: Principal) -> None:
        if self.rate <= 0 or caller.key_id is None:
            return
        now = time.monotonic()
        tokens, at = self._buckets.get(caller.key_id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens < 1:
            self._buckets[caller.key_id] = (tokens, now)
            wait_s = max(1, math.ceil((1 - tokens) / self.rate))
            raise TooManyRequests(
                f"this key is over its rate of {self.rate:g} requests per second",
                retry_after_s=wait_s,
            )
        self._buckets[caller.key_id] = (tokens - 1, now)

    @contextlib.contextmanager
    def waiter(self, caller: Principal) -> Iterator[None]:
        """Hold one of the key's waiter places while the block runs."""
        key = caller.key_id
        if key is None:
            yield
            return
        held = self.waiting.get(key, 0)
        if held >= self.max_waiters:
            raise TooManyRequests(
                f"this key holds {held} long polls and streams, its most", retry_after_s=1
            )
        self.waiting[key] = held + 1
        try:
            yield
        finally:
            left = self.waiting[key] - 1
            if left:
                self.waiting[key] = left
            else:
                del self.waiting[key]
