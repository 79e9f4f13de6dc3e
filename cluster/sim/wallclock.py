"""The simulator's worker models driven in wall time under asyncio (docs/design.md §6, serve mode).

In virtual time (``cluster.sim.cluster``) an ``EventLoop`` tells each worker ``now``. Here a
``Clock`` does: virtual now = (monotonic − t0)·speedup, and ``sleep_virtual(dt)`` sleeps
dt/speedup wall seconds. One ``WallEngine`` wraps one worker (``cluster.sim.engines``:
``PrefillEngine``, ``DecodeEngine``) and owns one background task, its driver:

    t   the engine's model time: when the worker is next free (an iteration's planned end)
    a   a request's arrival, virtual (default: the clock when it is submitted)
    d   an iteration's duration, from the worker: start_iteration(t) → d | None

The driver admits into the worker only requests with a ≤ t (the inbox is a heap on a; a
request is never admitted before it arrives), calls ``start_iteration(t)``, sleeps until the
clock reads t + d, then calls ``finish_iteration(t + d)`` and sets t ← t + d. When the worker
has nothing to do it waits on an event (no busy loop) and restarts at t ← max(t, a).

Why model time and not the clock's reading at wake-up: asyncio wakes a sleeper late (epoll
rounds to 1 ms; a loaded loop adds more), and at speedup S a wake-up δ late is S·δ virtual
seconds. Stamping with the clock would stretch every iteration by that much (at S = 100 a
decode step of 8.5 ms would read as 100 ms); stamping with t + d keeps every virtual time
exactly the model's, the same as the virtual-time simulator with the same seeds, and lateness
only delays when a result is delivered. A driver that is behind the clock does not sleep
(``sleep_until`` returns at once) until it has caught up, so lag does not accumulate.

``close()`` stops the driver and fails every waiting caller with ``EngineClosed``;
``drain(timeout)`` refuses new work (``EngineDraining``) and waits for what is in flight.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

# Speedup bounds. Below 1e-3 a virtual second lasts more than 16 wall minutes: nothing a demo or
# a test wants, and likely a unit mistake. Above 1e4 one wake-up delay of ~1 ms is 10 virtual
# seconds: the driver runs in catch-up all the time (correct virtual times, still), so the
# stream's wall pacing no longer means anything.
MIN_SPEEDUP = 1e-3
MAX_SPEEDUP = 1e4


class Clock:
    """Virtual time running ``speedup`` times faster than the monotonic wall clock.

    Engines that exchange virtual times (a prefill end stamping a decode arrival) must share
    one clock, so that their times have the same origin ``t0`` (a ``time.monotonic()`` reading).
    """

    def __init__(self, speedup: float = 1.0, *, t0: float | None = None) -> None:
        if not (math.isfinite(speedup) and MIN_SPEEDUP <= speedup <= MAX_SPEEDUP):
            raise ValueError(
                f"speedup must be finite and in [{MIN_SPEEDUP:g}, {MAX_SPEEDUP:g}], got {speedup!r}"
            )
        self.speedup = float(speedup)
        self.t0 = time.monotonic() if t0 is None else t0

    def now(self) -> float:
        """Virtual seconds since ``t0``."""
        return (time.monotonic() - self.t0) * self.speedup

    def wall(self, virtual_s: float) -> float:
        """Wall seconds that ``virtual_s`` virtual seconds take."""
        return virtual_s / self.speedup

    async def sleep_virtual(self, dt: float) -> None:
        """Sleep ``dt`` virtual seconds (dt/speedup wall seconds)."""
        if not (math.isfinite(dt) and dt >= 0):
            raise ValueError(f"sleep_virtual needs a finite dt >= 0, got {dt!r}")
        # Via sleep_until: never early, so a stamp "start + dt" is never in the future after it.
        await self.sleep_until(self.now() + dt)

    async def sleep_until(self, t_virtual: float) -> None:
        """Sleep until the clock reads at least ``t_virtual``; yield once if it already does."""
        delay = self.wall(t_virtual - self.now())
        if delay <= 0:
            await asyncio.sleep(0)  # let consumers run while a lagging driver catches up
            return
        # asyncio may wake a sleeper up to its clock resolution early: loop until really past.
        while delay > 0:
            await asyncio.sleep(delay)
            delay = self.wall(t_virtual - self.now())


# Named for what the caller learns (the serving runtime's contract), not with an Error suffix.
class EngineClosed(RuntimeError):  # noqa: N818
    """The engine is closed (or its driver failed): the call cannot be served."""


class EngineDraining(EngineClosed):
    """The engine is draining: it finishes what it has and accepts nothing new."""


@dataclass(frozen=True)
class EngineLoad:
    """One engine's load, the figures Dynamo's ``kv_metrics`` carries (plus queue depths)."""

    active_prefill_tokens: int
    active_decode_blocks: int
    kv_used_blocks: int
    kv_total_blocks: int
    waiting: int
    running: int


ItemT = TypeVar("ItemT")


class WallEngine(ABC, Generic[ItemT]):
    """One worker driven in wall time; subclasses bind the worker (items: its jobs)."""

    def __init__(self, worker_id: int, clock: Clock) -> None:
        self.worker_id = worker_id
        self.clock = clock
        # (arrival, sequence number, item): the number breaks ties, so items are never compared.
        self._inbox: list[tuple[float, int, ItemT]] = []
        self._seqno = 0
        self._t = -math.inf  # model time: when the worker is next free
        self._wake = asyncio.Event()  # set on every submission or withdrawal
        self._idle = asyncio.Event()  # set while nothing is queued or running
        self._idle.set()
        self._driver: asyncio.Task[None] | None = None
        self._closed: str | None = None  # why, once closed
        self._draining = False
        self._aborted = False  # close() or a driver failure dropped work in flight

    # -- the worker, bound by subclasses ----------------------------------------------------

    @abstractmethod
    def _busy(self) -> bool:
        """The worker has queued or running work."""

    @abstractmethod
    def _submit(self, item: ItemT, arrival: float) -> None:
        """Hand an arrived item to the worker."""

    @abstractmethod
    def _start(self, t: float) -> float | None:
        """Plan an iteration starting at model time ``t``; its duration."""

    @abstractmethod
    def _finish(self, t: float) -> None:
        """Apply the iteration ending at model time ``t`` and deliver its results."""

    @abstractmethod
    def _fail_waiters(self, error: Callable[[], EngineClosed]) -> None:
        """Fail every caller still waiting, each with a fresh ``error()``."""

    # -- state -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def in_flight(self) -> bool:
        """Work submitted and not finished (what ``drain`` waits for)."""
        return bool(self._inbox) or self._busy()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise EngineClosed(f"engine {self.worker_id} is closed: {self._closed}")
        if self._draining:
            raise EngineDraining(f"engine {self.worker_id} is draining: it accepts no new work")

    def _accept(self, item: ItemT, arrival: float | None) -> float:
        """Queue ``item``, arrived at ``arrival`` (virtual; default now), and wake the driver.

        An arrival may lie in the past (stamped where the request really arrived, e.g. at the
        end of a KV transfer the caller slept through), never in the future: the driver would
        have to admit it before requests that arrive earlier but are submitted later.
        """
        self._check_open()
        now = self.clock.now()
        if arrival is None:
            arrival = now
        elif not (math.isfinite(arrival) and arrival <= now):
            raise ValueError(f"arrival must be finite and not in the future ({now}), got {arrival}")
        self._seqno += 1
        heapq.heappush(self._inbox, (arrival, self._seqno, item))
        self._idle.clear()
        self._wake.set()
        if self._driver is None:
            name = f"{type(self).__name__}-{self.worker_id}"
            self._driver = asyncio.get_running_loop().create_task(self._drive(), name=name)
        return arrival

    def _withdraw(self, item: ItemT) -> bool:
        """Remove ``item`` if it is still in the inbox (never handed to the worker)."""
        for k, entry in enumerate(self._inbox):
            if entry[2] is item:
                self._inbox.pop(k)
                heapq.heapify(self._inbox)
                self._wake.set()  # the driver re-checks whether it is idle now
                return True
        return False

    # -- the driver --------------------------------------------------------------------------

    async def _drive(self) -> None:
        try:
            while True:
                if not self._inbox and not self._busy():
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._busy():
                    self._t = max(self._t, self._inbox[0][0])  # idle until the next arrival
                while self._inbox and self._inbox[0][0] <= self._t:
                    arrival, _, item = heapq.heappop(self._inbox)
                    self._submit(item, arrival)
                duration = self._start(self._t)
                if duration is None:
                    # Requests that can never fit are refused at submission, so this is a bug.
                    raise RuntimeError(f"worker {self.worker_id} holds work it cannot start")
                end = self._t + duration
                await self.clock.sleep_until(end)
                self._t = end
                self._finish(end)
        except Exception as exc:  # fail callers loudly rather than leave them hanging
            self._abort(f"its driver failed: {exc!r}", exc)

    def _abort(self, reason: str, cause: BaseException | None = None) -> None:
        if self._closed is None:
            self._closed = reason
        self._aborted = self._aborted or self.in_flight
        self._inbox.clear()

        def error() -> EngineClosed:
            err = EngineClosed(f"engine {self.worker_id} is closed: {reason}")
            err.__cause__ = cause
            return err

        self._fail_waiters(error)
        self._idle.set()

    # -- shutdown ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the driver now; every waiting caller gets ``EngineClosed``. Idempotent."""
        task, self._driver = self._driver, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # not ``await task``: that would swallow our own cancel
        if self._closed is None or self.in_flight:
            self._abort(self._closed or "close() was called")

    async def drain(self, timeout: float | None = None) -> bool:
        """Accept nothing new and wait up to ``timeout`` wall seconds (None: no limit) for the
        work in flight. True when it all finished; False on timeout (it keeps running: call
        ``close()`` to stop it) or when the engine was closed before it finished. A drained
        engine stays closed to new work: a re-split builds the other role's engine. False, too,
        when ``resume`` gave the drain up before it finished."""
        self._draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return not self._aborted and self._draining  # not resumed meanwhile (given up)

    def resume(self) -> bool:
        """Accept new work again after a ``drain`` that is given up (a re-split abandoned when
        its drain timed out). False when the engine is closed: nothing can reopen it."""
        if self._closed is not None:
            return False
        self._draining = False
        return True
