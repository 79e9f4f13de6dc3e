"""The batched exchange between replicas and the auction (cluster/dataplane/exchange.py, the
actor's side in cluster/ray/auction_exchange.py, the replica's in cluster/dataplane/
auction_link.py), in-process against a real auction actor and ledger: one call carries many
requests, holds have owners and expiries, a dead replica's holds and slots come back, a
restarted auction keeps the holds a live replica still answers for, and no resend charges
twice."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.dataplane.auction_link import AuctionLink
from cluster.dataplane.exchange import Bid, ExchangeIn, Refusal, Settlement
from cluster.ledger.sqlite import Ledger
from cluster.ray.auction_actor import AuctionActor
from tests.cluster.auction_client import InProcess

SATURATED = {"max_in_prefill": 2, "queue_threshold": 0, "batch_window_ms": 1.0}


def _actor(
    tmp_path: Path, ttl_s: float = 30.0, grace_s: float = 60.0, **settings: Any
) -> AuctionActor:
    return AuctionActor(
        settings=SATURATED | settings,
        ledger=str(tmp_path / "ledger.sqlite"),
        users=[{"name": "alice", "budget": 10.0}, {"name": "bob", "budget": 1.0}],
        nats_url=None,
        lease_ttl_s=ttl_s,
        hold_grace_s=grace_s,
    )


async def _books(actor: AuctionActor, method: str, *args: Any) -> Any:
    """A ledger call on the actor's ledger thread (SQLite connections stay on theirs)."""
    return await actor._ledger_call(getattr(actor._ledger, method), *args)


def _bid(rid: str, user: str = "alice", bid: float = 1.0, replica: str = "r1") -> Bid:
    return Bid(rid, user, bid, (1, 2, 3, len(rid)), f"{rid}@{replica}")


def test_one_exchange_queues_many_bids_and_refuses_what_the_auction_refuses(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        actor = _actor(tmp_path)
        out = await actor.exchange(ExchangeIn("r1", (
            _bid("a"), _bid("b"), _bid("c", "bob", 5.0), _bid("d", "mallory"),
            _bid("e", "anonymous", 1.0), _bid("f", "anonymous", 0.0),
        )))  # fmt: skip
        refused = {r.request_id: (r.status, r.code) for r in out.refused}
        assert refused == {"c": (402, "budget_exceeded"), "d": (401, "unknown_user"),
                           "e": (402, "budget_exceeded")}  # fmt: skip
        # Two slots: a batch of the three queued requests is auctioned, two leave at once.
        await asyncio.sleep(0.01)
        out = await actor.exchange(ExchangeIn("r1"))
        assert len(out.released) == 2 and {r.mode for r in out.released} == {"auction"}
        holds = {h.hold_id: h for h in (await _books(actor, "holds"))}
        assert set(holds) == {"a@r1", "b@r1"}  # one transaction, the refused ones left out
        assert {h.owner for h in holds.values()} == {"r1"}
        assert all(h.expires is not None and h.expires > time.time() for h in holds.values())
        await actor.shutdown()

    asyncio.run(body())


def test_settlements_capture_exactly_once_whatever_is_resent(tmp_path: Path) -> None:
    async def body() -> None:
        actor = _actor(tmp_path, max_in_prefill=4)
        await actor.exchange(ExchangeIn("r1", (_bid("a", bid=2.0), _bid("b", bid=1.0))))
        await asyncio.sleep(0.01)
        out = await actor.exchange(ExchangeIn("r1", (_bid("a", bid=2.0),)))  # a lost reply
        releases = {r.request_id: r for r in out.released}
        assert set(releases) == {"a", "b"} and (await _books(actor, "held", "alice")) == 3.0
        settle = tuple(
            Settlement(rid, f"{rid}@r1", r.batch_id, r.payment, answered=rid == "a")
            for rid, r in releases.items()
        )
        first = await actor.exchange(ExchangeIn("r1", settlements=settle))
        again = await actor.exchange(ExchangeIn("r1", settlements=settle))
        assert first.settled == again.settled
        charged = {s.request_id: s.charged for s in first.settled}
        assert charged == {"a": releases["a"].payment, "b": 0.0}
        spent = (await _books(actor, "account", "alice")).spent
        assert spent == pytest.approx(releases["a"].payment)
        assert (await _books(actor, "held", "alice")) == 0.0
        assert actor.revenue == pytest.approx(releases["a"].payment)  # counted once
        assert (await actor.stats()).in_prefill == 0
        await actor.shutdown()

    asyncio.run(body())


def test_a_dead_replicas_lease_expiry_frees_its_slots_queue_and_holds(tmp_path: Path) -> None:
    async def body() -> None:
        # No grace: its holds go with its lease (the grace is tests/cluster/test_hold_expiry.py).
        actor = _actor(tmp_path, ttl_s=0.3, grace_s=0.0)
        await actor.lease("dead")
        out = await actor.exchange(ExchangeIn("dead", tuple(_bid(k, replica="dead")
                                                            for k in "abc")))  # fmt: skip
        await asyncio.sleep(0.01)
        out = await actor.exchange(ExchangeIn("dead"))
        assert len(out.released) == 2 and (await _books(actor, "held", "alice")) == 3.0
        await actor.lease("live")
        for _ in range(3):  # "live" renews; "dead" does not
            await asyncio.sleep(0.15)
            await actor.lease("live")
        stats = await actor.stats()
        assert stats.leases == {"live": stats.leases["live"]}
        assert (stats.queue_depth, stats.in_prefill) == (0, 0)
        await actor.exchange(ExchangeIn("live"))  # the ledger thread has run the release
        assert (await _books(actor, "held", "alice")) == 0.0
        back = await actor.exchange(ExchangeIn("dead"))  # should it come back: refused
        assert [(r.request_id, r.code) for r in back.refused] == [("c", "lease_expired")]
        await actor.shutdown()

    asyncio.run(body())


def test_a_replica_that_never_had_a_lease_is_dropped_when_it_stops_exchanging(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        actor = _actor(tmp_path, ttl_s=0.3, grace_s=0.0)  # no grace: its hold goes with it
        await actor.exchange(ExchangeIn("silent", (_bid("a", replica="silent"),)))
        await asyncio.sleep(0.01)
        assert len((await actor.exchange(ExchangeIn("silent"))).released) == 1
        assert (await actor.stats()).in_prefill == 1
        await asyncio.sleep(0.5)  # no lease renewal, no exchange: it died
        await actor.lease("other")  # any call runs the expiry
        assert (await actor.stats()).in_prefill == 0  # its slot came back
        await actor.exchange(ExchangeIn("other"))
        assert (await _books(actor, "held", "alice")) == 0.0  # and its hold was released
        await actor.shutdown()

    asyncio.run(body())


def test_a_restarted_auction_keeps_a_live_replicas_holds_and_charges_them(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        first = _actor(tmp_path, max_in_prefill=4)
        await first.lease("r1")
        await first.exchange(ExchangeIn("r1", (_bid("a"),)))
        await asyncio.sleep(0.01)
        (release,) = (await first.exchange(ExchangeIn("r1"))).released
        await first.shutdown()  # the auction dies; the replica and its request live on

        second = _actor(tmp_path, max_in_prefill=4)
        assert second.released_at_start == 0  # the live replica's hold stays open
        done = await second.exchange(ExchangeIn("r1", settlements=(
            Settlement("a", "a@r1", release.batch_id, release.payment, True),)))  # fmt: skip
        assert done.instance != "" and [s.charged for s in done.settled] == [release.payment]
        assert (await _books(second, "account", "alice")).spent == pytest.approx(release.payment)
        await second.shutdown()

    asyncio.run(body())


def test_concurrent_bids_of_one_user_over_several_replicas_never_overspend(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        actor = _actor(tmp_path, max_in_prefill=64)
        handle = InProcess(actor)
        links = [AuctionLink(handle, f"r{k}", period_s=0.005) for k in range(4)]

        async def one(k: int) -> str:
            link = links[k % 4]
            try:
                release = await link.admit(f"q{k}", "alice", 0.75, [k, k + 1])
            except Refusal as refusal:
                return str(refusal.status)
            link.started(f"q{k}")
            await link.settle(f"q{k}", answered=True)
            return release.mode

        outcomes = await asyncio.gather(*(one(k) for k in range(40)))
        # 10.0 of budget at 0.75 a bid: at most 13 holds at once; the rest are 402s, and
        # whatever was captured stays within the budget.
        assert set(outcomes) <= {"auction", "402"} and "auction" in outcomes
        account = await _books(actor, "account", "alice")
        assert account.spent <= account.budget and (await _books(actor, "held", "alice")) == 0.0
        assert handle.calls < 40  # one exchange carries many requests' bids and settlements
        for link in links:
            await link.aclose()
        await actor.shutdown()

    asyncio.run(body())


def test_the_link_hands_a_restarted_auction_its_waiting_requests_again(tmp_path: Path) -> None:
    async def body() -> None:
        actor = _actor(tmp_path, max_in_prefill=1)
        handle = InProcess(actor)
        link = AuctionLink(handle, "r1", period_s=0.005)
        first = await link.admit("a", "alice", 1.0, [1])
        waiting = asyncio.ensure_future(link.admit("b", "alice", 1.0, [2]))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # one slot, taken by "a"
        await actor.shutdown()
        handle.actor = _actor(tmp_path, max_in_prefill=1)  # the same ledger, a new instance
        second = await asyncio.wait_for(waiting, 5.0)  # handed in again, released there
        assert second.request_id == "b"
        assert await link.settle("a", True) == first.payment
        assert await link.settle("b", False) == 0.0
        ledger = Ledger(tmp_path / "ledger.sqlite")
        assert ledger.held("alice") == 0.0 and ledger.account("alice").spent == first.payment
        ledger.close()
        await link.aclose()
        await handle.actor.shutdown()

    asyncio.run(body())


def test_a_stalled_ledger_takes_one_call_per_replica_and_kind_not_one_per_period(
    tmp_path: Path,
) -> None:
    """[21] 2: while a replica's exchange (or lease) waits for a ledger that stopped answering,
    its next one is refused untouched (LedgerBusyError: the link sends its contents again), so
    the ledger does not meet a queue of one transaction per period when it resumes. Found on a
    PostgreSQL frozen 30 s under a running service: the pile-up held requests for over a minute
    after it came back (tests/integration/test_service_ledger_stall.py)."""
    from cluster.ray.auction_exchange import LedgerBusyError

    async def body() -> None:
        actor = _actor(tmp_path)
        gate = asyncio.Event()
        real = actor._ledger_call

        async def stalled(fn: Any, *args: Any) -> Any:
            await gate.wait()  # the ledger's thread is stuck until the server comes back
            return await real(fn, *args)

        actor._ledger_call = stalled  # type: ignore[method-assign]
        first = asyncio.ensure_future(actor.exchange(ExchangeIn("r1", (_bid("a"),))))
        lease = asyncio.ensure_future(actor.lease("r1"))
        await asyncio.sleep(0.01)
        for call in (actor.exchange(ExchangeIn("r1", (_bid("a"), _bid("b")))), actor.lease("r1")):
            with pytest.raises(LedgerBusyError, match="r1: its previous"):
                await call
        other = asyncio.ensure_future(actor.exchange(ExchangeIn("r2", (_bid("c", replica="r2"),))))
        await asyncio.sleep(0.01)
        assert not other.done()  # another replica's call waits its turn, it is not refused
        gate.set()
        out, _, _ = await asyncio.gather(first, lease, other)
        assert "b" not in {r.request_id for r in out.refused}  # the refused call touched nothing
        assert actor._in_flight == set()
        again = await actor.exchange(ExchangeIn("r1", (_bid("b"),)))  # the resend goes through
        assert not again.refused
        await actor.shutdown()

    asyncio.run(body())
