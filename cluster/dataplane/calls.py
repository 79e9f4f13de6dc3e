"""One control-plane call made off the request path: awaited with a timeout; a failure is
counted and logged sparsely (1st, 2nd, 4th, ...) so that a long outage does not flood the log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["FailureCount", "ask"]

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
    call: Callable[[], Any], timeout_s: float, failures: FailureCount
) -> tuple[bool, Any]:
    """(True, the answer) of the awaitable ``call()`` returns (a Ray ObjectRef), or (False,
    None) when making the call or awaiting it raised or took longer than ``timeout_s``
    (counted in ``failures``)."""

    async def answer() -> Any:
        return await call()

    try:
        return True, await asyncio.wait_for(answer(), timeout_s)
    except Exception as exc:
        failures.failed(exc)
        return False, None
