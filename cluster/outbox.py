"""The bus's outbound buffer: what is published while NATS is away waits here, bounded.

The client library has a buffer of its own, but it is bounded in bytes only and, once full, raises
into every publisher (14,827 ``OutboundBufferLimitError`` in one second of outage). This one is
bounded in messages and in bytes, never raises, and refuses the newest message when full (the
caller counts it as dropped), so what is kept is one contiguous run of the stream: the subscriber
sees a single gap after an outage, not holes. Order is first in, first out.

Defaults: :data:`MAX_MESSAGES` = 10,000 messages and :data:`MAX_BYTES` = 16 MiB, whichever comes
first; the byte bound is at least one maximal message, so any single event fits an empty buffer.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

MAX_MESSAGES = 10_000
MAX_BYTES = 16 << 20


class Outgoing(NamedTuple):
    kind: str  # the counter it belongs to: an event kind, or "kv"
    subject: str
    data: bytes


class Outbox:
    def __init__(self, max_messages: int = MAX_MESSAGES, max_bytes: int = MAX_BYTES) -> None:
        if type(max_messages) is not int or max_messages < 0:
            raise ValueError(f"max_messages must be an integer >= 0, got {max_messages!r}")
        if type(max_bytes) is not int or max_bytes < 0:
            raise ValueError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._items: deque[Outgoing] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def offer(self, item: Outgoing) -> bool:
        """Keep ``item`` at the back; False (and nothing kept) when it would exceed a bound."""
        size = len(item.data)
        if len(self._items) >= self.max_messages or self._bytes + size > self.max_bytes:
            return False
        self._items.append(item)
        self._bytes += size
        return True

    def peek(self) -> Outgoing:
        return self._items[0]

    def pop(self) -> Outgoing:
        item = self._items.popleft()
        self._bytes -= len(item.data)
        return item
