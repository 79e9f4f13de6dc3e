"""The bus's publish path against a scripted client (cluster.bus, cluster.outbox): the buffer is
bounded, FIFO across outages, and ``attempted == published + send_dropped + buffered`` holds at
every step. The same against a real server outage is tests/integration/test_bus_outage.py."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.bus import BusError, EventBus, redact_url
from cluster.events import AuctionEvent
from cluster.outbox import Outbox, Outgoing
from cluster.wire import decode


class FakeClient:
    """Connected or not at the test's word; refuses publishes while down, as nats-py may."""

    def __init__(self) -> None:
        self.is_connected = True
        self.is_closed = False
        self.sent: list[int] = []
        self.fail_next = 0

    async def publish(self, subject: str, data: bytes) -> None:
        if not self.is_connected:
            raise nats.errors.OutboundBufferLimitError
        if self.fail_next:
            self.fail_next -= 1
            self.is_connected = False  # the connection died under this very publish
            raise nats.errors.UnexpectedEOF
        self.sent.append(decode("auction", data)[0].batch_id)

    async def flush(self, timeout: float = 2.0) -> None:
        pass


def _bus(buffer_messages: int) -> tuple[EventBus, FakeClient]:
    bus = EventBus("nats://127.0.0.1:1", "t", buffer_messages=buffer_messages)
    client = FakeClient()
    bus._nc = client  # type: ignore[assignment]
    return bus, client


def _event(i: int, order: tuple[str, ...] = ("a",)) -> AuctionEvent:
    return AuctionEvent(batch_id=i, t=0.0, n=len(order), order=order)


def _balanced(bus: EventBus) -> bool:
    sent = sum(bus.published.values()) + sum(bus.send_dropped.values()) + bus.buffered
    return sum(bus.attempted.values()) == sent


def test_outage_buffering_is_bounded_ordered_and_counted() -> None:
    bus, client = _bus(buffer_messages=3)

    async def main() -> None:
        for i in range(2):
            await bus.publish(_event(i))
        client.is_connected = False
        for i in range(2, 7):  # 3 fit, 2 do not
            await bus.publish(_event(i))
            assert _balanced(bus)
        assert (bus.buffered, bus.send_dropped["buffer_full"]) == (3, 2)
        assert bus.published["auction"] == 2  # an attempt is not a publication
        client.is_connected = True
        await bus.publish(_event(7))  # queued behind the buffer, never ahead of it
        await bus.flush()

    asyncio.run(main())
    assert client.sent == [0, 1, 2, 3, 4, 7]
    assert bus.buffered == 0 and _balanced(bus)
    assert (bus.attempted["auction"], bus.published["auction"]) == (8, 6)


@given(st.lists(st.sampled_from(["publish", "down", "up", "die", "flush"]), max_size=60))
def test_any_schedule_keeps_order_and_the_books_balanced(script: list[str]) -> None:
    bus, client = _bus(buffer_messages=4)

    async def main() -> None:
        i = 0
        for step in script:
            if step == "publish":
                await bus.publish(_event(i))
                i += 1
            elif step == "down":
                client.is_connected = False
            elif step == "up":
                client.is_connected = True
            elif step == "die":
                client.fail_next = 1
            elif client.is_connected:
                await bus.flush()
            assert _balanced(bus)
        client.is_connected, client.fail_next = True, 0
        await bus.flush()

    asyncio.run(main())
    assert client.sent == sorted(client.sent)
    assert bus.buffered == 0 and _balanced(bus)
    assert len(client.sent) == bus.published["auction"]


def test_an_oversized_event_is_dropped_not_raised() -> None:
    bus, client = _bus(buffer_messages=3)
    huge = tuple(f"{i:020d}" for i in range(60_000))  # a valid event, over 1 MiB on the wire
    asyncio.run(bus.publish(_event(0, huge)))
    assert bus.send_dropped == {"too_large": 1} and client.sent == []


def test_publishing_before_connect_is_a_programming_error() -> None:
    from cluster.bus import BusError

    with pytest.raises(BusError):
        asyncio.run(EventBus("nats://127.0.0.1:1", "t").publish(_event(0)))


def test_outbox_bounds() -> None:
    box = Outbox(max_messages=10, max_bytes=5)
    assert box.offer(Outgoing("k", "s", b"abc")) and not box.offer(Outgoing("k", "s", b"abc"))
    assert box.offer(Outgoing("k", "s", b"de")) and (len(box), box.bytes) == (2, 5)
    assert box.pop().data == b"abc" and box.bytes == 2
    with pytest.raises(ValueError):
        Outbox(max_messages=-1)


def test_what_is_still_buffered_at_close_is_counted() -> None:
    bus, client = _bus(buffer_messages=5)

    async def main() -> None:
        client.is_connected = False
        for i in range(3):
            await bus.publish(_event(i))
        client.is_connected = True  # back: close sends what it can first
        client.fail_next = 1  # ... and the connection dies under the first one
        client.close = _noop  # type: ignore[attr-defined]
        await bus.close()

    asyncio.run(main())
    assert bus.send_dropped == {"closed": 3} and bus.buffered == 0 and _balanced(bus)


async def _noop() -> None:
    pass


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://alice:s3cret@nats.internal:4222", "nats://***@nats.internal:4222"),
        ("tls://tok3n@10.0.0.1:4222", "tls://***@10.0.0.1:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("not a url", "not a url"),
    ],
)
def test_urls_in_messages_never_carry_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_bus_that_cannot_connect_names_the_server_without_its_token() -> None:
    # Port 9 (discard) on loopback: nothing listens; the first connection gives up at once.
    bus = EventBus("nats://alice:s3cret@127.0.0.1:9", "t", first_connect_s=0.0,
                   connect_timeout_s=0.2)  # fmt: skip
    with pytest.raises(BusError) as err:
        asyncio.run(bus.connect())
    assert "s3cret" not in str(err.value) and "nats://***@127.0.0.1:9" in str(err.value)
