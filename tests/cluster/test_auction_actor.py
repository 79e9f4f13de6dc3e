"""The auction actor in-process (no Ray, no NATS): admission, holds and captures
(cluster/ray/auction_actor.py), its requests handed in as an ingress replica hands them
(tests/cluster/auction_client.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from auction import Request, run_auction
from auction.admission import Release, split_payments
from cluster.dataplane.exchange import Refusal
from cluster.events import AuctionEvent
from cluster.ledger.sqlite import Ledger, LedgerError
from cluster.models import ConfigError, validate_model
from cluster.ray.auction_actor import AuctionActor
from cluster.ray.auction_settings import AuctionSettingsModel
from cluster.ray.status import AuctionStats
from tests.cluster.auction_client import Replica
from tests.ledger_backends import LedgerAt

USERS = [
    {"name": "alice", "budget": 10.0},
    {"name": "bob", "budget": 5.0},
    {"name": "carol", "budget": 5.0, "key_sha256": "ab" * 32},  # extra keys are ignored
]


def _actor(where: Path | LedgerAt, ttl_s: float = 30.0, **settings: Any) -> AuctionActor:
    at = (
        where
        if isinstance(where, LedgerAt)
        else LedgerAt("sqlite", str(where / "ledger.db"), "disaggctl", where)
    )
    return AuctionActor(
        settings=settings, ledger=at.location, ledger_schema=at.schema, users=USERS,
        nats_url=None, lease_ttl_s=ttl_s, hold_grace_s=ttl_s,
    )  # fmt: skip


def _run(
    where: Path | LedgerAt,
    body: Callable[[AuctionActor, Replica], Awaitable[None]],
    ttl_s: float = 30.0,
    **settings: Any,
) -> None:
    async def main() -> None:
        actor = _actor(where, ttl_s, **settings)
        replica = Replica(actor)
        try:
            await body(actor, replica)
        finally:
            await replica.aclose()
            await actor.shutdown()

    asyncio.run(main())


def _users(stats: AuctionStats) -> dict[str, tuple[float, float]]:
    return {u: (s.spent, s.held) for u, s in stats.users.items()}


async def _refused(admit: Awaitable[Release]) -> tuple[int, str]:
    with pytest.raises(Refusal) as info:
        await admit
    return info.value.status, info.value.code


def test_fcfs_below_saturation_holds_the_bid_and_charges_nothing(tmp_path: Path) -> None:
    async def body(actor: AuctionActor, replica: Replica) -> None:
        ready = await actor.ready()
        assert ready.node_id is None and ready.released_at_start == 0
        admitted = await replica.admit("r1", "alice", 2.5, [1, 2, 3])
        assert admitted == Release("r1", position=0, payment=0.0, batch_id=None, mode="fcfs")
        stats = await actor.stats()
        assert _users(stats)["alice"] == (0.0, 2.5) and stats.in_prefill == 1
        await replica.started("r1")
        assert await replica.finished("r1", answered=True) == 0.0
        assert await replica.finished("r1", answered=True) == 0.0  # idempotent
        assert _users(await actor.stats())["alice"] == (0.0, 0.0)
        # Anonymous traffic bids 0, holds nothing and needs no account.
        assert (await replica.admit("r2", "anonymous", 0.0, [4])).mode == "fcfs"
        assert await replica.finished("r2", answered=True) == 0.0
        assert await _refused(replica.admit("r3", "anonymous", 0.5, [4])) == (
            402, "budget_exceeded"
        )  # fmt: skip

    _run(tmp_path, body)


def test_saturated_requests_are_auctioned_in_dfs_bid_order_and_pay_vcg_shares(
    tmp_path: Path,
) -> None:
    specs = [  # request id, user, bid, prompt: shared prefixes and a user with two requests
        ("q1", "alice", 1.0, [1, 2, 3]),
        ("q2", "bob", 4.0, [1, 2, 4]),
        ("q3", "alice", 3.0, [7, 8]),
        ("q4", "carol", 2.0, [7, 5]),
    ]

    async def body(actor: AuctionActor, replica: Replica) -> None:
        await actor.set_regime("saturated")
        results = await asyncio.gather(*(replica.admit(*spec) for spec in specs))
        batch = [Request(r, u, t, b, arrival=k) for k, (r, u, b, t) in enumerate(specs)]
        expected = run_auction(batch, "dfs-bid")
        shares = split_payments(expected.payments, batch)
        by_id = {spec[0]: result for spec, result in zip(specs, results, strict=True)}
        assert [by_id[r].position for r in expected.order] == [1, 2, 3, 4]
        assert {r.mode for r in results} == {"auction"}
        assert len({r.batch_id for r in results}) == 1
        for rid, result in by_id.items():
            assert result.payment == shares[rid]
        assert expected.revenue > 0
        held = _users(await actor.stats())
        assert held["alice"] == (0.0, 4.0) and held["bob"] == (0.0, 4.0)
        charged = {}
        for rid in expected.order:
            await replica.started(rid)
            charged[rid] = await replica.finished(rid, answered=True)
        assert charged == pytest.approx(shares, abs=1e-6)
        stats = await actor.stats()
        assert stats.revenue == pytest.approx(expected.revenue, abs=1e-5)
        assert stats.batches == 1 and stats.in_flight == 0
        # Started in the planned order: the realised TTFT order is the planned one.
        assert stats.realised_welfare == pytest.approx(stats.welfare)
        assert stats.realised_planned_welfare == pytest.approx(stats.welfare)
        for user, paid in expected.payments.items():
            assert _users(stats)[user] == (pytest.approx(paid, abs=1e-5), 0.0)
        text = await actor.metrics_text()
        assert "disagg_auction_revenue_total" in text and "disagg_auction_welfare" in text
        assert "disagg_auction_realised_welfare" in text
        assert "disagg_ttft_seconds" not in text  # only the families this actor owns

    _run(tmp_path, body, batch_size=4, batch_window_ms=10_000.0)


def test_a_bid_above_the_remaining_budget_is_refused_before_queueing(tmp_path: Path) -> None:
    async def body(actor: AuctionActor, replica: Replica) -> None:
        with pytest.raises(Refusal, match="5") as info:  # what bob has left is in the message
            await replica.admit("r1", "bob", 5.5, [1])
        assert (info.value.status, info.value.code) == (402, "budget_exceeded")
        await replica.admit("r2", "bob", 3.0, [1])  # holds 3 of bob's 5
        assert await _refused(replica.admit("r3", "bob", 2.5, [2])) == (402, "budget_exceeded")
        assert await _refused(replica.admit("r4", "mallory", 0.0, [1])) == (401, "unknown_user")
        with pytest.raises(ValueError, match="bid"):  # refused where it is made, never sent
            await replica.admit("r5", "bob", -1.0, [1])
        other = Replica(actor, "r2")  # another replica's request of the same id
        try:
            assert await _refused(other.admit("r2", "bob", 1.0, [1])) == (400, "invalid_request")
        finally:
            await other.aclose()
        stats = await actor.stats()
        assert stats.queue_depth == 0 and stats.in_flight == 1
        assert _users(stats)["bob"] == (0.0, 3.0)

    _run(tmp_path, body)


def test_not_answered_releases_the_hold_and_answered_captures_it(tmp_path: Path) -> None:
    async def body(actor: AuctionActor, replica: Replica) -> None:
        await actor.set_regime("saturated")
        first = await asyncio.gather(
            replica.admit("a", "alice", 2.0, [1]), replica.admit("b", "bob", 1.0, [2])
        )
        assert {r.mode for r in first} == {"auction"}
        assert await replica.finished("b", answered=False) == 0.0
        paid = await replica.finished("a", answered=True)
        assert paid == pytest.approx(1.0)  # alice outbid bob: she pays his externality
        assert await replica.finished("never-admitted", answered=True) == 0.0
        users = _users(await actor.stats())
        assert users["alice"] == (pytest.approx(1.0), 0.0) and users["bob"] == (0.0, 0.0)

    _run(tmp_path, body, batch_size=2, batch_window_ms=10_000.0)


def test_a_restart_releases_a_dead_replicas_holds_and_keeps_charges(ledger_at: LedgerAt) -> None:
    async def first_life(actor: AuctionActor, replica: Replica) -> None:
        await actor.set_regime("saturated")
        await asyncio.gather(
            replica.admit("a", "alice", 2.0, [1]), replica.admit("b", "bob", 1.0, [2])
        )
        await replica.finished("a", answered=True)
        # "b" is never answered: its replica dies with the auction, the hold open.

    _run(ledger_at, first_life, ttl_s=0.05, batch_size=2, batch_window_ms=10_000.0)
    with ledger_at.open() as ledger:  # on either backend (SQLite, or PostgreSQL on a cluster)
        assert ledger.held("bob") == 1.0 and ledger.account("alice").spent == 1.0

    async def second_life(actor: AuctionActor, replica: Replica) -> None:
        # Nobody renewed "b"'s hold past its owner's lease and grace: released at start.
        assert actor.released_at_start == 1
        stats = await actor.stats()
        assert _users(stats) == {"alice": (1.0, 0.0), "bob": (0.0, 0.0), "carol": (0.0, 0.0)}

    asyncio.run(asyncio.sleep(0.2))
    _run(ledger_at, second_life)


def test_a_caller_gone_while_queued_leaves_and_releases_its_hold(tmp_path: Path) -> None:
    async def body(actor: AuctionActor, replica: Replica) -> None:
        await actor.set_regime("saturated")
        waiting = asyncio.ensure_future(replica.admit("r1", "alice", 4.0, [1]))
        await asyncio.sleep(0.05)
        stats = await actor.stats()
        assert stats.queue_depth == 1 and _users(stats)["alice"] == (0.0, 4.0)
        waiting.cancel()  # the client hung up: the link withdraws the request
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(100):  # the withdrawal rides the next exchange
            stats = await actor.stats()
            if stats.queue_depth == 0 and _users(stats)["alice"] == (0.0, 0.0):
                break
            await asyncio.sleep(0.01)
        assert stats.queue_depth == 0 and _users(stats)["alice"] == (0.0, 0.0)

    _run(tmp_path, body, batch_window_ms=60_000.0)


def test_the_batch_window_and_the_prefill_slots(tmp_path: Path) -> None:
    async def body(actor: AuctionActor, replica: Replica) -> None:
        first = await replica.admit("r1", "alice", 1.0, [1])  # below: FCFS, takes the one slot
        assert first.mode == "fcfs"
        second = asyncio.ensure_future(replica.admit("r2", "bob", 1.0, [2]))
        await asyncio.sleep(0.05)
        assert not second.done()  # no slot until r1's first token
        await replica.started("r1")
        assert (await second).mode == "fcfs"
        await actor.set_regime("saturated")
        await replica.started("r2")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        alone = await replica.admit("r3", "carol", 1.0, [3])  # waits out the 30 ms window
        assert loop.time() - t0 >= 0.029
        assert (alone.mode, alone.position, alone.payment) == ("auction", 1, 0.0)

    _run(tmp_path, body, max_in_prefill=1, batch_window_ms=30.0)


def test_a_full_queue_is_refused_without_touching_the_ledger(tmp_path: Path) -> None:
    async def body(actor: AuctionActor, replica: Replica) -> None:
        await actor.set_regime("saturated")
        waiting = asyncio.ensure_future(replica.admit("r1", "alice", 1.0, [1]))
        await asyncio.sleep(0.02)
        assert await _refused(replica.admit("r2", "alice", 1.0, [1])) == (503, "queue_full")
        assert _users(await actor.stats())["alice"] == (0.0, 1.0)  # r1's hold only
        waiting.cancel()

    _run(tmp_path, body, max_queue=1, batch_window_ms=60_000.0)


def test_each_batch_is_published_as_an_auction_event(tmp_path: Path) -> None:
    published: list[AuctionEvent] = []

    class FakeBus:
        async def publish(self, event: AuctionEvent) -> None:
            published.append(event)

    async def body(actor: AuctionActor, replica: Replica) -> None:
        actor._bus, actor._bus_up = FakeBus(), True  # type: ignore[assignment]
        await actor.set_regime("saturated")
        await asyncio.gather(
            replica.admit("a", "alice", 2.0, [1]), replica.admit("b", "bob", 1.0, [2])
        )
        await asyncio.sleep(0)
        (event,) = published
        assert (event.batch_id, event.n, event.order) == (0, 2, ("a", "b"))
        assert event.payments == {"alice": 1.0, "bob": 0.0} and event.welfare == 2.0
        # An id past the event's bounds costs the event, never the request.
        long_id = "x" * 300
        admitted = await asyncio.gather(
            replica.admit(long_id, "alice", 1.0, [1]), replica.admit("c", "bob", 1.0, [2])
        )
        assert {a.mode for a in admitted} == {"auction"} and len(published) == 1
        actor._bus, actor._bus_up = None, False

    _run(tmp_path, body, batch_size=2, batch_window_ms=10_000.0)


def test_settings_and_users_are_validated_at_the_edge(tmp_path: Path) -> None:
    assert AuctionSettingsModel().model_dump() == {
        "batch_size": 32,
        "batch_window_ms": 50.0,
        "queue_threshold": 8,
        "max_in_prefill": None,  # derived from the engines' batches (test below)
        "scheduler": "dfs-bid",
        "max_queue": 10_000,
    }
    for bad in ({"batch_size": 0}, {"batch_size": 5000}, {"scheduler": "x"}, {"extra": 1}):
        with pytest.raises(ConfigError):
            validate_model(AuctionSettingsModel, bad)
    with pytest.raises(ConfigError, match="auction settings"):
        _actor(tmp_path, batch_size="32")
    with pytest.raises(ConfigError, match=r"users\[0\]"):
        AuctionActor(
            settings={},
            ledger=str(tmp_path / "l.db"),
            users=[{"name": "x", "budget": -1.0}],
            nats_url=None,
        )


def test_a_derived_max_in_prefill_follows_the_prefill_pool_and_a_fixed_one_stays(
    tmp_path: Path,
) -> None:
    def actor(**settings: Any) -> AuctionActor:
        return AuctionActor(
            settings=settings, ledger=str(tmp_path / "l.db"), users=USERS, nats_url=None,
            slots_per_prefill_worker=128, prefill_workers=1,
        )  # fmt: skip

    async def main() -> None:
        derived = actor()
        fixed = actor(max_in_prefill=16)
        try:
            assert derived.settings.max_in_prefill == 128 and derived._leases.max_in_prefill == 128
            assert await derived.set_prefill_workers(2) == 256  # a re-split added one
            assert derived._queue.slots == 256 and derived._leases.max_in_prefill == 256
            stats = await derived.stats()  # what the controller compares with its pools
            assert (stats.max_in_prefill, stats.prefill_workers) == (256, 2)
            assert await derived.set_prefill_workers(0) == 1  # never closed entirely
            assert await fixed.set_prefill_workers(3) == 16  # the config's number stands
            with pytest.raises(ValueError, match="count"):
                await derived.set_prefill_workers(-1)
        finally:
            await derived.shutdown()
            await fixed.shutdown()

    asyncio.run(main())
    with pytest.raises(ValueError, match="prefill_workers"):
        AuctionActor(settings={}, ledger=str(tmp_path / "l.db"), users=USERS, nats_url=None,
                     prefill_workers=-1)  # fmt: skip


def test_a_users_file_budget_change_keeps_the_ledgers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _run(tmp_path, lambda actor, replica: asyncio.sleep(0))
    changed = [{"name": "alice", "budget": 99.0}, {"name": "anonymous", "budget": 1.0}]
    with caplog.at_level(logging.WARNING, logger="cluster.ray.auction_actor"):
        actor = AuctionActor(
            settings={}, ledger=str(tmp_path / "ledger.db"), users=changed, nats_url=None
        )
    assert "keeping the ledger's" in caplog.text
    asyncio.run(actor.shutdown())
    with Ledger(tmp_path / "ledger.db") as ledger:
        assert ledger.account("alice").budget == 10.0
        assert [a.user for a in ledger.accounts()] == ["alice", "bob", "carol"]


def test_a_ledger_that_cannot_open_fails_the_constructor(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(LedgerError, match="a-file"):
        AuctionActor(
            settings={},
            ledger=str(tmp_path / "a-file" / "l.db"),
            users=USERS,
            nats_url=None,
        )
