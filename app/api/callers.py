"""A worker's HTTP request as activation's ``Caller`` port (app.activation.ports): its
key's waiter places and liveness, its connection, the worker sightings."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from fastapi import Request

from app.api import context, security
from app.db.rows import JobRow
from app.domain import utcnow


class HttpCaller:
    def __init__(self, request: Request) -> None:
        self.request = request
        self.principal = security.principal(request)
        self.services = context.services(request)

    def place(self) -> AbstractContextManager[None]:
        return self.services.limits.waiter(self.principal)

    def waits(self) -> None:
        self.request.app.admission.leave(self.request.scope)

    async def gone(self) -> None:
        # The body is read, so the next ASGI message is the client going away.
        while (await self.request.receive())["type"] != "http.disconnect":
            pass

    async def is_gone(self) -> bool:
        return await self.request.is_disconnected()

    async def still_live(self) -> bool:
        return await self.services.keys.still_live(self.principal)

    def seen(self, job_type: str, worker: str | None, activated: bool) -> None:
        self.services.workers.seen(job_type, worker, utcnow(), activated)

    def received(self, rows: Sequence[JobRow]) -> None:
        if self.principal.scoped and rows:
            self.services.keys.remember(rows)
