"""A third backend, outside the product: what adding one takes (docs/design.md "Layout").

This package and one ``register_backend("toy", "tests.toy_backend")`` are all of it; nothing in
``cluster/`` names it. Its workers are small actors that say who they are and whether the
backend's ``after_start`` ran on them; the driver's steps are the simulated backend's (its router
actor and request path), with the toy's engine spec.
"""

from __future__ import annotations

from typing import Any

from cluster.backends.protocol import Engines
from cluster.backends.registry import engine_spec
from cluster.backends.sim import SimEngines
from cluster.config import ServeConfig
from cluster.ray.actor_support import Ready, ready_record
from cluster.worker_spec import WorkerSpec

NAME = "toy"
WARMUP_S = 0.25


class ToyWorker:
    """One toy worker actor: a role, an id, and what its backend did to it."""

    def __init__(self, role: str, worker_id: int, *, greeting: str) -> None:
        self.role, self.worker_id, self.greeting = role, worker_id, greeting
        self.started_by_plug = False

    async def ready(self) -> Ready:
        return ready_record(self.role, worker_id=self.worker_id)

    async def mark_started(self) -> None:
        self.started_by_plug = True

    async def toy(self) -> dict[str, Any]:
        return {"role": self.role, "worker_id": self.worker_id, "greeting": self.greeting,
                "started_by_plug": self.started_by_plug}  # fmt: skip

    async def shutdown(self) -> None:
        pass


class ToyEngines(SimEngines):
    def worker_spec(self, base: WorkerSpec) -> WorkerSpec:
        return base.model_copy(update={"engine": engine_spec(NAME, {"greeting": "hello"})})


class ToyPlug:
    name = NAME
    settings_model = None

    def worker_class(self, role: str) -> type:
        return ToyWorker

    def worker_arguments(
        self, spec: WorkerSpec, role: str, worker_id: int
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        return (role, worker_id), {"greeting": str(spec.engine.settings["greeting"])}

    async def after_start(self, spec: WorkerSpec, handle: Any) -> None:
        await handle.mark_started.remote()

    def switch_warmup_s(self, spec: WorkerSpec, role_switch_s: float) -> float:
        return WARMUP_S

    def engines(self, config: ServeConfig) -> Engines:
        return ToyEngines(config)


PLUG = ToyPlug()
