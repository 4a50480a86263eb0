"""The coalescing Batcher (app/service/coalesce.py) on its own: when calls share a statement, what each caller
gets back, and which failures are retried item by item (the errors a real PostgreSQL raises:
tests/service/test_coalesce.py)."""

from __future__ import annotations

import asyncio

import pytest

from app.core.errors import Invalid
from app.service.coalesce import Batcher

pytestmark = pytest.mark.anyio


class Statements:
    """A `run` that records the batches it was given and can be held open or made to fail."""

    def __init__(self, fail: dict[object, BaseException] | None = None) -> None:
        self.batches: list[list[object]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = fail or {}

    async def __call__(self, items: list[object]) -> list[object]:
        self.batches.append(list(items))
        await self.gate.wait()
        for item in items:
            if item in self.fail:
                raise self.fail[item]
        return [f"done {item}" for item in items]


async def started(statements: Statements, count: int) -> None:
    """Once `count` statements have started (a few turns of the loop at most)."""
    for _ in range(100):
        if len(statements.batches) >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(statements.batches)} statements started, not {count}")


async def test_an_idle_batcher_runs_a_call_at_once_alone():
    run = Statements()
    batcher = Batcher(run, concurrency=1)
    assert await batcher.submit("a") == "done a"
    assert run.batches == [["a"]]
    assert (batcher.waiting, batcher.in_flight) == (0, 0)


async def test_calls_arriving_while_busy_share_the_next_statement_each_with_its_own_result():
    run = Statements()
    batcher = Batcher(run, concurrency=1)
    run.gate.clear()
    first = asyncio.ensure_future(batcher.submit("a"))
    await started(run, 1)
    rest = [asyncio.ensure_future(batcher.submit(item)) for item in "bcde"]
    await asyncio.sleep(0)
    assert (batcher.waiting, batcher.in_flight) == (4, 1)
    run.gate.set()
    assert await first == "done a"
    assert await asyncio.gather(*rest) == ["done b", "done c", "done d", "done e"]
    assert run.batches == [["a"], ["b", "c", "d", "e"]]


async def test_a_shared_statement_holds_at_most_max_items_as_counted_by_size():
    run = Statements()
    batcher = Batcher(run, concurrency=1, max_items=5, size=len)
    run.gate.clear()
    calls = [asyncio.ensure_future(batcher.submit("x"))]
    await started(run, 1)
    calls += [asyncio.ensure_future(batcher.submit(item)) for item in ["aaa", "bb", "c", "dddddd", "e"]]
    run.gate.set()
    await asyncio.gather(*calls)
    # One item larger than max_items still runs, alone.
    assert run.batches == [["x"], ["aaa", "bb"], ["c"], ["dddddd"], ["e"]]


async def test_up_to_concurrency_statements_run_side_by_side():
    run = Statements()
    batcher = Batcher(run, concurrency=2)
    run.gate.clear()
    calls = []
    for count, item in enumerate("ab", 1):
        calls.append(asyncio.ensure_future(batcher.submit(item)))
        await started(run, count)
    calls.append(asyncio.ensure_future(batcher.submit("c")))
    await asyncio.sleep(0)
    assert (batcher.in_flight, batcher.waiting) == (2, 1) and run.batches == [["a"], ["b"]]
    run.gate.set()
    await asyncio.gather(*calls)
    assert run.batches == [["a"], ["b"], ["c"]]


async def test_a_refused_item_fails_only_its_own_call():
    run = Statements(fail={"bad": Invalid("no")})
    batcher = Batcher(run, concurrency=1)
    run.gate.clear()
    first = asyncio.ensure_future(batcher.submit("a"))
    await started(run, 1)
    shared = [asyncio.ensure_future(batcher.submit(item)) for item in ["b", "bad", "c"]]
    run.gate.set()
    results = await asyncio.gather(first, *shared, return_exceptions=True)
    assert results[:2] == ["done a", "done b"] and results[3] == "done c"
    assert isinstance(results[2], Invalid)
    assert run.batches == [["a"], ["b", "bad", "c"], ["b"], ["bad"], ["c"]]


async def test_an_error_that_proves_nothing_goes_to_every_caller_and_nothing_is_retried():
    lost = ConnectionResetError("connection lost after the statement was sent")
    run = Statements(fail={"b": lost})
    batcher = Batcher(run, concurrency=1)
    run.gate.clear()
    first = asyncio.ensure_future(batcher.submit("a"))
    await started(run, 1)
    shared = [asyncio.ensure_future(batcher.submit(item)) for item in "bc"]
    run.gate.set()
    results = await asyncio.gather(first, *shared, return_exceptions=True)
    assert results == ["done a", lost, lost]
    assert run.batches == [["a"], ["b", "c"]]
    # The batcher keeps serving after it.
    assert await batcher.submit("d") == "done d"


async def test_results_of_callers_gone_mid_statement_are_handed_to_orphaned():
    orphans: list[object] = []

    async def orphaned(results: list[object]) -> None:
        orphans.extend(results)

    run = Statements()
    batcher = Batcher(run, concurrency=1, orphaned=orphaned)
    run.gate.clear()
    kept, gone = asyncio.ensure_future(batcher.submit("a")), asyncio.ensure_future(batcher.submit("b"))
    await started(run, 1)
    gone.cancel()
    # A caller gone before its statement started is never run at all.
    never = asyncio.ensure_future(batcher.submit("c"))
    await asyncio.sleep(0)
    never.cancel()
    await asyncio.sleep(0)
    run.gate.set()
    assert await kept == "done a"
    await asyncio.sleep(0)
    assert orphans == ["done b"]
    assert run.batches == [["a", "b"]]
