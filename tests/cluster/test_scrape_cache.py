"""The actors' metrics behind ``/metrics`` are fetched at most once a second
(cluster/ray/scrape_cache.py): later scrapes get the cached text, concurrent ones share one
fetch, and a failed fetch is not kept."""

from __future__ import annotations

import asyncio

import pytest

from cluster.ray.scrape_cache import ScrapeCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_scrapes_within_a_second_share_one_fetch() -> None:
    clock = Clock()
    texts = iter(["a 1\n", "a 2\n"])

    async def fetch() -> str:
        await asyncio.sleep(0.01)
        return next(texts)

    async def main() -> None:
        cache = ScrapeCache(fetch, clock=clock)
        # Five at once: one fetch; then within the second: cached.
        assert await asyncio.gather(*(cache.text() for _ in range(5))) == ["a 1\n"] * 5
        clock.now = 0.99
        assert await cache.text() == "a 1\n" and cache.fetches == 1
        clock.now = 1.0
        assert await cache.text() == "a 2\n" and cache.fetches == 2

    asyncio.run(main())


def test_a_failed_fetch_is_not_kept_and_a_scrape_that_gives_up_cancels_nobody() -> None:
    clock = Clock()
    calls = 0

    async def fetch() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("an actor is down")
        await asyncio.sleep(0.05)
        return "b 1\n"

    async def main() -> None:
        cache = ScrapeCache(fetch, clock=clock)
        with pytest.raises(RuntimeError):
            await cache.text()
        impatient = asyncio.ensure_future(asyncio.wait_for(cache.text(), 0.01))
        patient = asyncio.ensure_future(cache.text())
        with pytest.raises(TimeoutError):
            await impatient
        assert await patient == "b 1\n" and cache.fetches == 2

    asyncio.run(main())
