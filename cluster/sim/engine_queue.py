"""An engine's waiting queue: served by (priority, arrival), as vLLM's priority scheduler does.

A request carries an integer ``priority``; a lower value is served first (vLLM's convention,
which Dynamo's ``routing.priority`` passes through), and requests of equal priority are served in
the order they reached the engine. With every priority equal this is the engines' first-come
queue. The admission stage sets the priority (``auction.engine_priority``), so the order the
auction sold survives the engine's queue (docs/design.md §1, "Priority reaches the engine").
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from itertools import count
from typing import Generic, Protocol, TypeVar


class Prioritised(Protocol):
    @property
    def priority(self) -> int: ...


T = TypeVar("T", bound=Prioritised)


class WaitingQueue(Generic[T]):
    """Items ordered by (``item.priority``, arrival); ``popleft`` takes the first."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._items: list[T] = []
        self._arrivals = count()

    def append(self, item: T) -> None:
        key = (item.priority, next(self._arrivals))
        at = bisect.bisect_right(self._keys, key)
        self._keys.insert(at, key)
        self._items.insert(at, item)

    def popleft(self) -> T:
        if not self._items:
            raise IndexError("popleft from an empty waiting queue")
        del self._keys[0]
        return self._items.pop(0)

    def remove(self, item: T) -> None:
        at = next((i for i, x in enumerate(self._items) if x is item), None)
        if at is None:
            raise ValueError("item not in the waiting queue")
        del self._keys[at]
        del self._items[at]

    def __getitem__(self, index: int) -> T:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items))

    def __contains__(self, item: object) -> bool:
        return any(x is item for x in self._items)
