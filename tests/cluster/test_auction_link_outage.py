"""[21] 1: an auction outage longer than one exchange can carry does not jam the link
(cluster/dataplane/auction_link.py), in-process against a real auction actor and ledger.

While the auction is away the link turns each waiting request it gives up on into a settlement
(a release of the hold the lost call may have reserved), and the settlements of the requests
that ended keep waiting for the auction: at 100 requests/s, about 40 s of outage passes the
4,096 items one exchange may carry (``cluster.dataplane.exchange.MAX_ITEMS``). When the auction
is back, every settlement must reach it (the captures charged, every hold closed), in as many
exchanges as it takes, and the link must go on admitting."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from cluster.dataplane.auction_link import AuctionLink
from cluster.dataplane.exchange import MAX_ITEMS, ExchangeIn, Refusal
from cluster.ray.auction_actor import AuctionActor
from tests.cluster.test_auction_exchange import InProcess, _books

# Below saturation every bid is released at once (FCFS), so the holds before the outage are
# real ones, and the requests during it queue at the link (the auction does not answer).
OUTAGE_REQUESTS = MAX_ITEMS + 904  # an outage of ~50 s at 100 requests/s
HELD_BEFORE = 40


class Flaky(InProcess):
    """The auction actor as a handle that, while ``down``, fails every call (a dead actor)."""

    def __init__(self, actor: Any) -> None:
        super().__init__(actor)
        self.down = False
        self.largest: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        inner = super().__getattr__(name)
        if name != "exchange":
            return inner

        def remote(message: ExchangeIn) -> Any:
            for field in ("bids", "started", "settlements", "withdrawn"):
                n = len(getattr(message, field))
                self.largest[field] = max(self.largest.get(field, 0), n)
            if self.down:
                raise ConnectionError("the auction actor is dead")
            return inner.remote(message)

        return type(inner)(remote=remote)


def test_an_outage_past_one_exchange_delivers_every_settlement_when_the_auction_returns(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        actor = AuctionActor(
            settings={"max_in_prefill": 100_000, "queue_threshold": 100_000,
                      "max_queue": 100_000},
            ledger=str(tmp_path / "ledger.sqlite"),
            users=[{"name": "alice", "budget": 1e6}],
            nats_url=None,
        )  # fmt: skip
        handle = Flaky(actor)
        link = AuctionLink(handle, "r1", period_s=0.002, give_up_s=0.2)
        try:
            # Before the outage: 40 requests released, each holding its bid of 1.
            before = [await link.admit(f"b{k}", "alice", 1.0, [k]) for k in range(HELD_BEFORE)]
            assert {r.mode for r in before} == {"fcfs"}
            assert await _books(actor, "held", "alice") == HELD_BEFORE

            handle.down = True
            # They end during the outage (answered; FCFS: nothing to capture, holds to release).
            ended = [asyncio.ensure_future(link.settle(f"b{k}", True)) for k in range(HELD_BEFORE)]
            # The outage's traffic: each request waits, then is refused with a 503.
            during = [asyncio.ensure_future(link.admit(f"o{k}", "alice", 1.0, [k]))
                      for k in range(OUTAGE_REQUESTS)]  # fmt: skip
            outcomes = await asyncio.wait_for(
                asyncio.gather(*during, return_exceptions=True), timeout=30.0
            )
            assert all(isinstance(o, Refusal) and o.status == 503 for o in outcomes)
            assert await asyncio.wait_for(asyncio.gather(*ended), timeout=30.0) == [0.0] * 40

            handle.down = False
            for _ in range(3000):  # the link drains what waited, MAX_ITEMS at a time
                if link.idle:
                    break
                await asyncio.sleep(0.005)
            assert link.idle, "the link is jammed: settlements never reach the auction"
            assert await _books(actor, "held", "alice") == 0.0  # every hold closed
            assert max(handle.largest.values()) <= MAX_ITEMS

            # And it goes on admitting.
            after = await asyncio.wait_for(link.admit("n1", "alice", 1.0, [1]), timeout=5.0)
            assert after.mode == "fcfs"
            assert await asyncio.wait_for(link.settle("n1", True), timeout=5.0) == 0.0
        finally:
            await link.aclose()
            await actor.shutdown()

    asyncio.run(body())
