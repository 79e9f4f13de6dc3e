"""Events that are impossible for the deployment are dropped and counted (cluster/plausibility.py):
first tokens of requests nobody routed, workers outside the deployment, times that cannot be;
a first token that comes before its route waits for it. Then the forged-TTFT scenario against
the controller actor on a real nats-server: 400 invented 60 s TTFTs leave it ``below``."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats

from cluster.engine_activity import MAX_REPORTS, EngineActivity
from cluster.events import EngineLoadEvent, FirstTokenEvent, RouteEvent
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


def _engine(t: float, requests: int, worker: int = 0) -> EngineLoadEvent:
    return EngineLoadEvent(worker_id=worker, role="decode", t=t, ttl_s=1.0, prefill_tokens=0,
                           decode_blocks=0, requests=requests)  # fmt: skip


def _heartbeats(
    check: Plausibility, start: float, end: float, busy_at: float | None = None
) -> None:
    """Worker 0's snapshots every 0.33 s (an idle engine's heartbeat), one busy if asked."""
    t = start
    while t <= end:
        busy = busy_at is not None and abs(t - busy_at) < 0.17
        assert check.admit(_engine(t, 1 if busy else 0)) == [_engine(t, 1 if busy else 0)]
        t += 0.33


def test_a_long_ttft_while_every_engine_said_it_was_idle_is_dropped() -> None:
    """A matched pair passes every check of routes and times; the engines' snapshots (which the
    ingress role cannot publish) say no request was held in its 30 s: dropped."""
    check, _ = _check()
    _heartbeats(check, NOW - 40.0, NOW + 0.1)
    check.admit(_route("forged", t=NOW))
    assert check.admit(_first("forged", ttft=30.0)) == []
    assert check.dropped == {"implausible_idle": 1}
    # The same TTFT while worker 0 held a request at some point of it: evidence, not ruled out.
    busy, _ = _check()
    _heartbeats(busy, NOW - 40.0, NOW + 0.1, busy_at=NOW - 12.0)
    busy.admit(_route("real", t=NOW))
    assert busy.admit(_first("real", ttft=30.0)) == [_first("real", ttft=30.0)]
    # Busy when the span began and idle since (the last change was before it): not ruled out.
    carried, _ = _check()
    carried.admit(_engine(NOW - 31.0, 2))
    carried.admit(_engine(NOW - 1.0, 0))
    carried.admit(_engine(NOW - 0.9, 0))
    carried.admit(_route("queued", t=NOW))
    assert carried.admit(_first("queued", ttft=30.0)) == [_first("queued", ttft=30.0)]


def test_no_snapshots_or_a_short_ttft_rule_nothing_out() -> None:
    silent, _ = _check()  # engines that publish nothing (Dynamo's), or reports lost
    silent.admit(_route("a", t=NOW))
    assert silent.admit(_first("a", ttft=30.0)) == [_first("a", ttft=30.0)]
    idle, _ = _check()
    _heartbeats(idle, NOW - 40.0, NOW + 0.1)
    idle.admit(_route("short", t=NOW))  # under CORROBORATE_ABOVE_S: may leave no snapshot
    assert idle.admit(_first("short", ttft=1.5)) == [_first("short", ttft=1.5)]


def test_engine_activity_is_bounded_and_knows_its_workers() -> None:
    activity = EngineActivity(workers={0, 3})
    assert not activity.observe(_engine(NOW, 0, worker=9))  # not a worker of the deployment
    for i in range(MAX_REPORTS + 100):
        assert activity.observe(_engine(NOW + i * 0.01, 0))
    assert len(activity) == MAX_REPORTS
    assert not activity.observe(_engine(NOW, 0))  # older than the last: ignored
    open_ended = EngineActivity(max_workers=2)
    assert open_ended.observe(_engine(NOW, 0, worker=1))
    assert open_ended.observe(_engine(NOW, 0, worker=2))
    assert not open_ended.observe(_engine(NOW, 0, worker=3))  # a million ids cost nothing


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
