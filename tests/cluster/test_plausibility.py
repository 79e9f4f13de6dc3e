"""Events that are impossible for the deployment are dropped and counted (cluster/plausibility.py):
first tokens of requests nobody routed, workers outside the deployment, times that cannot be;
a first token that comes before its route waits for it. Then the forged-TTFT scenario against
the controller actor on a real nats-server: 400 invented 60 s TTFTs leave it ``below``."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats

from cluster.events import FirstTokenEvent, RouteEvent
from cluster.nats_auth import connect_options
from cluster.plausibility import Plausibility
from cluster.ray.controller_actor import ControllerActor
from cluster.wire import encode
from tests.cluster.test_controller_actor import FAST, started, ttfts
from tests.cluster.test_events import ROUTE
from tests.waiting import until

NOW = 1_000_000.0


class Wall:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def _route(rid: str, t: float = NOW, worker: int = 3) -> RouteEvent:
    return ROUTE.model_copy(update={"request_id": rid, "t": t, "worker_id": worker})


def _first(rid: str, ttft: float = 0.2, t: float = NOW + 0.1, worker: int = 3) -> FirstTokenEvent:
    return FirstTokenEvent(request_id=rid, t=t, worker_id=worker, ttft_s=ttft)


def _check(max_routes: int = 100, max_held: int = 100) -> tuple[Plausibility, Wall]:
    wall = Wall()
    check = Plausibility(started_wall=NOW - 100.0, workers={0, 3}, wall=wall,
                         max_routes=max_routes, max_held=max_held)  # fmt: skip
    return check, wall


def test_a_routed_request_first_token_passes_once() -> None:
    check, wall = _check()
    assert check.admit(_route("a")) == [_route("a")]
    assert check.admit(_first("a")) == [_first("a")]
    assert check.admit(_first("a")) == []  # answered already: a replay waits, then is dropped
    wall.now += 3.0
    check.expire()
    assert check.dropped == {"implausible_unrouted": 1}


def test_a_first_token_before_its_route_waits_for_it() -> None:
    check, wall = _check()
    assert check.admit(_first("b")) == []
    wall.now += 1.0
    assert check.admit(_route("b")) == [_route("b"), _first("b")]
    check.expire()
    assert not check.dropped


def test_first_tokens_nobody_routes_are_dropped_after_the_hold() -> None:
    check, wall = _check()
    for i in range(5):
        assert check.admit(_first(f"forged{i}", ttft=60.0)) == []
    wall.now += 1.0
    check.expire()
    assert not check.dropped  # still within the hold
    wall.now += 1.5
    check.expire()
    assert check.dropped == {"implausible_unrouted": 5}


def test_workers_outside_the_deployment_and_impossible_times_are_dropped() -> None:
    check, _ = _check()
    assert check.admit(_route("w", worker=7)) == []
    assert check.admit(_route("f", t=NOW + 60.0)) == []  # from the future
    check.admit(_route("c"))
    assert check.admit(_first("c", worker=9)) == []
    assert check.admit(_first("c", t=NOW + 60.0)) == []
    assert check.admit(_first("c", ttft=500.0)) == []  # longer than the service has run
    check.admit(_route("d"))
    # Routed at NOW, first token at NOW + 30 with a 0.2 s TTFT: it arrived after its routing.
    assert check.admit(_first("d", t=NOW + 30.0)) == []
    assert check.dropped == {"implausible_worker": 2, "implausible_time": 4}


def test_memory_and_the_hold_are_bounded() -> None:
    check, _ = _check(max_routes=3, max_held=2)
    for i in range(5):
        check.admit(_route(f"r{i}"))
    assert check.admit(_first("r0")) == []  # forgotten: the oldest route went first
    assert check.admit(_first("r4")) == [_first("r4")]
    check.admit(_first("x"))
    assert not check.dropped  # r0 and x held: the hold is full
    check.admit(_first("y"))
    assert check.dropped == {"implausible_unrouted": 1}


def test_forged_ttfts_on_the_bus_leave_an_idle_controller_below(nats_url: str) -> None:
    async def main() -> None:
        actor, pub, ns, _ = await started(nats_url)
        # The ingress's own credentials: a process without them is refused by the server
        # (tests/integration/test_nats_permissions.py); this is what a replica could forge.
        raw = await nats.connect(nats_url, **connect_options("ingress"))
        try:
            for i in range(400):
                forged = FirstTokenEvent(request_id=f"forged-{uuid.uuid4().hex[:8]}",
                                         t=time.time(), worker_id=1, ttft_s=60.0)  # fmt: skip
                await raw.publish(f"disagg.{ns}.first_token", encode(forged, "forger", i + 1))
            await raw.flush()
            await until(lambda: actor.plausible.dropped["implausible_unrouted"] == 400,
                        timeout_s=10.0)  # fmt: skip
            snap = await actor.snapshot()
            assert snap.regime == "below" and actor.observed == 0
            assert snap.dropped["implausible_unrouted"] == 400
            await ttfts(pub, actor, [0.1] * 3)  # routed requests still count
            assert actor.observed == 3
        finally:
            await raw.close()
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_the_controller_knows_its_deployment_workers() -> None:
    actor = ControllerActor(nats_url=None, router=None, auction=None, poa=None, settings=FAST,
                            workers={"prefill": [0], "decode": [1, 2]})  # fmt: skip
    assert actor.plausible.workers == {0, 1, 2}


def test_the_poa_estimator_drops_what_the_deployment_rules_out() -> None:
    from cluster.ray.poa_actor import PoaActor

    actor = PoaActor(nats_url=None, epoch_wall=time.time() - 10.0,
                     workers={"prefill": [0], "decode": [1, 2]})  # fmt: skip
    assert actor.plausible.workers == {0, 1, 2}
    now = time.time()
    actor.on_event(_route("outside", t=now, worker=9))  # not a worker of this deployment
    actor.on_event(_first("long", ttft=60.0, t=now, worker=1))  # longer than the service ran
    actor.on_event(_first("unrouted", t=now, worker=1))  # held for its route, which never comes
    actor.plausible.hold_s = 0.0
    actor.tick()
    assert actor.received["route"] == actor.received["first_token"] == 0
    assert actor._snapshot().dropped == {
        "implausible_worker": 1, "implausible_time": 1, "implausible_unrouted": 1}  # fmt: skip
