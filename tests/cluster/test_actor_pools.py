"""The serve runtime's re-split (cluster/ray/pools.py, cluster/ray/controller_pools.py) against
in-process stand-ins for the router and worker actors: which worker moves, the step sequence
and its events and metrics, an abandoned drain, the controller actor's wiring and settings."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cluster.events import CompleteEvent, EngineLoadEvent, PoolsEvent, RouteEvent
from cluster.models import ConfigError, validate_model
from cluster.ray.controller_actor import ControllerActor, ControllerSettings
from cluster.ray.controller_pools import ArrivalMeter, WallPlanner
from cluster.ray.pools import ActorPools
from cluster.sim.profile import load_profile
from cluster.sim.wallclock import EngineLoad
from controller.resplit import Pools
from controller.traffic import TrafficShape
from telemetry import metrics
from tests.cluster.test_events import ROUTE


class Method:
    def __init__(self, fn: Callable[..., Awaitable[Any]], log: list[Any], name: str) -> None:
        self.fn, self.log, self.name = fn, log, name

    def remote(self, *args: Any) -> Awaitable[Any]:
        self.log.append((self.name, *args))
        return self.fn(*args)


class Worker:
    def __init__(self, role: str, wid: int, load: int, log: list[Any], drains: bool = True):
        self.role, self.wid, self.drains = role, wid, drains
        self.resumed = False

        async def load_(*_: Any) -> EngineLoad:
            return EngineLoad(load, load, load, 100, waiting=0, running=1)

        async def drain(timeout: float) -> bool:
            return self.drains

        async def resume() -> bool:
            self.resumed = True
            return True

        async def ready() -> dict[str, Any]:
            return {"worker_id": wid, "role": role}

        for name, fn in (("load", load_), ("drain", drain), ("resume", resume), ("ready", ready)):
            setattr(self, name, Method(fn, log, f"{role}-{wid}.{name}"))


class Router:
    def __init__(self, log: list[Any]) -> None:
        async def noop(*_: Any) -> None:
            return None

        self.remove_worker = Method(noop, log, "router.remove_worker")
        self.add_worker = Method(noop, log, "router.add_worker")


class Launcher:
    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.started: list[Worker] = []

    async def start(self, role: str, wid: int) -> Worker:
        self.log.append(("launch", role, wid))
        worker = Worker(role, wid, 0, self.log)
        self.started.append(worker)
        return worker

    async def stop(self, role: str, wid: int, handle: Any) -> None:
        self.log.append(("stop", role, wid, handle))

    def find(self, role: str, wid: int) -> Any:
        return None


def _pools(drains: bool = True) -> tuple[ActorPools, list[Any], list[PoolsEvent], list[float]]:
    log: list[Any] = []
    events: list[PoolsEvent] = []
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    workers = {
        "prefill": {0: Worker("prefill", 0, 100, log)},
        "decode": {1: Worker("decode", 1, 50, log, drains), 2: Worker("decode", 2, 7, log, drains)},
    }
    pools = ActorPools(
        workers=workers,  # type: ignore[arg-type]
        router=Router(log),
        launcher=Launcher(log),
        publish=events.append,
        warmup_s=7.5,
        drain_timeout_s=3.0,
        call_timeout_s=1.0,
        sleep=sleep,
    )
    return pools, log, events, slept


def _gauge(role: str) -> float:
    return metrics.POOL_WORKERS.labels(role=role)._value.get()


def test_moves_the_least_loaded_decode_worker_through_drain_stop_start_warm() -> None:
    pools, log, events, slept = _pools()
    before = metrics.RESPLITS._value.get()
    assert pools.pools() == Pools(1, 2) and not pools.resplitting()

    result = asyncio.run(pools.move("prefill", "capacity-bound"))

    assert result == "warm"
    assert pools.pools() == Pools(2, 1) and not pools.resplitting()
    assert sorted(pools.workers["prefill"]) == [0, 2] and list(pools.workers["decode"]) == [1]
    names = [e[0] for e in log if not str(e[0]).endswith(".load")]
    assert names == [
        "router.remove_worker",
        "decode-2.drain",
        "stop",
        "launch",
        "router.add_worker",
    ]
    assert ("router.remove_worker", "decode", 2) in log and (
        "router.add_worker",
        "prefill",
        2,
    ) in log
    assert slept == [7.5]  # the warm-up, before the router sees the new worker
    assert [e.action for e in events] == ["resplit_start", "drained", "warm"]
    assert events[0].prefill_workers == (0,) and events[0].decode_workers == (1,)
    assert events[-1].prefill_workers == (0, 2) and events[-1].decode_workers == (1,)
    assert "capacity-bound" in events[0].reason
    assert metrics.RESPLITS._value.get() == before + 1
    assert _gauge("prefill") == 2 and _gauge("decode") == 1
    assert metrics.RESPLIT_IN_PROGRESS._value.get() == 0
    assert [s.action for s in pools.snapshot().steps] == ["resplit_start", "drained", "warm"]


def test_a_drain_that_times_out_abandons_and_the_worker_serves_again() -> None:
    pools, log, events, slept = _pools(drains=False)
    before = metrics.RESPLITS._value.get()

    result = asyncio.run(pools.move("prefill", "capacity-bound"))

    assert result == "abandoned" and pools.abandoned == 1
    assert pools.pools() == Pools(1, 2) and sorted(pools.workers["decode"]) == [1, 2]
    assert pools.workers["decode"][2].resumed
    assert ("router.add_worker", "decode", 2) in log
    assert not any(e[0] in ("stop", "launch") for e in log) and slept == []
    assert [e.action for e in events] == ["resplit_start", "abandoned"]
    assert events[-1].reason.startswith("abandoned") and events[-1].decode_workers == (1, 2)
    assert metrics.RESPLITS._value.get() == before


def test_a_move_called_off_while_its_worker_drains_puts_it_back_at_once() -> None:
    async def main() -> None:
        pools, log, events, slept = _pools()
        worker = pools.workers["decode"][2]
        going = asyncio.Event()

        async def drain(timeout: float) -> bool:  # drains until resumed, as a busy worker does
            going.set()
            while not worker.resumed:
                await asyncio.sleep(0.001)
            return False

        worker.drain = Method(drain, log, "decode-2.drain")  # type: ignore[method-assign]
        assert not pools.cancel("nothing under way")
        pools.resplit("prefill", "spike")
        await asyncio.wait_for(going.wait(), 10)
        assert pools.pools() == Pools(1, 1)
        assert pools.cancel("the overload ended") and not pools.cancel("twice")
        assert await pools.wait() == "cancelled"
        assert pools.cancelled == 1 and pools.abandoned == 0 and worker.resumed
        assert pools.pools() == Pools(1, 2) and not pools.resplitting()
        assert not any(e[0] in ("stop", "launch") for e in log) and slept == []
        assert [e.action for e in events] == ["resplit_start", "cancelled"]
        assert events[-1].reason == "cancelled: the overload ended"
        assert events[-1].decode_workers == (1, 2)
        assert pools.snapshot().cancelled == 1

    asyncio.run(main())


def test_resplit_runs_in_the_background_one_at_a_time() -> None:
    async def main() -> None:
        pools, _, events, _ = _pools()
        pools.resplit("prefill", "r")
        assert pools.resplitting()
        with pytest.raises(RuntimeError, match="in progress"):
            pools.resplit("prefill", "again")
        assert await pools.wait() == "warm"
        assert not pools.resplitting() and len(events) == 3

    asyncio.run(main())


def test_the_last_decode_worker_never_moves_and_failures_are_reported() -> None:
    pools, _, _, _ = _pools()
    assert asyncio.run(pools.move("prefill", "r", worker_id=1)) == "warm"
    assert asyncio.run(pools.move("prefill", "r")) == "failed"  # one decode worker left
    assert pools.failed == 1 and pools.pools() == Pools(2, 1) and not pools.resplitting()
    assert asyncio.run(pools.move("decode", "back", worker_id=2)) == "failed"  # not a prefill
    assert asyncio.run(pools.move("decode", "back", worker_id=1)) == "warm"
    assert pools.pools() == Pools(1, 2)


def test_a_router_restarted_after_a_resplit_gets_the_current_pools_back() -> None:
    pools, log, _, _ = _pools()
    assert asyncio.run(pools.move("prefill", "r", worker_id=2)) == "warm"
    del log[:]
    # The restarted router knows the deploy-time pools: 2 is a decode worker again there.
    deployed = {"prefill": (0,), "decode": (1, 2)}
    asyncio.run(pools.sync_router(deployed))
    assert sorted(log) == [
        ("router.add_worker", "prefill", 2),
        ("router.remove_worker", "decode", 2),
    ]
    del log[:]
    asyncio.run(pools.sync_router({"prefill": (0, 2), "decode": (1,)}))  # in step: no call
    assert log == []


def test_resplit_settings_map_and_errors_name_the_field() -> None:
    s = ControllerSettings.model_validate(
        {"resplit": {"dominance": 3.0, "dwell_ticks": 2, "cooldown_s": 0.0}}
    )
    assert s.resplit.enabled and s.resplit.settings().dominance == 3.0
    assert s.resplit.settings().dwell_ticks == 2 and s.resplit.settings().release_ticks == 30
    for bad, field in (({"dominance": 0.5}, "dominance"), ({"dwell_ticks": 0}, "dwell_ticks"),
                       ({"drain_timeout_s": 0}, "drain_timeout_s"),
                       ({"nope": 1}, "nope")):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"resplit\.{field}"):
            validate_model(ControllerSettings, {"resplit": bad}, "controller")


def test_arrival_meter_counts_a_trailing_window() -> None:
    meter = ArrivalMeter(window_s=10.0)
    assert meter.rate(0.0) == 0.0
    for i in range(50):
        meter.observe(100.0 + i * 0.2)  # 5 req/s for 10 s
    assert meter.rate(110.0) == pytest.approx(5.0, rel=0.05)
    assert meter.rate(125.0) == 0.0


def test_the_planner_works_in_wall_units() -> None:
    profile = load_profile("b200-llama70b-fp8-tp4")
    slow = WallPlanner(profile, Pools(1, 2), 4.0, 1.5)
    fast = WallPlanner(profile, Pools(1, 2), 0.04, 150.0)  # 100x slower, the same SLO
    assert slow.best_split(1.0) == Pools(1, 2)
    assert slow.best_split(400.0) == Pools(2, 1)
    assert fast.best_split(4.0) == slow.best_split(400.0)  # the same virtual rate
    assert slow.capacity(Pools(1, 2)) == pytest.approx(100 * fast.capacity(Pools(1, 2)))
    for planner in (slow, fast):
        assert all(sum(vars(planner.best_split(r)).values()) == 3 for r in (1.0, 50.0))


def test_controller_actor_resplits_through_its_pools_and_reports_them() -> None:
    async def main() -> None:
        log: list[Any] = []
        launcher = Launcher(log)
        workers = {0: Worker("prefill", 0, 0, log), 1: Worker("decode", 1, 3, log),
                   2: Worker("decode", 2, 1, log)}  # fmt: skip
        launcher.find = lambda role, wid: workers[wid] if workers[wid].role == role else None
        actor = ControllerActor(
            nats_url=None, router=Router(log), auction=None, poa=None,
            settings={"tick_s": 60.0, "resplit": {"drain_timeout_s": 1.0}},
            epoch_wall=None, workers={"prefill": [0], "decode": [1, 2]},
            worker_spec={"profile": "b200-llama70b-fp8-tp4", "tp": 4, "speedup": 1000.0,
                         "epoch_wall": 1.0, "seed": 0, "nats_url": None, "namespace": "t"},
            launcher=launcher,
        )  # fmt: skip
        events: list[Any] = []
        actor.bus.local.append(lambda subject, event: events.append((subject, event)))
        assert actor.pools is not None and actor.pools.warmup_s == pytest.approx(0.03)
        # Route events feed the arrival rate the resplitter is ticked with: routes to worker 1,
        # one of this deployment's (a route to a worker outside it would be dropped).
        on_1 = RouteEvent.model_validate(ROUTE.model_dump() | {
            "worker_id": 1, "candidates": (ROUTE.candidates[0].model_dump() | {"worker_id": 1},)
        })  # fmt: skip
        for i in range(5):
            actor.on_event(on_1.model_copy(update={"request_id": f"r{i}"}))
        snap = await actor.tick()
        assert snap.ticks == 1 and actor.tick_errors == 0
        assert snap.signals["arrival_rate"] > 0
        result = await actor.resplit_now("prefill", "test")
        assert result.result == "warm" and result.pools.prefill == (0, 2)
        await actor.bus.flush()
        assert [e.action for s, e in events if s == "disagg.disagg.pools"] == [
            "resplit_start", "drained", "warm"
        ]  # fmt: skip
        snap = await actor.snapshot()
        assert snap.pools is not None
        assert snap.pools.decode == (1,) and len(snap.pools.steps) == 3
        assert snap.resplits == ()  # an operator's move is no decision of the resplitter
        off = ControllerActor(
            nats_url=None, router=None, auction=None, poa=None,
            settings={"resplit": {"enabled": False}}, workers={"prefill": [0], "decode": [1]},
            worker_spec={"profile": "b200-llama70b-fp8-tp4", "tp": 4, "speedup": 1.0,
                         "epoch_wall": 1.0, "seed": 0, "nats_url": None, "namespace": "t"},
        )  # fmt: skip
        assert off.pools is not None and off.controller.resplitter is None
        bare = ControllerActor(nats_url=None, router=None, auction=None, poa=None, settings={})
        with pytest.raises(ValueError, match="off"):
            await bare.resplit_now("prefill")
        await bare.shutdown()
        await actor.shutdown()
        await off.shutdown()

    asyncio.run(main())


def test_the_controller_actor_plans_from_the_traffic_its_events_carry() -> None:
    # The live controller ticks the re-split lever with the same traffic reading the simulator
    # gives it (controller/traffic.py): λ from routes, the shape from completions, the prefill
    # queue from the prefill engines' load snapshots.
    async def main() -> None:
        log: list[Any] = []
        actor = ControllerActor(
            nats_url=None, router=Router(log), auction=None, poa=None,
            settings={"tick_s": 60.0}, epoch_wall=None,
            workers={"prefill": [0], "decode": [1, 2]},
            worker_spec={"profile": "b200-llama70b-fp8-tp4", "tp": 4, "speedup": 1000.0,
                         "epoch_wall": 1.0, "seed": 0, "nats_url": None, "namespace": "t"},
            launcher=Launcher(log),
        )  # fmt: skip
        resplitter = actor.controller.resplitter
        assert resplitter is not None
        seen: list[Any] = []
        tick = resplitter.tick

        def spy(*args: Any, **kwargs: Any) -> Any:
            seen.append(args[6] if len(args) > 6 else kwargs.get("traffic"))
            return tick(*args, **kwargs)

        resplitter.tick = spy  # type: ignore[method-assign]
        on_1 = RouteEvent.model_validate(ROUTE.model_dump() | {
            "worker_id": 1, "candidates": (ROUTE.candidates[0].model_dump() | {"worker_id": 1},)
        })  # fmt: skip
        for i in range(4):
            actor.on_event(on_1.model_copy(update={"request_id": f"r{i}"}))
        actor.on_event(CompleteEvent(
            request_id="r0", t=actor.now(), worker_id=1, prefill_worker_id=0, ttft_s=0.2,
            itl_s=0.01, e2e_s=1.0, prompt_tokens=12_000, cached_tokens=3_000,
            output_tokens=400, status="ok",
        ))  # fmt: skip
        actor.on_event(EngineLoadEvent(
            worker_id=0, role="prefill", t=actor.now(), ttl_s=30.0, prefill_tokens=54_000,
            decode_blocks=0, requests=5,
        ))  # fmt: skip
        await actor.tick()
        traffic = seen[-1]
        assert traffic is not None and traffic.arrival_rate > 0
        assert traffic.shape == TrafficShape(12_000.0, 400.0, 0.25)
        assert traffic.queued_prefill_tokens == 54_000.0
        await actor.shutdown()

    asyncio.run(main())
