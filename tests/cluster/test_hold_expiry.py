"""[21] 2: a hold outlives its owner's lease by a grace, so a request whose replica was slow to
renew (a stalled auction or ledger, an auction restart replaying its journal) is still charged;
a dead replica's holds are released when the grace ends; a release that fails is retried
(cluster/ray/auction_exchange.py, in-process against a real auction actor and ledger)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cluster.dataplane.exchange import ExchangeIn, Settlement
from cluster.ray.auction_actor import AuctionActor
from tests.cluster.test_auction_exchange import SATURATED, _bid, _books


def _actor(tmp_path: Path, **kw: Any) -> AuctionActor:
    return AuctionActor(
        settings=SATURATED | {"max_in_prefill": 4},
        ledger=str(tmp_path / "ledger.sqlite"),
        users=[{"name": "alice", "budget": 10.0}],
        nats_url=None,
        **kw,
    )


async def _released(actor: AuctionActor, replica: str, rid: str) -> Any:
    await actor.exchange(ExchangeIn(replica, (_bid(rid, replica=replica),)))
    await asyncio.sleep(0.01)
    (release,) = (await actor.exchange(ExchangeIn(replica))).released
    return release


def test_a_replica_that_renews_late_still_has_its_request_charged(tmp_path: Path) -> None:
    async def body() -> None:
        actor = _actor(tmp_path, lease_ttl_s=0.3, hold_grace_s=5.0)
        await actor.lease("slow")
        release = await _released(actor, "slow", "a")
        assert release.mode == "auction"
        # The replica misses its renewals for longer than its lease (a stalled auction or
        # ledger does this too); another replica's lease calls run the expiry meanwhile.
        for _ in range(4):
            await asyncio.sleep(0.15)
            await actor.lease("other")
        assert "slow" not in (await actor.stats()).leases  # its lease (slots) is gone ...
        assert (await _books(actor, "held", "alice")) == 1.0  # ... its hold is not
        # A price the capture can be told apart from nothing by (a lone bid's VCG price is 0).
        done = await actor.exchange(ExchangeIn("slow", settlements=(
            Settlement("a", "a@slow", release.batch_id, 0.75, True),)))  # fmt: skip
        assert [s.charged for s in done.settled] == [0.75]  # the price, charged
        assert (await _books(actor, "account", "alice")).spent == pytest.approx(0.75)
        assert (await _books(actor, "held", "alice")) == 0.0
        await actor.shutdown()

    asyncio.run(body())


def test_an_auction_restart_slower_than_the_lease_keeps_the_holds(tmp_path: Path) -> None:
    async def body() -> None:
        first = _actor(tmp_path, lease_ttl_s=0.2, hold_grace_s=5.0)
        await first.lease("r1")
        release = await _released(first, "r1", "a")
        await first.shutdown()
        await asyncio.sleep(0.4)  # the restart (a long journal's replay) outlasts the lease
        second = _actor(tmp_path, lease_ttl_s=0.2, hold_grace_s=5.0)
        assert second.released_at_start == 0
        done = await second.exchange(ExchangeIn("r1", settlements=(
            Settlement("a", "a@r1", release.batch_id, 0.5, True),)))  # fmt: skip
        assert [s.charged for s in done.settled] == [0.5]
        await second.shutdown()

    asyncio.run(body())


def test_a_dead_replicas_holds_are_released_when_the_grace_ends(tmp_path: Path) -> None:
    async def body() -> None:
        actor = _actor(tmp_path, lease_ttl_s=0.2, hold_grace_s=0.3)
        await actor.lease("dead")
        await _released(actor, "dead", "a")
        for _ in range(3):  # past its lease, within the grace: held
            await asyncio.sleep(0.1)
            await actor.lease("live")
        assert (await _books(actor, "held", "alice")) == 1.0
        for _ in range(4):  # past lease + grace: released
            await asyncio.sleep(0.1)
            await actor.lease("live")
        assert (await _books(actor, "held", "alice")) == 0.0
        await actor.shutdown()

    asyncio.run(body())


def test_a_release_that_fails_once_is_retried_until_the_hold_is_closed(tmp_path: Path) -> None:
    async def body() -> None:
        actor = _actor(tmp_path)
        await actor.lease("r1")
        await actor.exchange(ExchangeIn("r1", (_bid("a"),)))
        await asyncio.sleep(0.01)
        release = actor._ledger.release
        failures = []

        def flaky(hold_id: str) -> Any:
            if not failures:
                failures.append(hold_id)
                raise OSError("disk I/O error")
            return release(hold_id)

        actor._ledger.release = flaky  # type: ignore[method-assign]
        # The client left while queued: the auction releases its hold (and the first try fails).
        await actor.exchange(ExchangeIn("r1", withdrawn=("a",)))
        await actor.exchange(ExchangeIn("r1"))
        assert failures == ["a@r1"]
        for _ in range(3):  # the renewals that follow retry it
            await actor.lease("r1")
        assert (await _books(actor, "held", "alice")) == 0.0
        await actor.shutdown()

    asyncio.run(body())
