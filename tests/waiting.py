"""Waiting in async tests: poll a condition, never a fixed sleep, and fail with a message
after a generous bound (a bound on hanging, not a timing assertion)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def until(
    check: Callable[[], object | Awaitable[object]],
    timeout_s: float = 2.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> None:
    """Return once ``check()`` (sync or async) is truthy; AssertionError after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        ok = check()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{what} not met in time"
        await asyncio.sleep(interval_s)
