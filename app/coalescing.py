"""Calls that arrive while a batch of their kind runs go into the next batch together.

Where one statement (and one commit) can serve many callers as cheaply as one: single
completions (GroupCommit, ADR 006) and activations asked for at once (ADR 009).  The
first call starts a runner at once, so an idle server adds no wait; calls that arrive
while its batch runs queue, and the runner takes them into the next batch.  No timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

I = TypeVar("I")  # noqa: E741 -- an item, as R is a result
R = TypeVar("R")


class Coalescer(Generic[I, R]):
    """``run(items)`` answers a batch with one result per item, in order; a failure fails
    every caller in the batch, unless ``split(exc)`` says that one caller's part may
    have caused it (a value the database refused): then the batch is halved and each
    half run on its own, down to the caller whose part fails, which alone gets the
    error.  ``take(items)`` says, for the items waiting in arrival order, which go into
    the next batch (the others wait for a later one; it must take at least the first).
    A caller cancelled before its batch is left out of it; one cancelled while its batch
    runs has its result handed to ``unwanted``."""

    def __init__(
        self,
        run: Callable[[list[I]], Awaitable[Sequence[R]]],
        take: Callable[[Sequence[I]], list[bool]],
        *,
        unwanted: Callable[[list[R]], None] | None = None,
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]] = asyncio.ensure_future,
        split: Callable[[Exception], bool] = lambda exc: False,
    ) -> None:
        self._run = run
        self._take = take
        self._unwanted = unwanted
        self._spawn = spawn
        self._split = split
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[Any] | None = None
        # The event loop of the first call, which every later call shares (the app's).
        # Asking asyncio for it on every call costs a getpid system call each time on
        # Python 3.11, a visible share of the server's CPU in a drain of single
        # completions (py-spy).
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def idle(self) -> bool:
        return self._runner is None and not self._pending

    async def submit(self, item: I) -> R:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        answer: asyncio.Future[R] = self._loop.create_future()
        self._pending.append((item, answer))
        if self._runner is None:
            self._runner = self._spawn(self._drain())
        return await answer

    async def _drain(self) -> None:
        try:
            while self._pending:
                waiting = [entry for entry in self._pending if not entry[1].done()]
                chosen = self._take([item for item, _ in waiting]) if waiting else []
                batch = [entry for entry, yes in zip(waiting, chosen, strict=True) if yes]
                self._pending = [
                    entry for entry, yes in zip(waiting, chosen, strict=True) if not yes
                ]
                if batch:
                    await self._answer(batch)
        finally:
            self._runner = None

    async def _answer(self, batch: list[tuple[I, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1 and self._split(exc):
                # Bisect: k bad callers among n cost O(k log n) runs, and only after a
                # failure; the halves run in order, so earlier callers stay first.
                half = len(batch) // 2
                for part in (batch[:half], batch[half:]):
                    still = [entry for entry in part if not entry[1].done()]
                    if still:
                        await self._answer(still)
                return
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            return
        unwanted = []
        for (_, answer), result in zip(batch, results, strict=True):
            if answer.done():
                unwanted.append(result)
            else:
                answer.set_result(result)
        if unwanted and self._unwanted is not None:
            self._unwanted(unwanted)
