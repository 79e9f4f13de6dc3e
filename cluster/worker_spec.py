"""What every worker of one service starts with, and the backend that starts it
(docs/design.md "Layout": a backend is one package and one registry entry).

A :class:`WorkerSpec` is a plain JSON-able shape: the composer hands it to the controller actor,
which restarts and re-splits workers long after, in another process. Its :class:`EngineSpec`
names the backend by the module that holds it, so whoever holds the spec reaches the backend's
worker side (:class:`WorkerPlug`) through :func:`worker_plug`, importing nothing that names one.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

from pydantic import Field

from cluster.actor_ref import ActorRef
from cluster.models import StrictModel

__all__ = ["EngineSpec", "WorkerPlug", "WorkerSpec", "worker_plug"]

MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,8}$"


class EngineSpec(StrictModel):
    """The backend a service's workers run: the module that holds it (its ``PLUG``) and what
    its workers need beyond the common spec (the backend's own shape, as JSON)."""

    backend: str = Field("sim", pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    module: str = Field("cluster.backends.sim", pattern=MODULE_PATTERN)
    # The backend's own model validates it where its workers start (its plug).
    settings: dict[str, object] = Field(default_factory=dict, max_length=64)


class WorkerSpec(StrictModel):
    """What every worker of one service is started with (from its ``ServeConfig``)."""

    profile: str
    tp: int = Field(ge=1)
    speedup: float = Field(gt=0.0)
    epoch_wall: float = Field(gt=0.0)
    seed: int = Field(ge=0)
    nats_url: str | None
    namespace: str
    model_dir: str | None = None
    accelerator_resource: str = "B200"
    request_gpus: bool = False
    max_restarts: int = Field(3, ge=0)
    # Variables each worker's process needs that its Ray session does not pass on (the bus's
    # credentials directory, cluster.nats_auth, when the service started NATS after Ray).
    env_vars: dict[str, str] = Field(default_factory=dict, max_length=16)
    engine: EngineSpec = EngineSpec()


@runtime_checkable
class WorkerPlug(Protocol):
    """A backend's worker side: what the launcher (deploy time and re-split alike) needs.

    Handles are Ray actor handles (``cluster.actor_ref.ActorRef``)."""

    def worker_class(self, role: str) -> type:
        """The actor class of a ``role`` worker (not yet ``ray.remote``)."""
        ...

    def worker_arguments(
        self, spec: WorkerSpec, role: str, worker_id: int
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        """The actor's constructor arguments."""
        ...

    async def after_start(self, spec: WorkerSpec, handle: ActorRef) -> None:
        """What runs once a worker started at run time (a re-split's new one) answered
        ``ready()``; at deploy time the backend's engines take these steps for every worker."""
        ...

    def switch_warmup_s(self, spec: WorkerSpec, role_switch_s: float) -> float:
        """Wall seconds a worker that changed role waits before taking work."""
        ...


def worker_plug(spec: WorkerSpec) -> WorkerPlug:
    """The worker side of the backend ``spec.engine`` names (its module's ``PLUG``)."""
    module = importlib.import_module(spec.engine.module)
    plug = getattr(module, "PLUG", None)
    if not isinstance(plug, WorkerPlug):
        raise ValueError(
            f"backend {spec.engine.backend!r}: module {spec.engine.module!r} has no PLUG "
            "(a cluster.backends.BackendPlug)"
        )
    return plug
