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


class Refused(ValueError):
    """A value of one caller's that the shared statement could not take."""


async def test_a_batch_failed_by_one_callers_part_fails_that_caller_alone():
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        batches.append(items)
        if 7 in items or 13 in items:
            raise Refused(f"cannot take {items}")
        return [i * 10 for i in items]

    c: Coalescer[int, int] = Coalescer(
        run, lambda items: [True] * len(items), split=lambda exc: isinstance(exc, Refused)
    )
    results = await asyncio.gather(*(c.submit(i) for i in range(32)), return_exceptions=True)
    assert [type(r) for r in results if isinstance(r, Exception)] == [Refused, Refused]
    assert isinstance(results[7], Refused) and isinstance(results[13], Refused)
    assert [r for r in results if not isinstance(r, Exception)] == [
        i * 10 for i in range(32) if i not in (7, 13)
    ]
    # Bisected, not one run per caller: the first batch, then halves down to each culprit.
    assert batches[0] == list(range(32)) and len(batches) <= 1 + 2 * 2 * 5
    # The halves ran in arrival order.
    served = [i for b in batches if 7 not in b and 13 not in b for i in b]
    assert served == sorted(served)


async def test_a_batch_failed_otherwise_is_not_split():
    runs = 0

    async def run(items: list[int]) -> list[int]:
        nonlocal runs
        runs += 1
        raise ConnectionResetError("gone")

    c: Coalescer[int, int] = Coalescer(
        run, lambda items: [True] * len(items), split=lambda exc: isinstance(exc, Refused)
    )
    results = await asyncio.gather(*(c.submit(i) for i in range(8)), return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionResetError] * 8
    assert runs == 1


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
