"""The batching behind group commit and activating together (app.coalescing)."""

from __future__ import annotations

import asyncio

import pytest

from app.coalescing import Coalescer


async def test_calls_arriving_while_a_batch_runs_go_into_the_next_one_together():
    batches: list[list[int]] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def run(items: list[int]) -> list[int]:
        batches.append(items)
        if len(batches) == 1:
            started.set()
            await release.wait()
        return [i * 10 for i in items]

    c: Coalescer[int, int] = Coalescer(run, lambda items: [True] * len(items))
    first = asyncio.ensure_future(c.submit(1))
    await started.wait()  # the runner started the first batch at once, alone
    later = [asyncio.ensure_future(c.submit(i)) for i in (2, 3, 4)]
    # They queue (they were scheduled first) before the runner resumes.
    release.set()
    assert await first == 10
    assert await asyncio.gather(*later) == [20, 30, 40]
    assert batches == [[1], [2, 3, 4]]
    assert c.idle


async def test_items_not_taken_wait_for_a_later_batch_in_order():
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        batches.append(items)
        return items

    def odd_or_first(items):  # takes the first item, and then odd ones only
        return [k == 0 or i % 2 == 1 for k, i in enumerate(items)]

    c: Coalescer[int, int] = Coalescer(run, odd_or_first)
    assert await asyncio.gather(*(c.submit(i) for i in (2, 4, 5, 6))) == [2, 4, 5, 6]
    assert batches == [[2, 5], [4], [6]]


async def test_a_failed_batch_fails_each_caller_in_it_and_not_the_next():
    calls = 0

    async def run(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionResetError("gone")
        return items

    c: Coalescer[int, int] = Coalescer(run, lambda items: [True] * len(items))
    results = await asyncio.gather(c.submit(1), c.submit(2), return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionResetError] * 2
    assert await c.submit(3) == 3


async def test_a_caller_cancelled_while_its_batch_runs_has_its_result_given_up():
    started, release = asyncio.Event(), asyncio.Event()
    given_up: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        started.set()
        await release.wait()
        return items

    c: Coalescer[int, int] = Coalescer(
        run, lambda items: [True] * len(items), unwanted=given_up.append
    )
    stay = asyncio.ensure_future(c.submit(1))
    leave = asyncio.ensure_future(c.submit(2))
    await started.wait()
    leave.cancel()
    release.set()
    assert await stay == 1
    with pytest.raises(asyncio.CancelledError):
        await leave
    assert given_up == [[2]]
