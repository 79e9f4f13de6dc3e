"""What an ingress replica builds at start, whatever its backend: its request path over the
service's actors, with its routing view and admission gate under the auction's lease
(``cluster.dataplane.admission``; docs/design.md "Data flow (serve mode)"). A backend's path
factory (``cluster.backends``) builds its view and its ``Backend`` and hands them here."""

from __future__ import annotations

from collections.abc import Callable

from cluster.actor_bus import ActorBus
from cluster.actor_ref import ActorHandles
from cluster.dataplane.admission import AdmissionGate
from cluster.dataplane.lease import LeaseKeeper
from cluster.dataplane.replica import ReplicaRouter
from cluster.ray.worker_handles import Workers, named_worker_resolver
from cluster.serve.backend import Backend
from cluster.serve.path import ActorRequestPath

__all__ = ["compose_path"]


async def compose_path(
    *, handles: ActorHandles, namespace: str, bus: ActorBus, view: ReplicaRouter,
    backend: Callable[[Workers], Backend], exchange_period_s: float,
) -> ActorRequestPath:  # fmt: skip
    """What every ingress replica has whatever its engines: its routing view started (the
    control plane's view first, then the bus), its admission gate under a lease kept by
    heartbeat, the worker handles, the lifecycle over ``backend``."""
    await view.start()
    gate = AdmissionGate()
    view.regime_listeners.append(gate.on_regime)
    keeper = LeaseKeeper(gate, handles.auction, view.replica_id)
    await keeper.start()
    workers = Workers(dict(handles.prefill), dict(handles.decode), named_worker_resolver(namespace))
    path = ActorRequestPath(
        auction=handles.auction,
        backend=backend(workers),
        replica=view.replica_id,
        workers=workers,
        bus=bus,
        extra_metrics=handles.control_plane(),
        gate=gate,
        exchange_period_s=exchange_period_s,
    )
    path.keeper = keeper
    return path
