"""One control-plane call made off the request path: awaited with a timeout; a failure is
counted and logged sparsely (1st, 2nd, 4th, ...) so that a long outage does not flood the log.
And the replica's shared background work, detached from whichever request started it.

Why detached. Ray keeps an async actor's current task in a context variable, and a call made in
that context is that task's child: Ray Serve cancels a request's children when its client
disconnects. A replica opens its shared calls lazily, inside the first request that needs them
(a decode worker's token stream, which every request of the replica reads; an exchange that
carries every queued request's bid); made in that request's context, they were cancelled with
it, and every other request on them failed over (measured: 81 of 50 streams' placements retried
after 50 clients hung up, the orphaned sequences decoding on to ``max_tokens``). Made in a fresh
context they belong to the replica, as Ray Serve's own long-poll client does it."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

__all__ = ["FailureCount", "ask", "call_detached", "detached_task"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class FailureCount:
    def __init__(self, what: str) -> None:
        self.what = what
        self.n = 0

    def failed(self, exc: BaseException) -> None:
        self.n += 1
        if self.n & (self.n - 1) == 0:
            log.warning("%s failed (%d so far): %r", self.what, self.n, exc)


async def ask(
    call: Callable[[], Awaitable[T]], timeout_s: float, failures: FailureCount
) -> T | None:
    """The answer of the awaitable ``call()`` returns (an actor call), or None when making the
    call or awaiting it raised or took longer than ``timeout_s`` (counted in ``failures``)."""

    async def answer() -> T:
        return await call()

    try:
        return await asyncio.wait_for(answer(), timeout_s)
    except Exception as exc:
        failures.failed(exc)
        return None


def detached_task(
    coro: Coroutine[object, object, T], *, name: str | None = None
) -> asyncio.Task[T]:
    """A background task of the replica's own, outside the request that started it (module
    docstring): the Ray calls it makes are not cancelled with that request."""
    return asyncio.get_running_loop().create_task(coro, name=name, context=contextvars.Context())


def call_detached(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` (a Ray ``.remote`` call) outside the current request's context."""
    return contextvars.Context().run(fn, *args)
