"""The admission lease (cluster/dataplane/admission.py and the auction actor's ``lease``):
local FCFS admission within a replica's share of slots, the auction for everything else, slots
returned when a lease expires or overflows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cluster.dataplane.admission import AdmissionGate, Lease
from cluster.ray.auction_actor import AuctionActor
from tests.cluster.auction_client import Replica


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def _lease(slots: int = 2, fcfs: bool = True, **budgets: float) -> Lease:
    return Lease("L1", "r1", slots, "below", fcfs, budgets or {"alice": 5.0}, ttl_s=3.0)


def test_the_gate_admits_locally_within_its_share_and_then_sends_to_the_auction() -> None:
    gate = AdmissionGate(Clock())
    assert gate.try_admit("r0", "alice", 1.0) is None  # no lease yet
    gate.grant(_lease(slots=2))
    assert gate.try_admit("r1", "alice", 1.0) is not None
    assert gate.try_admit("r2", "anonymous", 0.0) is not None
    assert gate.try_admit("r3", "alice", 0.0) is None  # share full: r3 queues at the auction
    gate.started("r1")
    assert gate.try_admit("r4", "alice", 0.0) is None  # overflowed: r4 must not overtake r3
    gate.grant(_lease(slots=2))
    assert gate.try_admit("r4", "alice", 0.0) is not None
    assert gate.is_local("r1") and not gate.is_local("r3")
    for rid in ("r1", "r2", "r4"):
        gate.finished(rid)
    assert gate.in_prefill == gate.in_flight == 0


def test_bids_the_auction_would_refuse_are_left_to_it() -> None:
    gate = AdmissionGate(Clock())
    gate.grant(_lease(alice=5.0))
    assert gate.try_admit("a", "alice", 5.0) is not None
    assert gate.try_admit("b", "alice", 5.5) is None  # above the budget: the auction says 402
    assert gate.try_admit("c", "mallory", 0.0) is None  # no account: the auction says 401
    assert gate.try_admit("d", "anonymous", 0.5) is None  # anonymous bids nothing


def test_an_expired_or_revoked_lease_admits_nothing() -> None:
    clock = Clock()
    gate = AdmissionGate(clock)
    gate.grant(_lease())
    clock.now += 3.0
    assert not gate.valid() and gate.try_admit("a", "alice", 0.0) is None
    gate.grant(_lease(fcfs=False))
    assert gate.try_admit("b", "alice", 0.0) is None


def test_a_regime_out_of_below_stops_local_admission_until_the_next_lease() -> None:
    gate = AdmissionGate(Clock())
    gate.grant(_lease())
    gate.on_regime("below")
    assert gate.try_admit("a", "alice", 0.0) is not None
    gate.on_regime("saturated")
    assert gate.try_admit("b", "alice", 0.0) is None and gate.overflowed
    gate.grant(_lease(fcfs=False))
    assert gate.try_admit("c", "alice", 0.0) is None


def test_a_lease_is_checked() -> None:
    with pytest.raises(ValueError, match="slots"):
        Lease("L", "r", -1, "below", True)
    with pytest.raises(ValueError, match="ttl_s"):
        Lease("L", "r", 1, "below", True, ttl_s=0.0)


# -- the auction actor's side ------------------------------------------------------------------


def _actor(tmp_path: Path, ttl_s: float = 0.5, **settings: Any) -> AuctionActor:
    return AuctionActor(
        settings={"max_in_prefill": 4, "queue_threshold": 4, "batch_window_ms": 1.0} | settings,
        ledger=str(tmp_path / "ledger.sqlite"),
        users=[{"name": "alice", "budget": 10.0}],
        nats_url=None,
        lease_ttl_s=ttl_s,
    )


def test_leases_split_the_slots_and_reserve_them(tmp_path: Path) -> None:
    async def body() -> None:
        actor = _actor(tmp_path, ttl_s=30.0)
        one = await actor.lease("r1")
        assert (one.slots, one.fcfs, one.regime) == (4, True, "below")
        assert one.budgets == {"alice": 10.0}
        two = await actor.lease("r2")
        assert two.slots == 2  # two live leases share max_in_prefill
        one = await actor.lease("r1")
        assert one.slots == 2
        # Every slot is leased: a request sent to the auction waits for one.
        other, r1 = Replica(actor, "r3"), Replica(actor, "r1", lease_id=lambda: one.lease_id)
        admit = asyncio.ensure_future(other.admit("q1", "alice", 1.0, [1, 2, 3]))
        await asyncio.sleep(0.05)
        assert not admit.done()
        # r1 ran over its share: its slots go back to the auction at once.
        late = r1.admit("q2", "alice", 1.0, [1, 2])
        released = await asyncio.wait_for(asyncio.gather(admit, late), 1.0)
        assert [r.mode for r in released] == ["fcfs", "fcfs"]
        assert (await actor.stats()).leases == {"r1": 0, "r2": 2, "r3": 0}  # r3: no lease
        assert await other.finished("q1", True) == 0.0  # FCFS: free
        assert await r1.finished("q2", True) == 0.0
        await other.aclose()
        await r1.aclose()
        await actor.shutdown()

    asyncio.run(body())


def test_a_dead_replicas_lease_expires_and_returns_its_slots(tmp_path: Path) -> None:
    async def body() -> None:
        # A TTL far above what a hold's fsync can take on a slow disk, so that the check
        # below sees the lease still live.
        actor = _actor(tmp_path, ttl_s=2.0)
        await actor.lease("dead")
        other = Replica(actor, "r2")
        admit = asyncio.ensure_future(other.admit("q1", "alice", 0.0, [1, 2, 3]))
        await asyncio.sleep(0.2)
        assert not admit.done()  # its replica holds every slot
        released = await asyncio.wait_for(admit, 10.0)  # until its lease expires (2 s)
        assert released.position == 0
        await other.finished("q1", True)
        await other.aclose()
        await actor.shutdown()

    asyncio.run(body())


def test_no_fcfs_lease_at_saturation_or_with_a_queue(tmp_path: Path) -> None:
    async def body() -> None:
        actor = _actor(tmp_path)
        await actor.set_regime("saturated")
        lease = await actor.lease("r1")
        assert (lease.fcfs, lease.slots, lease.regime) == (False, 0, "saturated")
        await actor.set_regime("below")
        assert (await actor.lease("r1")).fcfs
        await actor.shutdown()

    asyncio.run(body())
