"""What a backend supplies (:class:`BackendPlug`, with the driver's :class:`Engines`), and
finding the registered one by name (``cluster.backends``)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pydantic import BaseModel

from cluster.actor_ref import ActorHandles
from cluster.backends.registry import BACKENDS
from cluster.worker_spec import WorkerPlug, WorkerSpec

if TYPE_CHECKING:  # the registry stays light: the CLI lists the backends before Ray loads
    from cluster.config import ServeConfig
    from cluster.ray.service_handles import ServiceHandles
    from cluster.serve.deployment import PathFactory

__all__ = ["BackendPlug", "Engines", "backend_plug", "engines_for"]


class Engines(Protocol):
    """A backend's steps in a service's start and stop, on the driver (``cluster.service``)."""

    def worker_spec(self, base: WorkerSpec) -> WorkerSpec:
        """What every worker starts with, from the service's common ``base``."""
        ...

    def started_workers(self, handles: ServiceHandles) -> None:
        """Called once every worker actor is ready, before the control plane starts."""
        ...

    def router_actor(self, base: Mapping[str, object]) -> tuple[type, dict[str, object]]:
        """The router actor's class and arguments, from the service's common ``base``."""
        ...

    def started_control_plane(self, handles: ServiceHandles) -> None:
        """Called once the router, auction, PoA and controller actors are ready."""
        ...

    def path_factory(self, handles: ActorHandles, nats_url: str | None) -> PathFactory:
        """What each ingress replica calls to build its request path (picklable), given the
        service's actors (``ServiceHandles.for_ingress()``) and its bus."""
        ...

    def stop(self) -> None:
        """Release what the engines hold outside Ray (after the service's actors are gone)."""
        ...


@runtime_checkable
class BackendPlug(WorkerPlug, Protocol):
    """One backend: its worker side, its driver side and its settings (module docstring)."""

    name: str
    # The model of its section of ServeConfig (``dynamo:``), None if it has no settings.
    settings_model: type[BaseModel] | None

    def engines(self, config: ServeConfig) -> Engines:
        """The driver side for one service (checks the backend's install first, if any)."""
        ...


def backend_plug(name: str) -> BackendPlug:
    """The registered backend ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    plug = getattr(importlib.import_module(BACKENDS[name]), "PLUG", None)
    if not isinstance(plug, BackendPlug) or plug.name != name:
        raise ValueError(f"backend {name!r}: {BACKENDS[name]}.PLUG is not its BackendPlug")
    return plug


def engines_for(config: ServeConfig) -> Engines:
    """The driver side of the backend ``config.backend`` names."""
    return backend_plug(config.backend).engines(config)
