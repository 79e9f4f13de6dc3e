"""The Dynamo backend's registry entry (``cluster.backends``): one
:class:`cluster.backends.dynamo.worker_actor.DynamoWorkerActor` per worker slot, each owning
one Dynamo process, and the service's steps of :class:`cluster.backends.dynamo.service.
DynamoEngines`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.actor_ref import ActorRef
from cluster.backends.dynamo.refs import DynamoWorkerRef
from cluster.backends.dynamo.settings import DynamoSettings
from cluster.backends.dynamo.worker_spec import DynamoWorkerSpec, dynamo_worker_settings
from cluster.backends.protocol import Engines
from cluster.ray.worker_factory import RAY_NAMESPACE, control_actor_name
from cluster.worker_spec import WorkerSpec

if TYPE_CHECKING:
    from cluster.config import ServeConfig

__all__ = ["PLUG", "DynamoPlug"]


class DynamoPlug:
    """Dynamo's processes under our worker actors (``backend: dynamo``)."""

    name = "dynamo"
    settings_model = DynamoSettings

    def worker_class(self, role: str) -> type:
        from cluster.backends.dynamo.worker_actor import DynamoWorkerActor

        return DynamoWorkerActor

    def worker_arguments(
        self, spec: WorkerSpec, role: str, worker_id: int
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        # The actor restarts its process itself (its watch loop); Ray restarts the actor when
        # its own process or node dies, and the restarted actor starts a process again
        # (``restore``). Never two at once: a dead actor's process dies with it (the watchdog).
        settings = dynamo_worker_settings(spec)  # checks that the spec is a Dynamo one
        own = DynamoWorkerSpec.model_validate(spec.engine.settings)
        return (role, worker_id, settings), {
            "nats_url": spec.nats_url,
            "discovery": own.discovery,
            "log_dir": own.log_dir,
            "model_path": spec.model_dir,
            "router_name": control_actor_name(spec.namespace, "router"),
        }

    async def after_start(self, spec: WorkerSpec, handle: ActorRef) -> None:
        # A worker started at run time starts its process here and tells the shadow router
        # its instance id, now and after every restart of the process (shadow.py).
        import ray

        router = ray.get_actor(
            control_actor_name(spec.namespace, "router"), namespace=RAY_NAMESPACE
        )
        await DynamoWorkerRef(handle).attach(router)
        await DynamoWorkerRef(handle).start()

    def switch_warmup_s(self, spec: WorkerSpec, role_switch_s: float) -> float:
        return 0.0  # its warm-up is real: its process started and answered before this

    def engines(self, config: ServeConfig) -> Engines:
        from cluster.backends.dynamo.service import DynamoEngines

        return DynamoEngines(config)


PLUG = DynamoPlug()
