"""A discrete-event loop in virtual time: seeded, deterministic, with an optional event log.

Events at the same instant run in the order they were scheduled (a sequence number breaks ties),
so one seed gives one history. The worker models never read a clock themselves: they are told
``now`` by whoever drives them, this loop in virtual time or a wall-clock driver in serve mode.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# (time, sequence number, action, args): tuples compare on the first two fields only, because
# sequence numbers are unique.
_Event = tuple[float, int, Callable[..., None], tuple[object, ...]]


class EventLoop:
    """Run callbacks in time order; ``log`` (when enabled) records (time, label) of every event."""

    def __init__(self, record: bool = False) -> None:
        self.now = 0.0
        self._heap: list[_Event] = []
        self._seq = 0
        self.log: list[tuple[float, str]] | None = [] if record else None

    def at(self, when: float, action: Callable[..., None], *args: object) -> None:
        if when < self.now:
            raise ValueError(f"cannot schedule in the past: {when} < now {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action, args))

    def after(self, delay: float, action: Callable[..., None], *args: object) -> None:
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


@contextmanager
def few_collections(young: int = 100_000) -> Iterator[None]:
    """Run a long simulation with the cyclic garbage collector's youngest generation collected
    every ``young`` allocations instead of Python's 700 (restored after).

    A replay of an hour of trace allocates millions of long-lived objects (KV cache runs, router
    index nodes, records) and frees them by reference count (nothing in a replay is cyclic
    garbage: a pruned node drops its parent's reference to it). Python's defaults run a young
    collection every 700 allocations and a full one, over every live object, every 7,000 or so,
    which measured a third of a Mooncake replay's time and freed nothing."""
    before = gc.get_threshold()
    gc.set_threshold(young, before[1], before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)
