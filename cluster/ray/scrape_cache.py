"""The actors' metrics for ``/metrics``, fetched at most once a second (docs/design.md §5).

A scrape of the ingress merges the metric families of every actor of the service (one call
each). Prometheus, a dashboard and ``disaggctl status --watch`` may all scrape every replica, so
the fan-out is cached: a scrape within ``max_age_s`` of the last fetch gets that fetch's text,
and scrapes that arrive while a fetch runs wait for it instead of starting their own. A fetch
that fails is not kept: the next scrape tries again. The replica's own families (its actor
calls, its load view, on Dynamo its agreement counts) are not cached: every scrape reads them
(``cluster/serve/path.py: ActorRequestPath.metrics_text``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from cluster.dataplane.calls import detached_task

__all__ = ["MAX_AGE_S", "ScrapeCache"]

MAX_AGE_S = 1.0


class ScrapeCache:
    def __init__(
        self, fetch: Callable[[], Awaitable[str]], *, max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._fetch, self.max_age_s, self._clock = fetch, max_age_s, clock
        self._text: str | None = None
        self._at = 0.0
        self._running: asyncio.Task[str] | None = None
        self.fetches = 0

    async def text(self) -> str:
        if self._text is not None and self._clock() - self._at < self.max_age_s:
            return self._text
        if self._running is None:
            # Shared by every scrape that comes meanwhile: not the first scrape's child.
            self._running = detached_task(self._refresh())
        # Shielded: one scrape that gives up (its timeout) does not cancel the others' fetch.
        return await asyncio.shield(self._running)

    async def _refresh(self) -> str:
        try:
            self.fetches += 1
            text = await self._fetch()
            self._text, self._at = text, self._clock()
            return text
        finally:
            self._running = None
