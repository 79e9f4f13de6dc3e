"""Coalescing a token stream into chunks (docs/design.md "Tokens").

Every chunk a stream yields costs a Ray object or an SSE event (and on Ray Serve both: the
replica's response travels to the proxy one body message at a time), so a stream of one token
per decode step spends the ingress's CPU on messages rather than tokens. :func:`coalesced`
keeps the latencies that matter and cuts the rest:

    the first chunk leaves at once (the TTFT); after a chunk, what arrives within ``interval_s``
    wall seconds leaves together; the stream's end cuts the wait short (the E2E waits for
    nothing); an error leaves after the items gathered before it.

``interval_s = 0`` passes every chunk as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

__all__ = ["coalesced"]

T = TypeVar("T")


async def coalesced(
    source: AsyncIterator[list[T]], interval_s: float
) -> AsyncGenerator[list[T], None]:
    """``source``'s items, in order, in chunks at most one per ``interval_s`` after the first.
    Closing this generator closes ``source`` (a consumer that leaves stops the engine)."""
    if interval_s <= 0:
        async with contextlib.aclosing(source):  # type: ignore[type-var]
            async for chunk in source:
                yield chunk
        return
    ready: list[T] = []
    more = asyncio.Event()

    async def pump() -> None:
        async with contextlib.aclosing(source):  # type: ignore[type-var]
            async for chunk in source:
                ready.extend(chunk)
                more.set()

    task = asyncio.get_running_loop().create_task(pump())
    try:
        while True:
            if not ready and not task.done():
                waiter = asyncio.ensure_future(more.wait())
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
            if ready:
                chunk = ready[:]
                ready.clear()
                more.clear()
                yield chunk
                await asyncio.wait({task}, timeout=interval_s)  # gather; the end cuts it short
            elif task.done():
                task.result()  # the source's error, if any, after every item before it
                return
    finally:
        if not task.done():
            task.cancel()
        await asyncio.wait({task})
