"""What the worker actors run, as the service's one varying part (docs/design.md "Serve runtime").

:class:`cluster.service.Service` composes NATS, Ray, the workers, the control plane and the
ingress the same way whatever the engines are. What depends on them is given to it as an
:class:`Engines`: the spec every worker starts with, what to do once the workers (and then the
control plane) run, the router actor that follows them, and the request path each ingress
replica builds. :class:`SimEngines` runs the simulated engines of a hardware profile;
``cluster.dynamo.service.DynamoEngines`` runs Dynamo processes. ``engines_for`` picks by
``ServeConfig.backend``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from cluster.ray.router_actor import RouterActor
from cluster.ray.worker_factory import WorkerSpec
from cluster.serve.config import ServeConfig
from cluster.serve.deployment import PathFactory

if TYPE_CHECKING:
    from cluster.service import Service
    from cluster.service_handles import ServiceHandles

__all__ = ["Engines", "SimEngines", "engines_for"]


class Engines(Protocol):
    """The engine-specific steps of a service's start and stop."""

    def worker_spec(self, base: WorkerSpec) -> WorkerSpec:
        """What every worker starts with, from the service's common ``base``."""
        ...

    def started_workers(self, handles: ServiceHandles) -> None:
        """Called once every worker actor is ready, before the control plane starts."""
        ...

    def router_actor(self, base: Mapping[str, Any]) -> tuple[type, dict[str, Any]]:
        """The router actor's class and arguments, from the service's common ``base``."""
        ...

    def started_control_plane(self, handles: ServiceHandles) -> None:
        """Called once the router, auction, PoA and controller actors are ready."""
        ...

    def path_factory(self, service: Service) -> PathFactory:
        """What each ingress replica calls to build its request path (picklable)."""
        ...

    def stop(self) -> None:
        """Release what the engines hold outside Ray (after the service's actors are gone)."""
        ...


class SimEngines:
    """The simulated engines of the configured hardware profile (wall-clock, ``speedup``)."""

    def worker_spec(self, base: WorkerSpec) -> WorkerSpec:
        return base

    def started_workers(self, handles: ServiceHandles) -> None:
        pass

    def router_actor(self, base: Mapping[str, Any]) -> tuple[type, dict[str, Any]]:
        return RouterActor, dict(base)

    def started_control_plane(self, handles: ServiceHandles) -> None:
        pass

    def path_factory(self, service: Service) -> PathFactory:
        from cluster.serve.replica_path import make_actor_path

        cfg, profile = service.config, service.profile
        return functools.partial(
            make_actor_path, handles=service.handle_map(), profile=cfg.profile,
            speedup=cfg.speedup, nats_url=service.nats_url, namespace=cfg.namespace,
            block_size=profile.block_size,
            local_prefill_max_tokens=profile.decode.local_prefill_max_tokens,
            seed=cfg.seed, routing=cfg.routing.model_dump(),
            chunk_interval_s=cfg.stream_chunk_s,
            exchange_period_s=cfg.admission.exchange_period_s,
        )  # fmt: skip

    def stop(self) -> None:
        pass


def engines_for(config: ServeConfig) -> Engines:
    """The engines ``config.backend`` names (Dynamo's checks its install first)."""
    if config.backend == "dynamo":
        from cluster.dynamo.service import DynamoEngines

        return DynamoEngines(config)
    return SimEngines()
