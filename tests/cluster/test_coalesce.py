"""Coalescing a token stream (cluster/coalesce.py): the first chunk at once, the rest gathered per
interval, nothing lost or reordered, errors after the items before them, and a consumer that
leaves closes the source."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import pytest

from cluster.coalesce import coalesced


async def _source(n: int, step_s: float, log: list[str], fail_at: int | None = None
                  ) -> AsyncIterator[list[int]]:  # fmt: skip
    try:
        for i in range(n):
            if i == fail_at:
                raise RuntimeError("worker failed")
            await asyncio.sleep(step_s)
            yield [i]
    finally:
        log.append("closed")


async def _collect(chunks: AsyncIterator[list[int]]) -> list[tuple[float, list[int]]]:
    return [(time.monotonic(), chunk) async for chunk in chunks]


def test_no_interval_passes_every_chunk_as_it_comes() -> None:
    log: list[str] = []
    got = asyncio.run(_collect(coalesced(_source(5, 0.0, log), 0.0)))
    assert [c for _, c in got] == [[0], [1], [2], [3], [4]] and log == ["closed"]


def test_the_first_chunk_leaves_at_once_and_the_rest_per_interval() -> None:
    log: list[str] = []
    got = asyncio.run(_collect(coalesced(_source(30, 0.004, log), 0.05)))
    assert [i for _, c in got for i in c] == list(range(30))  # nothing lost, in order
    assert got[0][1] == [0]  # alone: it did not wait for the ~12 items of an interval
    times = [t for t, _ in got[:-1]]  # the end cuts the last wait short
    assert all(b - a >= 0.045 for a, b in itertools.pairwise(times))
    assert len(got) < 10 and log == ["closed"]


def test_an_error_leaves_after_the_items_before_it() -> None:
    log: list[str] = []
    seen: list[int] = []

    async def body() -> None:
        async for chunk in coalesced(_source(10, 0.001, log, fail_at=6), 0.05):
            seen.extend(chunk)

    with pytest.raises(RuntimeError, match="worker failed"):
        asyncio.run(body())
    assert seen == list(range(6)) and log == ["closed"]


def test_a_consumer_that_leaves_closes_the_source() -> None:
    log: list[str] = []

    async def body() -> None:
        chunks = coalesced(_source(10_000, 0.001, log), 0.02)
        assert await anext(chunks) == [0]
        await anext(chunks)
        await chunks.aclose()

    asyncio.run(body())
    assert log == ["closed"]
