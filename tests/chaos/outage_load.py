"""A producer-and-workers load against a ``jobfair serve`` whose database fails under it,
and the tally that says what became of every job.

Producers create jobs with idempotency keys, so that any failed creation may be sent
again, as a careful client does; workers activate and complete, retrying a finish call
(fenced by its ``activationCount``) until some answer comes.  A keeper restarts the
server if it exits, as a process manager would, and counts the restarts: a server that
survives the outage needs none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx

from tests.fixtures import ServerProcess

JOB_TYPE = "outage-load"
LEASE_MS = 3_000


@dataclass
class Tally:
    created: int  # acknowledged creations (distinct jobs)
    completed_once: int
    lost: int  # acknowledged but gone, or never completed
    finished_twice: int
    activated_past_deadline: int
    restarts: int
    extra_rows: int  # rows nobody was told about (a creation done twice)
    answered_500: int  # calls answered as a bug would be

    def row(self) -> str:
        return (
            f"created {self.created}, completed once {self.completed_once}, lost {self.lost}, "
            f"finished twice {self.finished_twice}, ACTIVATED past deadline "
            f"{self.activated_past_deadline}, server restarts {self.restarts}, "
            f"extra rows {self.extra_rows}, answered 500 {self.answered_500}"
        )


@dataclass
class Load:
    spawn: Callable[[], ServerProcess]
    database_url: Callable[[], str]  # where to read the outcome from
    jobs: int = 400
    producers: int = 2
    workers: int = 4
    server: ServerProcess | None = None
    restarts: int = 0
    acknowledged: set[str] = field(default_factory=set)
    outcomes: list[tuple[str, int, int]] = field(default_factory=list)
    answered_500: int = 0
    _issued: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    async def call(self, c: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
        """Sent until it is answered other than 5xx (every call here is safe to repeat)."""
        while True:
            try:
                r = await c.post(self.url + path, json=body)
                if r.status_code < 500:
                    return r
                self.answered_500 += r.status_code == 500
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)

    async def _keeper(self) -> None:
        while not self._stop.is_set():
            assert self.server is not None
            if self.server.proc.poll() is not None:
                self.restarts += 1
                self.server = self.spawn()
            await asyncio.sleep(0.1)

    async def _producer(self, c: httpx.AsyncClient, i: int) -> None:
        while self._issued < self.jobs:
            n = self._issued
            self._issued += 1
            body = {"type": JOB_TYPE, "idempotencyKey": f"p{i}-{n}", "variables": {"n": n}}
            r = await self.call(c, "/v2/jobs", body)
            assert r.status_code in (200, 201), r.text
            self.acknowledged.add(r.json()["jobKey"])
            async with self._progress:
                self._progress.notify_all()

    async def until_acknowledged(self, n: int, timeout_s: float = 60) -> None:
        """Until ``n`` creations (at most all of them) have been acknowledged."""
        n = min(n, self.jobs)
        async with self._progress:
            await asyncio.wait_for(
                self._progress.wait_for(lambda: len(self.acknowledged) >= n), timeout_s
            )

    async def _worker(self, c: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            body = {"type": JOB_TYPE, "maxJobs": 10, "timeout": LEASE_MS, "requestTimeout": 500}
            r = await self.call(c, "/v2/jobs/activate", body)
            assert r.status_code == 200, r.text
            for job in r.json()["jobs"]:
                count = job["activationCount"]
                path = f"/v2/jobs/{job['jobKey']}/complete"
                done = await self.call(c, path, {"activationCount": count})
                self.outcomes.append((job["jobKey"], count, done.status_code))

    async def run(
        self,
        fault: Callable[[Load], Awaitable[None]],
        *,
        settle_s: float = 90,
    ) -> Tally:
        """Start the load, run ``fault`` once a third of the jobs are created, finish
        creating them, and wait (up to ``settle_s``) until every job is completed."""
        self.server = self.spawn()
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(timeout=30, limits=limits) as c:
            await self.until_ready(c)
            keeper = asyncio.create_task(self._keeper())
            producers = [asyncio.create_task(self._producer(c, i)) for i in range(self.producers)]
            workers = [asyncio.create_task(self._worker(c)) for _ in range(self.workers)]
            tasks = [keeper, *producers, *workers]
            try:
                await self.until_acknowledged(self.jobs // 3)
                await fault(self)
                await asyncio.gather(*producers)
                await self.until_ready(c)
                deadline = time.monotonic() + settle_s
                while await self._completed() < len(self.acknowledged):
                    _raise_failures(tasks)
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
            finally:
                self._stop.set()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return await self.tally()

    async def until_ready(self, c: httpx.AsyncClient, timeout_s: float = 60) -> None:
        """Polls /readyz (another process: no event to wait on) with a deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await c.get(self.url + "/readyz")).status_code == 200:
                    return
            assert time.monotonic() < deadline, "not ready in time"
            await asyncio.sleep(0.1)

    async def _query(self, sql: str) -> Any:
        conn = await asyncpg.connect(self.database_url())
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    async def _completed(self) -> int:
        rows = await self._query(
            f"SELECT count(*) FROM jobs WHERE job_type = '{JOB_TYPE}' AND state = 'COMPLETED'"
        )
        return int(rows[0][0])

    async def tally(self) -> Tally:
        rows = await self._query(
            f"SELECT job_key::text, state, deadline < now() AS late FROM jobs "
            f"WHERE job_type = '{JOB_TYPE}'"
        )
        state = {r[0]: (r[1], r[2]) for r in rows}
        accepted = Counter(key for key, _, status in self.outcomes if status == 204)
        twice = sum(1 for n in accepted.values() if n > 1)
        completed = {k for k, (s, _) in state.items() if s == "COMPLETED"}
        lost = sum(1 for k in self.acknowledged if k not in completed)
        return Tally(
            created=len(self.acknowledged),
            completed_once=len(completed & self.acknowledged) - twice,
            lost=lost,
            finished_twice=twice,
            activated_past_deadline=sum(
                1 for s, late in state.values() if s == "ACTIVATED" and late
            ),
            restarts=self.restarts,
            extra_rows=len(set(state) - self.acknowledged),
            answered_500=self.answered_500,
        )


def _raise_failures(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
