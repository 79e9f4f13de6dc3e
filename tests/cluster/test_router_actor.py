"""The router actor in-process (no Ray): decisions, reservations, retries with ``exclude``,
policy and pool changes; KV events fed directly, and once end to end over an embedded NATS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cluster.backends.sim.workers import DecodeWorkerActor
from cluster.bus import EventBus
from cluster.dataplane.routing import Route
from cluster.events import RouteEvent
from cluster.nats_server import NatsServer
from cluster.ray.actor_support import MAX_PROMPT_TOKENS
from cluster.ray.router_actor import RouterActor
from router import Policy, block_hashes, sequence_hashes
from telemetry.metrics import ROUTING_COST

BS = 16
LOCAL_MAX = 16


def _router(**kw: Any) -> RouterActor:
    args: dict[str, Any] = {
        "prefill_workers": [0],
        "decode_workers": [1, 2, 3],
        "block_size": BS,
        "local_prefill_max_tokens": LOCAL_MAX,
        "nats_url": None,
    }
    return RouterActor(**(args | kw))


def _events(router: RouterActor) -> list[RouteEvent]:
    seen: list[RouteEvent] = []
    router.bus.local.append(lambda subject, event: seen.append(event))
    return seen


def _store(router: RouterActor, role: str, worker: int, tokens: list[int]) -> None:
    """The KV event a worker publishes after caching ``tokens``' complete blocks."""
    local = block_hashes(tokens, BS)
    blocks = [
        {"block_hash": s, "tokens_hash": h}
        for s, h in zip(sequence_hashes(local), local, strict=True)
    ]
    payload = {"worker_id": worker, "data": {"stored": {"parent_hash": None, "blocks": blocks}}}
    assert router.feed_kv(role, payload)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


TOKENS = list(range(1000, 1320))  # 20 blocks


def test_route_answers_every_field_and_publishes_the_route_event() -> None:
    async def body() -> None:
        router = _router()
        seen = _events(router)
        assert (await router.ready()).nats is None
        r = await router.route("r1", TOKENS, "alice")
        local = block_hashes(TOKENS, BS)
        assert r.local_hashes == tuple(local) and r.seq_hashes == tuple(sequence_hashes(local))
        assert r.prompt_tokens == 320 and r.uncached_tokens == 320
        assert r.decode_worker == 1  # all equal: ties go to the lowest id
        assert r.prefill_worker == 0  # 320 uncached > 16: the prefill pool does it
        decision = r.decision
        assert (r.policy_version, decision.tau, decision.omega, r.regime) == (0, 0.0, 1.0, "below")
        assert isinstance(r, Route) and r.request_id == "r1" and decision.worker == 1
        await router.bus.flush()
        (event,) = seen
        assert isinstance(event, RouteEvent)
        assert event.request_id == "r1" and event.user == "alice" and event.worker_id == 1
        assert [c.worker_id for c in event.candidates] == [1, 2, 3]
        assert abs(event.t - time.time()) < 5  # wall time, as the ingress's events
        assert ROUTING_COST._value.get() == event.candidates[0].cost
        stats = await router.stats()
        assert stats.in_flight == {"prefill": 1, "decode": 1} and stats.routed == 1
        await router.finish_prefill("r1")
        assert (await router.stats()).in_flight == {"prefill": 0, "decode": 1}
        await router.complete("r1")
        await router.complete("r1")  # idempotent
        assert (await router.stats()).in_flight == {"prefill": 0, "decode": 0}
        await router.shutdown()

    _run(body)


def test_short_or_cached_prompts_prefill_on_the_decode_worker() -> None:
    async def body() -> None:
        router = _router()
        short = await router.route("s", list(range(LOCAL_MAX)))
        assert short.prefill_worker is None and short.uncached_tokens == LOCAL_MAX
        _store(router, "decode", 3, TOKENS)
        cached = await router.route("c", TOKENS + [7] * 10)
        assert cached.decode_worker == 3  # tau = 0: the overlap wins
        assert cached.uncached_tokens == 10 and cached.prefill_worker is None
        no_pool = _router(prefill_workers=[])
        assert (await no_pool.route("n", TOKENS)).prefill_worker is None

    _run(body)


def test_the_prefill_pool_is_kv_aware_too() -> None:
    async def body() -> None:
        router = _router(prefill_workers=[0, 4], decode_workers=[1, 2])
        _store(router, "prefill", 4, TOKENS)
        r = await router.route("p", TOKENS + [9] * 40)
        assert r.prefill_worker == 4
        stats = await router.stats()
        assert stats.kv_events["prefill"].applied == {"stored": 1}

    _run(body)


def test_exclude_routes_around_a_failed_worker_and_still_reserves() -> None:
    async def body() -> None:
        router = _router(prefill_workers=[0, 4])
        seen = _events(router)
        _store(router, "decode", 2, TOKENS)
        first = await router.route("x", TOKENS)
        assert first.decode_worker == 2 and first.prefill_worker is None
        await router.complete("x")
        retry = await router.route("x", TOKENS, exclude=[2, 0])
        assert retry.decode_worker == 1 and retry.uncached_tokens == 320
        assert retry.prefill_worker == 4  # worker 0 is excluded from the prefill pool too
        await router.bus.flush()
        assert [c.worker_id for c in seen[-1].candidates] == [1, 3]
        stats = await router.stats()
        assert stats.in_flight == {"prefill": 1, "decode": 1} and stats.retries == 1
        # Its reservation is real: the next request avoids the loaded worker 1.
        assert (await router.route("y", list(range(5000, 5320)))).decode_worker == 3
        with pytest.raises(ValueError, match="already in flight"):
            await router.route("x", TOKENS, exclude=[2])
        with pytest.raises(ValueError, match="every worker is excluded"):
            await router.route("z", TOKENS, exclude=[1, 2, 3])
        assert (await router.stats()).in_flight["decode"] == 2  # z left nothing behind
        # All prefill workers excluded: the decode worker prefills locally.
        local = await router.route("w", list(range(7000, 7320)), exclude=[0, 4])
        assert local.prefill_worker is None

    _run(body)


def test_exclude_with_a_temperature_samples_among_the_rest() -> None:
    async def body() -> None:
        router = _router(tau=0.5)
        picks = set()
        for i in range(40):
            r = await router.route(f"t{i}", list(range(i * 400, i * 400 + 40)), exclude=[1])
            picks.add(r.decode_worker)
            await router.complete(f"t{i}")
        assert picks == {2, 3}

    _run(body)


def test_set_policy_applies_to_later_decisions_and_refuses_bad_values() -> None:
    async def body() -> None:
        router = _router()
        await router.set_policy(Policy(0.3, 2.0, 5, "saturated"))
        r = await router.route("a", TOKENS)
        assert (r.decision.tau, r.decision.omega, r.policy_version, r.regime) == (
            0.3,
            2.0,
            5,
            "saturated",
        )
        for bad, field in (
            ((-1.0, 1.0, 6, "x"), "tau"),
            ((0.0, float("nan"), 6, "x"), "omega"),
            ((0.0, 1.0, -1, "x"), "version"),
            ((0.0, 1.0, 6, "x" * 65), "regime"),
        ):
            with pytest.raises(ValueError, match=field):
                await router.set_policy(Policy(*bad))
        with pytest.raises(ValueError, match="a policy is a"):
            await router.set_policy((0.0, 1.0, 6, "x"))  # type: ignore[arg-type]
        stats = await router.stats()
        assert stats.policy == Policy(tau=0.3, omega=2.0, version=5, regime="saturated")
        assert router.routers["prefill"].policy.version == 5

    _run(body)


def test_pools_change_at_run_time() -> None:
    async def body() -> None:
        router = _router()
        await router.add_worker("decode", 7)
        with pytest.raises(ValueError, match="other pool"):
            await router.add_worker("prefill", 7)
        with pytest.raises(ValueError, match="role"):
            await router.add_worker("both", 8)
        _store(router, "decode", 7, TOKENS)
        assert (await router.route("a", TOKENS)).decode_worker == 7
        await router.remove_worker("decode", 7)  # its reservation goes with it
        assert (await router.stats()).in_flight["decode"] == 0
        assert (await router.stats()).workers == {"prefill": (0,), "decode": (1, 2, 3)}
        with pytest.raises(ValueError, match="worker_id"):
            await router.remove_worker("decode", 7)
        for w in (1, 2):
            await router.remove_worker("decode", w)
        with pytest.raises(ValueError, match="last worker"):
            await router.remove_worker("decode", 3)
        await router.remove_worker("prefill", 0)
        assert (await router.route("b", TOKENS)).prefill_worker is None
        # Events of a worker outside the pool, or of an unknown pool, are counted, never applied.
        assert not router.feed_kv("decode", {"worker_id": 99, "data": "cleared"})
        assert not router.feed_kv("decode", {"garbage": True})
        assert not router.feed_kv("nope", {"worker_id": 3, "data": "cleared"})
        dropped = (await router.stats()).kv_events["decode"].dropped
        assert dropped == {"unknown_worker": 1, "malformed": 1}
        assert await router.apply_kv_events("decode", [{"worker_id": 3, "data": "cleared"}]) == 1

    _run(body)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("", TOKENS), "request_id"),
        (("r", []), "tokens"),
        (("r", [1, -2, 3]), "tokens"),
        (("r", "abc"), "tokens"),
        (("r", TOKENS, 5), "user"),
        (("r", TOKENS, "u", [1.5]), "exclude"),
        (("r", TOKENS, "u", 3), "exclude"),
    ],
)
def test_route_refuses_bad_arguments_naming_the_field(args: tuple[Any, ...], field: str) -> None:
    async def body() -> None:
        router = _router()
        with pytest.raises(ValueError, match=field):
            await router.route(*args)
        assert (await router.stats()).in_flight["decode"] == 0

    _run(body)


def test_route_refuses_a_prompt_over_the_bound() -> None:
    async def body() -> None:
        with pytest.raises(ValueError, match="tokens"):
            await _router().route("big", [1] * (MAX_PROMPT_TOKENS + 1))

    _run(body)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"decode_workers": []}, "decode_workers"),
        ({"decode_workers": [1, 1.5]}, "worker_id"),
        ({"prefill_workers": [1]}, "other pool"),
        ({"block_size": 0}, "block_size"),
        ({"local_prefill_max_tokens": -1}, "local_prefill_max_tokens"),
        ({"tau": -1.0}, "tau"),
        ({"namespace": "a b"}, "namespace"),
    ],
)
def test_constructor_refuses_bad_settings(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _router(**kwargs)


def test_a_failure_after_the_decision_leaves_no_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def body() -> None:
        router = _router()

        def broken(*args: Any) -> RouteEvent:
            raise RuntimeError("boom")

        monkeypatch.setattr(RouteEvent, "from_decision", broken)
        with pytest.raises(RuntimeError):
            await router.route("r", TOKENS)
        assert (await router.stats()).in_flight == {"prefill": 0, "decode": 0}

    _run(body)


def test_metrics_text_holds_the_routing_cost_only() -> None:
    async def body() -> None:
        router = _router()
        await router.route("m", TOKENS)
        text = await router.metrics_text()
        assert "disagg_routing_cost " in text and "disagg_events_dropped_total" in text
        assert "disagg_poa_hat" not in text and "disagg_regime" not in text

    _run(body)


def test_over_nats_worker_kv_events_reach_the_index_and_route_events_go_out() -> None:
    async def body(url: str) -> None:
        listener = EventBus(url, "rt", role="observer")
        await listener.connect()
        routes: list[Any] = []
        await listener.subscribe(routes.append, kinds=("route",))
        router = _router(decode_workers=[1, 2], nats_url=url, namespace="rt")
        worker = DecodeWorkerActor(
            2, "b200-llama70b-fp8-tp4", speedup=50.0, epoch_wall=time.time(), seed=0,
            nats_url=url, namespace="rt",
        )  # fmt: skip
        assert (await router.ready()).nats is True
        assert (await worker.ready()).nats is True
        local = block_hashes(TOKENS, BS)
        stream = worker.generate("w", 320, local, sequence_hashes(local), 2, True)
        assert [len(c) async for c in stream]
        await worker.bus.flush()
        for _ in range(200):
            if router.routers["decode"].index.cached_blocks(2) == 20:
                break
            await asyncio.sleep(0.02)
        r = await router.route("again", TOKENS + [1] * 5)
        assert r.decode_worker == 2 and r.uncached_tokens == 5
        await router.bus.flush()
        for _ in range(100):
            if routes:
                break
            await asyncio.sleep(0.02)
        assert routes[0].request_id == "again" and routes[0].worker_id == 2
        await worker.shutdown()
        await router.shutdown()
        await listener.close()

    with NatsServer() as server:
        asyncio.run(asyncio.wait_for(body(server.url), 30))
