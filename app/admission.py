"""Admission: at most ``max_in_flight`` requests worked on at once in a server process; the
next is answered 503 with ``Retry-After`` before its body is read.

A server that admits every request past its capacity shares its CPU among all of them:
each await of each request goes to the back of an event loop's queue as long as the
number admitted, so every request gets slower for as long as the overload lasts, and
the requests sent after it wait behind all it admitted.  No other bound catches that:
the pool's acquire timeout bounds the wait for a connection, not the wait for the CPU.
Bounding what is worked on at once bounds an admitted request's latency; the excess
costs the server its head's parsing and a short answer, and the server is back to
normal as soon as the overload ends (bench.load_shed and tests/chaos/test_load_shed.py measure it).

Not work, and not counted: a long poll or a stream once it waits for jobs
(``JOBFAIR_MAX_WAITERS`` bounds those), and the probes and /metrics, which must answer
during an overload most of all.  Counted but never refused: a job's finish (complete,
fail, error).  It ends work the server has handed out; refused, the job would come back
at its lease's end, to be done again.  Finishes are bounded by the activations admitted.
"""

from __future__ import annotations

from starlette.types import Scope

from app.errors import Overloaded

# The scope key of an admitted request's place (an object, so that the place is left
# once even from a copy of the scope).
ADMITTED = "jobfair.admitted"
# Cheap, and needed most when the server is overloaded: a load balancer that stops
# hearing from a busy server takes it out, and its load moves to the others.
EXEMPT = frozenset({"/healthz", "/readyz", "/metrics"})
# The last segment of a finish's path, POST /v2/jobs/{jobKey}/<this> (both surfaces), or
# the batch of completes, POST /v2/jobs/complete.
FINISHES = frozenset({"complete", "fail", "error", "completion", "failure"})


class _Place:
    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = True


class Admission:
    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight  # 0: no bound
        self.in_flight = 0

    def enter(self, scope: Scope) -> None:
        """Count the request in, or raise Overloaded (503) if the process is full."""
        path = scope["path"]
        if not self.max_in_flight or path in EXEMPT:
            return
        if self.in_flight >= self.max_in_flight and not _finishes(scope["method"], path):
            raise Overloaded(
                f"{self.max_in_flight} requests are being worked on in this process already",
                retry_after_s=1,
            )
        self.in_flight += 1
        scope[ADMITTED] = _Place()

    def leave(self, scope: Scope) -> None:
        """The request is done, or now waits for jobs: out of the count (once)."""
        place = scope.get(ADMITTED)
        if place is not None and place.held:
            place.held = False
            self.in_flight -= 1


def _finishes(method: str, path: str) -> bool:
    return (
        method == "POST"
        and path.startswith("/v2/jobs/")
        and path[path.rfind("/") + 1 :] in FINISHES
    )
