"""The controller actor in-process (no Ray) over a real embedded NATS server (docs/design.md §4,
§5): first_token TTFTs in, regime changes pushed to fake router/auction handles, never stopping."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.bus import EventBus
from cluster.events import CompleteEvent, FirstTokenEvent, RegimeEvent, RouteEvent
from cluster.models import ConfigError
from cluster.nats_auth import connect_options
from cluster.ray.controller_actor import DEFAULT_THETA_S, ControllerActor, ControllerSettings
from cluster.ray.status import AuctionStats, PoaSnapshot
from controller.policy import PolicyTable
from router import Policy
from tests.cluster.test_events import ROUTE
from tests.waiting import until

# Fast settings: 0.1 s ticks, no smoothing, two ticks of dwell; θ1 = 0.5 s, θ2 = 1 s.
FAST = {
    "tick_s": 0.1,
    "window_s": 0.6,
    "min_samples": 5,
    "beta": 1.0,
    "dwell": 2,
    "theta1_s": 0.5,
    "theta2_s": 1.0,
    "call_timeout_s": 0.2,
}


class Method:
    """``.remote(*args)`` returns an awaitable, as a Ray actor method's ObjectRef is."""

    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self.fn(*args)


class FakeRouter:
    def __init__(self) -> None:
        self.calls: list[tuple[float, float, int, str]] = []
        self.failing = False
        self.hang = False
        self.set_policy = Method(self._set_policy)

    async def _set_policy(self, policy: Policy) -> None:
        if self.hang:
            await asyncio.sleep(10)
        if self.failing:
            raise RuntimeError("RayActorError: the actor died")
        self.calls.append((policy.tau, policy.omega, policy.version, policy.regime))


class FakeAuction:
    def __init__(self, queue_depth: object = 3) -> None:
        self.regimes: list[str] = []
        self.queue_depth = queue_depth
        self.set_regime = Method(self._set_regime)
        self.stats = Method(self._stats)

    async def _set_regime(self, regime: str) -> None:
        self.regimes.append(regime)

    async def _stats(self) -> AuctionStats:
        # max_in_prefill 64 and nothing in prefill: an empty queue reads as drained.
        return AuctionStats(
            queue_depth=self.queue_depth,  # type: ignore[arg-type]  (a bad value, on purpose)
            in_flight=0, in_prefill=0, max_in_prefill=64, prefill_workers=None, leases={},
            regime="below", batches=0, revenue=0.0, welfare=0.0, realised_welfare=0.0,
            realised_planned_welfare=0.0, user_welfare={}, released_at_start=0, nats=True,
            users={},
        )  # fmt: skip


class FakePoa:
    def __init__(self, factors: dict[str, Any]) -> None:
        self.snap = PoaSnapshot(
            **factors, impossible=(), n=1, workers=(), attribution_rate=1.0, t=0.0, ticks=1,
            pending=0, joiner={}, received={}, errors=0, dropped={},
        )  # fmt: skip
        self.forgotten: list[float] = []
        self.snapshot = Method(self._snapshot)
        self.forget_before = Method(self._forget_before)

    async def _forget_before(self, since: float) -> PoaSnapshot:
        self.forgotten.append(since)
        return self.snap

    async def _snapshot(self) -> PoaSnapshot:
        return self.snap


async def started(
    url: str, **handles: Any
) -> tuple[ControllerActor, EventBus, str, list[RegimeEvent]]:
    ns = f"t{uuid.uuid4().hex[:8]}"
    args = {"router": None, "auction": None, "poa": None, "settings": FAST} | handles
    actor = ControllerActor(namespace=ns, nats_url=url, **args)
    info = await actor.ready()
    assert info.nats and info.subscribed and info.role == "controller"
    pub = EventBus(url, ns, role="ingress", name="ingress")
    await pub.connect()
    events: list[RegimeEvent] = []
    await pub.subscribe(events.append, kinds=("regime",))  # type: ignore[arg-type]
    return actor, pub, ns, events


def routed(rid: str) -> RouteEvent:
    return ROUTE.model_copy(update={"request_id": rid, "t": time.time()})


def first_token(rid: str, ttft: float) -> FirstTokenEvent:
    return FirstTokenEvent(request_id=rid, t=time.time(), worker_id=ROUTE.worker_id, ttft_s=ttft)


async def ttfts(pub: EventBus, actor: ControllerActor, values: list[float]) -> None:
    """Publish routed requests' first_token events; wait until the actor observed them all."""
    want = actor.observed + len(values)
    for i, ttft in enumerate(values):
        rid = f"r{uuid.uuid4().hex[:6]}{i}"
        await pub.publish(routed(rid))
        await pub.publish(first_token(rid, ttft))
    await pub.flush()
    await until(lambda: actor.observed >= want)


async def regime(actor: ControllerActor, label: str, pub: EventBus, ttft: float) -> None:
    """Keep the window full of ``ttft`` samples until the regime is ``label``."""

    async def reached() -> bool:
        await ttfts(pub, actor, [ttft] * 6)
        return (await actor.snapshot()).regime == label

    await until(reached, timeout_s=2.0)


def test_a_ttft_ramp_switches_regimes_and_pushes_increasing_versions(nats_url: str) -> None:
    async def main() -> None:
        router, auction = FakeRouter(), FakeAuction()
        poa = FakePoa({"poa_hat": 1.2, "poa_routing": 1.1, "poa_capacity": None})
        actor, pub, _, events = await started(nats_url, router=router, auction=auction, poa=poa)
        try:
            await until(lambda: len(router.calls) == 1)  # version 1 goes out at start
            assert router.calls[0] == (0.0, 1.0, 1, "below") and auction.regimes == ["below"]
            await regime(actor, "transition", pub, 0.7)
            await regime(actor, "saturated", pub, 3.0)
            # The start's event (version 1) went out before this test subscribed.
            await until(lambda: len(router.calls) == 3 and len(events) == 2)
            assert actor.bus.sent == 3
            table = PolicyTable()
            assert router.calls[1:] == [
                (table.transition.tau, table.transition.omega, 2, "transition"),
                (table.saturated.tau, table.saturated.omega, 3, "saturated"),
            ]
            assert auction.regimes == ["below", "transition", "saturated"]
            assert [e.regime for e in events] == ["transition", "saturated"]
            assert events[-1].ttft_p99_smoothed_s >= 1.0 and events[-1].tau == 0.8
            snap = await actor.snapshot()
            assert (snap.version, snap.delivered_version, snap.pending) == (3, 3, False)
            assert (snap.tau, snap.omega) == (table.saturated.tau, table.saturated.omega)
            assert snap.ttft_p99_smoothed_s >= 1.0
            assert [c.version for c in snap.changes] == [1, 2, 3]
            assert snap.signals == {
                "queue_depth": 3.0,
                "poa_hat": 1.2,
                "poa_routing": 1.1,
                "poa_capacity": None,
            }
            text = await actor.metrics_text()
            values = {
                s.name: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if not s.labels
            }
            assert values["disagg_regime"] == 2 and values["disagg_router_temperature"] == 0.8
            assert "disagg_ttft_seconds_count" not in values  # the ingress owns TTFT
        finally:
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_a_drained_auction_queue_reads_calm_at_once_and_cuts_the_poa_window(
    nats_url: str,
) -> None:
    async def main() -> None:
        router, auction = FakeRouter(), FakeAuction(queue_depth=40)
        poa = FakePoa({"poa_hat": 30.0, "poa_routing": 1.0, "poa_capacity": 30.0})
        # A 5 s window: the saturated samples would hold the regime up for 5 s by themselves.
        settings = FAST | {"window_s": 5.0}
        actor, pub, _, _ = await started(
            nats_url, router=router, auction=auction, poa=poa, settings=settings
        )
        try:
            await regime(actor, "saturated", pub, 3.0)
            await until(lambda: actor.drain.backlogged)
            # One routed request waits for its first token longer than the detector's
            # down-threshold, (1 - 0.2)·θ1 = 0.4 s: when the auction's queue empties, calm first
            # tokens around it do not make a drain.
            await pub.publish(routed("stuck"))
            await pub.flush()
            await until(lambda: actor.pending.oldest_wait_s(actor.now()) > 0.6)
            auction.queue_depth = 0
            ticks = actor.ticks
            while actor.ticks < ticks + 5:
                await ttfts(pub, actor, [0.05] * 2)
            assert poa.forgotten == [] and actor.drain.backlogged
            # It ends without a first token (its complete event): the backlog has drained.
            await pub.publish(
                CompleteEvent(
                    request_id="stuck", t=time.time(), worker_id=ROUTE.worker_id,
                    prefill_worker_id=None, ttft_s=0.0, itl_s=0.0, e2e_s=1.0,
                    prompt_tokens=8, cached_tokens=0, output_tokens=0, status="error",
                )
            )  # fmt: skip
            await pub.flush()

            async def drained() -> bool:
                await ttfts(pub, actor, [0.05] * 2)  # calm first tokens: the evidence
                return len(poa.forgotten) == 1

            await until(drained)
            snap = await actor.snapshot()
            (drain,) = snap.drains
            assert poa.forgotten == [drain.since] and drain.t > drain.since
            assert snap.regime == "below" and snap.changes[-1].cause == "drain"
            await until(lambda: router.calls[-1][3] == "below")
            # The queue's own requests, whose first tokens come after the drain, do not count.
            dropped = actor.controller.detector.drain_dropped
            await ttfts(pub, actor, [30.0] * 6)
            assert actor.controller.detector.drain_dropped == dropped + 6
            ticks = actor.ticks
            await until(lambda: actor.ticks >= ticks + 3)
            assert (await actor.snapshot()).regime == "below" and len(poa.forgotten) == 1
        finally:
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_a_failing_router_does_not_stop_the_loop_and_gets_the_newest_policy(
    nats_url: str,
) -> None:
    async def main() -> None:
        router = FakeRouter()
        router.failing = True
        actor, pub, _, _ = await started(nats_url, router=router)
        try:
            await until(lambda: actor.push.failures >= 2)  # retried tick after tick
            await regime(actor, "saturated", pub, 3.0)  # the controller went on regardless
            snap = await actor.snapshot()
            assert snap.pending and snap.delivered_version == 0 and router.calls == []
            ticks = snap.ticks
            router.failing = False
            await until(lambda: actor.push.delivered_version == 2)
            assert router.calls == [(0.8, 0.1, 2, "saturated")]  # only the newest one
            # A router that hangs: the call times out, ticking goes on, the push retries.
            router.hang = True
            await regime(actor, "below", pub, 0.01)
            # Ticks go on while the router hangs: wait for both, not for one and then count the
            # other (how many ticks fit in two call timeouts depends on the machine's load).
            await until(
                lambda: actor.push.failures >= snap.push_failures + 2 and actor.ticks > ticks + 5,
                timeout_s=10.0, what="ticks and push retries while the router hangs",
            )  # fmt: skip
            assert actor.tick_errors == 0
            router.hang = False
            await until(lambda: actor.push.delivered_version == 3)
            assert router.calls[-1] == (0.0, 1.0, 3, "below")
        finally:
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_malformed_messages_and_bad_signals_are_not_fatal(nats_url: str) -> None:
    async def main() -> None:
        poa = FakePoa({"poa_hat": float("nan"), "poa_routing": "high", "poa_capacity": True})
        auction = FakeAuction(queue_depth=None)
        actor, pub, ns, _ = await started(nats_url, auction=auction, poa=poa)
        raw = await nats.connect(nats_url, **connect_options("ingress"))
        try:
            await raw.publish(f"disagg.{ns}.first_token", b"\x00garbage")
            await raw.publish(f"disagg.{ns}.first_token", b'{"v": 1, "ttft_s": -1}')
            await raw.flush()
            await until(lambda: sum(actor._snapshot().dropped.values()) >= 2)
            await ttfts(pub, actor, [0.1])  # still subscribed
            await until(lambda: actor.ticks >= 2)
            snap = await actor.snapshot()
            assert snap.tick_errors == 0 and set(snap.signals.values()) == {None}
            assert snap.dropped == {"malformed": 1, "schema": 1}
        finally:
            await raw.close()
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_no_handles_and_no_nats() -> None:
    async def main() -> None:
        actor = ControllerActor(nats_url=None, router=None, auction=None, poa=None, settings=FAST)
        info = await actor.ready()
        assert info.nats and not info.subscribed
        for i in range(10):
            actor.on_event(routed(f"r{i}"))
            actor.on_event(first_token(f"r{i}", 5.0))
        # The regime switches inside a tick, whose push (to nobody: nothing stays pending)
        # comes after an await: on a busy machine a snapshot can fall between the two.
        await until(lambda: actor.controller.regime.label == "saturated"
                    and actor.push.target.pending is None)  # fmt: skip
        snap = await actor.snapshot()
        assert snap.version == 2 and not snap.pending and snap.delivered_version == 0
        await actor.shutdown()

    asyncio.run(main())


def test_settings() -> None:
    defaults = ControllerSettings()  # every field has a default (cluster/config.py)
    t = defaults.thresholds()
    assert (t.theta1, t.theta2) == DEFAULT_THETA_S
    assert (defaults.tick_s, defaults.window_s, defaults.min_samples) == (1.0, 10.0, 20)
    assert (defaults.beta, defaults.hysteresis, defaults.dwell) == (0.3, 0.2, 3)
    assert defaults.policy.table() == PolicyTable()
    assert ControllerSettings.model_validate(defaults.model_dump()) == defaults
    calibrated = ControllerSettings.model_validate({"calibrate": {"baseline_s": 0.1}})
    t = calibrated.thresholds()
    assert (t.theta1, t.theta2) == pytest.approx((0.5, 1.5))
    custom = {"theta1_s": 1, "theta2_s": 2, "policy": {"saturated": {"tau": 2, "omega": 0}}}
    assert ControllerSettings.model_validate(custom).policy.table().saturated.tau == 2.0
    for bad in (
        {"theta1_s": 1.0},
        {"theta2_s": 1.0},
        {"theta1_s": 2.0, "theta2_s": 1.0},
        {"theta1_s": 1.0, "theta2_s": 2.0, "calibrate": {"baseline_s": 0.1}},
        {"calibrate": {"baseline_s": 0.1, "below_x": 5, "saturated_x": 5}},
        {"calibrate": {"baseline_s": 0}},
        {"theta1_s": 1.0, "theta2_s": 2.0, "tick_s": 0.01},
        {"theta1_s": 1.0, "theta2_s": 2.0, "tick_s": 61},
        {"theta1_s": 1.0, "theta2_s": 2.0, "beta": 0},
        {"theta1_s": 1.0, "theta2_s": 2.0, "dwell": 1.5},
        {"theta1_s": 1.0, "theta2_s": 2.0, "hysteresis": 1.0},
        {"theta1_s": "1", "theta2_s": 2.0},
        {"theta1_s": 1.0, "theta2_s": 2.0, "policy": {"below": {"tau": -1, "omega": 1}}},
        {"theta1_s": 1.0, "theta2_s": 2.0, "surprise": 1},
    ):
        with pytest.raises(ConfigError):
            ControllerActor(nats_url=None, router=None, auction=None, poa=None, settings=bad)


def test_routing_by_evidence_is_a_setting_and_the_table_the_default() -> None:
    table = ControllerActor(nats_url=None, router=None, auction=None, poa=None, settings=FAST)
    assert table.controller.evidence is None
    evidence = ControllerActor(nats_url=None, router=None, auction=None, poa=None,
                               settings={**FAST, "routing": "evidence"})  # fmt: skip
    assert evidence.controller.evidence is not None
    assert evidence.controller.evidence.table == evidence.controller.table
