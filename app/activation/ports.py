"""What comes into activation from outside it: the request, and the caller behind it.

``ActivateRequest`` is what a worker asked for, already parsed and scoped (the tenants a
key may activate for are resolved before it is made).  ``Caller`` is the small port the
HTTP layer fills for one request: whether it is still there, whether its key is still
live, what to note when it waits or gets jobs.  Nothing here knows HTTP, keys or the
database: the package reaches all three through this port and its store.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from app.db.rows import JobRow

# The tenants asked for, as a key: None for all, else sorted and hashable.
TenantFilter = tuple[str, ...] | None
# Callers activated together ask for at most this many jobs in all (one caller alone may
# ask for up to 1,000, the most maxJobs allows).
MAX_TOGETHER = 1000


@dataclass(frozen=True, slots=True)
class ActivateRequest:
    job_type: str
    max_jobs: int
    lease_ms: int
    worker: str | None = None
    tenant_ids: Sequence[str] | None = None
    via_stream: bool = False

    @property
    def tenant_filter(self) -> TenantFilter:
        """The tenants asked for, as a key: None for all, else sorted and hashable."""
        return None if self.tenant_ids is None else tuple(sorted(self.tenant_ids))


def take_together(reqs: Sequence[ActivateRequest]) -> list[bool]:
    """Of the callers waiting to be activated together (app.activation.rounds), in arrival
    order, those taken while their asks total at most MAX_TOGETHER jobs (the first
    always)."""
    chosen: list[bool] = []
    asked = 0
    for req in reqs:
        asked += req.max_jobs
        chosen.append(not chosen or (chosen[-1] and asked <= MAX_TOGETHER))
    return chosen


class Caller(Protocol):
    """One worker's request, as activation sees it (app.api.callers makes it from HTTP)."""

    def place(self) -> AbstractContextManager[None]:
        """Hold one of the key's waiter places while the caller waits or streams (raises
        the key's 429 when it has none left)."""

    def waits(self) -> None:
        """The caller waits from now on: no longer work in flight (app.admission)."""

    async def gone(self) -> None:
        """Return once the caller has gone away (a long poll watches this)."""

    async def is_gone(self) -> bool:
        """Whether the caller has gone away (a stream asks between its events)."""

    async def still_live(self) -> bool:
        """Whether the caller's key still holds (False: revoked while it waited)."""

    def seen(self, job_type: str, worker: str | None, activated: bool) -> None:
        """Note the worker as seen asking for ``job_type`` (and whether it got jobs)."""

    def received(self, rows: Sequence[JobRow]) -> None:
        """The jobs are the caller's now (a scoped key remembers them)."""
