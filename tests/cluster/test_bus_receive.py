"""The bus's receive path without a server: whatever a message holds, the subscription handler
returns normally, and every message it does not deliver is counted by reason, on the bus and in
``disagg_events_dropped_total{reason}``."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from cluster.bus import EventBus
from cluster.events import AuctionEvent
from cluster.wire import DROP_REASONS, MAX_MESSAGE_BYTES, encode
from telemetry.metrics import REGISTRY

AUCTION = AuctionEvent(batch_id=1, t=0.0, n=1, order=("a",))


@dataclass
class FakeMsg:
    data: bytes
    subject: str


def _metric(reason: str) -> float:
    value = REGISTRY.get_sample_value("disagg_events_dropped_total", {"reason": reason})
    return value or 0.0


def _feed(bus: EventBus, kind: str, messages: list[bytes], on_event) -> None:
    handle = bus._handler(frozenset({kind}), on_event)

    async def main() -> None:
        for data in messages:
            # must return normally, whatever data holds
            await handle(FakeMsg(data, f"disagg.t.{kind}"))

    asyncio.run(main())


def test_hostile_messages_are_counted_and_never_escape() -> None:
    bus, got = EventBus("nats://127.0.0.1:1", "t"), []
    before = {r: _metric(r) for r in DROP_REASONS}
    depth = 300_000
    messages = [
        b"[" * depth + b"]" * depth,  # was a RecursionError out of the handler
        b"\xff\xfe",
        b" " * (MAX_MESSAGE_BYTES + 1),
        json.dumps({**json.loads(encode(AUCTION, "p", 1)), "order": "abc"}).encode(),
        json.dumps({**json.loads(encode(AUCTION, "p", 1)), "v": 9}).encode(),
        encode(AUCTION, "p", 1),
    ]
    _feed(bus, "auction", messages, got.append)
    assert got == [AUCTION]
    expected = {"malformed": 2, "too_large": 1, "schema": 1, "version": 1}
    assert dict(bus.dropped) == expected
    for reason, n in expected.items():
        assert _metric(reason) - before[reason] == n


def test_a_raising_callback_is_counted_and_the_next_message_flows() -> None:
    bus, got = EventBus("nats://127.0.0.1:1", "t"), []

    def flaky(event) -> None:
        if len(got) == 0:
            got.append(None)
            raise RuntimeError("consumer bug")
        got.append(event)

    _feed(bus, "auction", [encode(AUCTION, "p", 1), encode(AUCTION, "p", 2)], flaky)
    assert got == [None, AUCTION]
    assert bus.dropped["handler_error"] == 1


def test_sequence_numbers_cannot_poison_the_counts() -> None:
    # Regression: seq = 2**62 counted 4.6e18 gaps and then dropped everything as a duplicate.
    bus, got = EventBus("nats://127.0.0.1:1", "t"), []
    seqs = [500, 501, 2**62, 502, 503, 503, 505, 1, 2]  # late join, garbage, dup, loss, restart
    _feed(bus, "auction", [encode(AUCTION, "p", s) for s in seqs], got.append)
    assert len(got) == len(seqs) - 1
    assert dict(bus.dropped) == {"duplicate": 1, "gap": 1}
    assert bus.last_seen("p", "auction") == 2
