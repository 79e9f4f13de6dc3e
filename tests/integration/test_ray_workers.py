"""The worker and router actors under real Ray, with their KV events over a real nats-server:
1 prefill + 2 decode workers (placed by simulated B200 units) and the router actor.

Checked: tokens stream through Ray streaming generators; KV events from the workers reach the
router's indexes over NATS, so a repeated prefix is routed (tau = 0) to the worker that cached
it; a long uncached prompt takes the prefill worker, then decodes; a decode actor killed with
one restart left comes back, tells the router to forget its cache, and serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ray.exceptions import GetTimeoutError, RayActorError

from cluster.backends.sim.workers import DecodeWorkerActor, PrefillWorkerActor
from cluster.dataplane.routing import Route
from cluster.ray.router_actor import RouterActor
from cluster.ray.status import RouterStats
from cluster.sim.profile import load_profile

pytestmark = pytest.mark.integration

PROFILE = "b200-llama70b-fp8-tp4"
NAMESPACE = "rayworkers"
SPEEDUP = 20.0


class Service:
    def __init__(self, prefill: Any, decode: dict[int, Any], router: Any) -> None:
        self.prefill, self.decode, self.router = prefill, decode, router


@pytest.fixture(scope="module")
def service(ray_session: None, nats_url: str) -> Iterator[Service]:
    import ray

    profile = load_profile(PROFILE)
    common = {
        "speedup": SPEEDUP, "epoch_wall": time.time(), "nats_url": nats_url,
        "namespace": NAMESPACE,
    }  # fmt: skip

    def worker(cls: type, wid: int) -> Any:
        options = {"num_cpus": 0, "resources": {"B200": profile.tp}, "max_restarts": 1}
        return ray.remote(cls).options(**options).remote(wid, PROFILE, seed=wid, **common)

    prefill = worker(PrefillWorkerActor, 0)
    decode = {1: worker(DecodeWorkerActor, 1), 2: worker(DecodeWorkerActor, 2)}
    router = (
        ray.remote(RouterActor)
        .options(num_cpus=0, max_restarts=1)
        .remote(
            prefill_workers=[0], decode_workers=[1, 2], block_size=profile.block_size,
            local_prefill_max_tokens=profile.decode.local_prefill_max_tokens, nats_url=nats_url,
            namespace=NAMESPACE,
        )
    )  # fmt: skip
    actors = [prefill, *decode.values(), router]
    infos = ray.get([a.ready.remote() for a in actors], timeout=120)
    assert all(info.nats for info in infos)
    assert infos[0].accelerators == {"B200": float(profile.tp)} and infos[0].node_id
    yield Service(prefill, decode, router)
    for actor in actors:
        with contextlib.suppress(RayActorError, GetTimeoutError):
            ray.get(actor.shutdown.remote(), timeout=30)
        ray.kill(actor, no_restart=True)


async def _stream(
    handle: Any, route: Route, n: int, local: bool, request_id: str | None = None
) -> list[list[Any]]:
    gen = handle.generate.remote(
        request_id or route.request_id, route.prompt_tokens, list(route.local_hashes),
        list(route.seq_hashes), n, local,
    )  # fmt: skip
    rows: list[list[Any]] = []
    async for ref in gen:
        chunk = await ref
        assert chunk, "every chunk holds at least one token"
        rows.extend(chunk)
    return rows


async def _serve(svc: Service, request_id: str, tokens: list[int], n: int) -> Route:
    """One request the way the ingress runs it: route, [prefill, transfer], decode, complete."""
    route = await svc.router.route.remote(request_id, tokens, "tester")
    if route.prefill_worker is not None:
        result = await svc.prefill.prefill.remote(
            request_id, route.prompt_tokens, list(route.local_hashes), list(route.seq_hashes)
        )
        # The one prefill worker (id 0): its KV is on it once the call returns.
        assert route.prefill_worker == 0 and result.finished_at >= result.started_at
        await svc.router.finish_prefill.remote(request_id)
    rows = await _stream(
        svc.decode[route.decode_worker], route, n, route.prefill_worker is None
    )
    await svc.router.complete.remote(request_id)
    assert [r[0] for r in rows] == list(range(n))
    assert [r[2] for r in rows] == sorted(r[2] for r in rows)
    return route


async def _until(
    check: Callable[[RouterStats], bool], svc: Service, timeout_s: float = 20.0
) -> RouterStats:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await svc.router.stats.remote()
        if check(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"router never got there: {stats}")
        await asyncio.sleep(0.05)


def _stored(role: str) -> Callable[[RouterStats], int]:
    return lambda stats: stats.kv_events[role].applied.get("stored", 0)


def test_requests_stream_and_kv_events_steer_the_next_route(service: Service) -> None:
    async def body() -> None:
        prompt = list(range(2000, 2000 + 330))  # 20 full blocks + 10 tokens
        first = await _serve(service, "kv-1", prompt, 12)
        # Long and uncached: the prefill worker computed it, then the decode worker took it.
        assert first.prefill_worker == 0 and first.uncached_tokens == 330
        await _until(lambda s: _stored("prefill")(s) >= 1 and _stored("decode")(s) >= 1, service)
        again = await _serve(service, "kv-2", prompt + [7] * 6, 8)
        assert again.decode_worker == first.decode_worker  # tau = 0: the cached prefix
        assert again.uncached_tokens == 16 and again.prefill_worker is None
        # A few unrelated requests at once, each streamed to its end.
        others = [list(range(10_000 * k, 10_000 * k + 40)) for k in range(1, 5)]
        routes = await asyncio.gather(
            *(_serve(service, f"many-{k}", p, 10) for k, p in enumerate(others))
        )
        assert {r.decode_worker for r in routes} <= {1, 2}
        stats = await service.router.stats.remote()
        assert stats.in_flight == {"prefill": 0, "decode": 0}
        assert "disagg_routing_cost " in await service.router.metrics_text.remote()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_killed_decode_actor_comes_back_clears_its_cache_and_serves(service: Service) -> None:
    import ray

    async def body() -> None:
        prompt = list(range(50_000, 50_000 + 96))
        first = await _serve(service, "restart-1", prompt, 4)
        victim = first.decode_worker
        handle = service.decode[victim]
        old = await handle.ready.remote()
        await _until(lambda s: _stored("decode")(s) >= 1, service)
        ray.kill(handle, no_restart=False)
        # ray.kill returns at once: until the old process is gone, calls may still reach it.
        deadline = time.monotonic() + 60
        while True:
            try:
                info = await handle.ready.remote()
                if info.pid != old.pid:
                    break
            except RayActorError:  # dead or restarting (ActorUnavailableError is one too)
                pass
            if time.monotonic() > deadline:
                raise AssertionError("the killed decode actor never came back")
            await asyncio.sleep(0.2)
        assert info.pid != old.pid and info.worker_id == victim
        # Its first act in the new life is "cleared": the router forgets the old cache. The
        # event crosses NATS, so ask until the router's view shows it (bounded by the test's
        # 120 s guard); counting "cleared" events would race with the first life's own.
        attempt = 0
        while True:
            attempt += 1
            route = await service.router.route.remote(f"restart-2-{attempt}", prompt, "tester")
            await service.router.complete.remote(f"restart-2-{attempt}")
            if route.uncached_tokens == 96:  # nobody holds the prefix any more
                break
            await asyncio.sleep(0.1)
        # ... and it serves again.
        rows = await _stream(handle, route, 5, True, request_id="restart-3")
        assert [r[0] for r in rows] == list(range(5))

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_control_resource_no_node_declares_is_refused_before_any_actor(
    ray_session: None,
) -> None:
    """``control_resource`` names what only the control plane's nodes declare: on a cluster
    where none does, every control actor would wait forever; the service says so at once."""
    from cluster.config import ServeConfig
    from cluster.models import ConfigError
    from cluster.service import Service as RealService

    service = RealService(ServeConfig(control_resource="nobody_declares_this"))
    with pytest.raises(ConfigError, match="control_resource: no node"):
        service.start_actors(None)
    assert service.handles.prefill == {} and service.handles.decode == {}
