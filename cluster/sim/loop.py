"""A discrete-event loop in virtual time: seeded, deterministic, with an optional event log.

Events at the same instant run in the order they were scheduled (a sequence number breaks ties),
so one seed gives one history. The worker models never read a clock themselves: they are told
``now`` by whoever drives them, this loop in virtual time or a wall-clock driver in serve mode.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

# (time, sequence number, action, args): tuples compare on the first two fields only, because
# sequence numbers are unique.
_Event = tuple[float, int, Callable[..., None], tuple[Any, ...]]


class EventLoop:
    """Run callbacks in time order; ``log`` (when enabled) records (time, label) of every event."""

    def __init__(self, record: bool = False) -> None:
        self.now = 0.0
        self._heap: list[_Event] = []
        self._seq = 0
        self.log: list[tuple[float, str]] | None = [] if record else None

    def at(self, when: float, action: Callable[..., None], *args: Any) -> None:
        if when < self.now:
            raise ValueError(f"cannot schedule in the past: {when} < now {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action, args))

    def after(self, delay: float, action: Callable[..., None], *args: Any) -> None:
        self.at(self.now + max(0.0, delay), action, *args)

    def note(self, label: str) -> None:
        if self.log is not None:
            self.log.append((self.now, label))

    def run(self, until: float = float("inf")) -> None:
        """Process events up to and including time ``until`` (or until none are left)."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until:
            when, _, action, args = pop(heap)
            self.now = when
            action(*args)
        if until != float("inf"):
            self.now = max(self.now, until)

    @property
    def pending(self) -> int:
        return len(self._heap)
