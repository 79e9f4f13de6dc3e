"""The simulated backend's request path in each ingress replica: the replica's own router over
the service's pools (``cluster.dataplane.replica``) and :class:`cluster.backends.sim.backend.
SimBackend` over the simulated worker actors (docs/design.md "Data flow (serve mode)")."""

from __future__ import annotations

from collections.abc import Mapping

from cluster.actor_bus import ActorBus
from cluster.actor_ref import ActorHandles
from cluster.backends.sim.backend import PREFILL_TIMEOUT_S, SimBackend
from cluster.backends.sim.decode_streams import SUBMIT_TIMEOUT_S
from cluster.dataplane.replica import ReplicaRouter
from cluster.dataplane.routing import PoolRouting
from cluster.dataplane.settings import EXCHANGE_PERIOD_S, RoutingSettings
from cluster.serve.path import ActorRequestPath
from cluster.serve.replica_path import compose_path

__all__ = ["make_actor_path"]


async def make_actor_path(
    *,
    handles: ActorHandles,
    profile: str,
    speedup: float,
    nats_url: str | None,
    namespace: str,
    block_size: int,
    local_prefill_max_tokens: int,
    seed: int = 0,
    routing: Mapping[str, object] | None = None,
    chunk_interval_s: float = 0.0,
    submit_timeout_s: float = SUBMIT_TIMEOUT_S,
    prefill_timeout_s: float = PREFILL_TIMEOUT_S,
    exchange_period_s: float = EXCHANGE_PERIOD_S,
) -> ActorRequestPath:
    """The path an ingress replica builds at start (picklable through ``functools.partial``):
    ``handles``: "router", "auction", "poa", "controller" → a handle each; "prefill", "decode" →
    {worker id: handle}. The replica's router starts from the router actor's view."""
    from cluster.sim.profile import load_profile

    bus = ActorBus(nats_url, namespace, role="ingress", name="ingress")
    settings = RoutingSettings.model_validate(routing or {})
    loaded = load_profile(profile)
    pools = PoolRouting(
        block_size=block_size, local_prefill_max_tokens=local_prefill_max_tokens, seed=seed,
        prefill_workers=sorted(handles.prefill), decode_workers=sorted(handles.decode),
        max_blocks_per_worker=loaded.kv_index_bound(block_size),
    )  # fmt: skip
    router = ReplicaRouter(pools, bus, control=handles.router, settings=settings)
    return await compose_path(
        handles=handles, namespace=namespace, bus=bus, view=router,
        backend=lambda workers: SimBackend(router=router, workers=workers, profile=loaded,
                                           speedup=speedup, chunk_interval_s=chunk_interval_s,
                                           submit_timeout_s=submit_timeout_s,
                                           prefill_timeout_s=prefill_timeout_s),
        exchange_period_s=exchange_period_s,
    )  # fmt: skip
