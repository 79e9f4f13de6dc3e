"""The auction actor publishes one AuctionEvent per batch on a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster.bus import EventBus
from cluster.dataplane.exchange import Bid, ExchangeIn
from cluster.events import AuctionEvent, Event
from cluster.ray.auction_actor import AuctionActor

pytestmark = pytest.mark.integration


def test_batches_are_published_on_nats(nats_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        received: list[Event] = []
        listener = EventBus(nats_url, "auctiontest", role="observer")
        await listener.connect()
        await listener.subscribe(received.append, kinds=("auction",))
        actor = AuctionActor(
            settings={"batch_size": 2, "batch_window_ms": 10_000.0},
            ledger=str(tmp_path / "ledger.db"),
            users=[{"name": "alice", "budget": 5.0}, {"name": "bob", "budget": 5.0}],
            nats_url=nats_url,
            namespace="auctiontest",
            speedup=2.0,
            epoch_wall=0.0,
        )
        try:
            await actor.ready()
            for _ in range(200):
                if (await actor.stats()).nats:
                    break
                await asyncio.sleep(0.02)
            await actor.set_regime("saturated")
            await actor.exchange(ExchangeIn("r1", (
                Bid("a", "alice", 2.0, (1, 2), "a@r1"), Bid("b", "bob", 1.0, (3,), "b@r1"),
            )))  # fmt: skip
            for _ in range(200):
                if received:
                    break
                await asyncio.sleep(0.02)
        finally:
            await actor.shutdown()
            await listener.close()
        (event,) = received
        assert isinstance(event, AuctionEvent)
        assert (event.n, event.order, event.payments) == (2, ("a", "b"), {"alice": 1.0, "bob": 0.0})
        assert event.t > 1e9  # virtual seconds since the shared epoch (here 1970, at 2x)

    asyncio.run(main())
