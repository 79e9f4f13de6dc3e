"""What an ingress replica builds at start: its request path over the service's actors, with
its own router (``cluster.dataplane.replica``) and admission gate under the auction's lease
(``cluster.dataplane.admission``; docs/design.md "Data flow (serve mode)")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.dataplane.admission import AdmissionGate
from cluster.dataplane.lease import LeaseKeeper
from cluster.dataplane.replica import ReplicaRouter
from cluster.dataplane.routing import PoolRouting
from cluster.dataplane.settings import EXCHANGE_PERIOD_S, RoutingSettings
from cluster.ray.actor_support import ActorBus
from cluster.serve.backend import Backend
from cluster.serve.path import ActorRequestPath
from cluster.serve.sim_backend import SimBackend
from cluster.serve.worker_handles import Workers, named_worker_resolver

__all__ = ["compose_path", "make_actor_path"]


async def make_actor_path(
    *,
    handles: dict[str, Any],
    profile: str,
    speedup: float,
    nats_url: str | None,
    namespace: str,
    block_size: int,
    local_prefill_max_tokens: int,
    seed: int = 0,
    routing: dict[str, Any] | None = None,
    chunk_interval_s: float = 0.0,
    exchange_period_s: float = EXCHANGE_PERIOD_S,
) -> ActorRequestPath:
    """The path an ingress replica builds at start (picklable through ``functools.partial``):
    ``handles``: "router", "auction", "poa", "controller" → a handle each; "prefill", "decode" →
    {worker id: handle}. The replica's router starts from the router actor's view."""
    from cluster.sim.profile import load_profile

    bus = ActorBus(nats_url, namespace, role="ingress", name="ingress")
    settings = RoutingSettings.model_validate(routing or {})
    pools = PoolRouting(
        block_size=block_size, local_prefill_max_tokens=local_prefill_max_tokens, seed=seed,
        prefill_workers=sorted(handles["prefill"]), decode_workers=sorted(handles["decode"]),
    )  # fmt: skip
    router = ReplicaRouter(pools, bus, control=handles["router"], settings=settings)
    loaded = load_profile(profile)
    return await compose_path(
        handles=handles, namespace=namespace, bus=bus, view=router,
        backend=lambda workers: SimBackend(router=router, workers=workers, profile=loaded,
                                           speedup=speedup, chunk_interval_s=chunk_interval_s),
        exchange_period_s=exchange_period_s,
    )  # fmt: skip


async def compose_path(
    *, handles: dict[str, Any], namespace: str, bus: ActorBus, view: ReplicaRouter,
    backend: Callable[[Workers], Backend], exchange_period_s: float,
) -> ActorRequestPath:  # fmt: skip
    """What every ingress replica has whatever its engines: its routing view started (the
    control plane's view first, then the bus), its admission gate under a lease kept by
    heartbeat, the worker handles, the lifecycle over ``backend``."""
    await view.start()
    gate = AdmissionGate()
    view.regime_listeners.append(gate.on_regime)
    keeper = LeaseKeeper(gate, handles["auction"], view.replica_id)
    await keeper.start()
    workers = Workers(
        dict(handles["prefill"]), dict(handles["decode"]), named_worker_resolver(namespace)
    )
    path = ActorRequestPath(
        auction=handles["auction"],
        backend=backend(workers),
        replica=view.replica_id,
        workers=workers,
        bus=bus,
        extra_metrics=tuple(
            h for h in (handles.get("router"), handles.get("poa"), handles.get("controller")) if h
        ),
        gate=gate,
        exchange_period_s=exchange_period_s,
    )
    path.keeper = keeper
    return path
