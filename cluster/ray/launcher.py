"""Worker actors under Ray for the re-split (``cluster.ray.pools.Launcher``): a new-role actor
started as the service starts them, the old one stopped with its placement group."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from cluster.actor_ref import ActorRef
from cluster.ray.refs import WorkerRef
from cluster.ray.worker_factory import RAY_NAMESPACE, new_placement, start_worker, worker_name
from cluster.worker_spec import WorkerSpec, worker_plug
from controller.resplit import Role

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

__all__ = ["READY_TIMEOUT_S", "RayLauncher", "remove_named_placement"]

READY_TIMEOUT_S = 120.0  # a new actor's placement and ready()


class RayLauncher:
    """Worker actors under Ray, started as the service starts them (``worker_factory``).

    Started detached: the controller actor that starts them restarts on a crash, and a
    non-detached actor dies with the process that created it. ``release()`` (the service's
    shutdown) stops what this launcher started when the service itself is not detached."""

    def __init__(self, spec: WorkerSpec, *, detached_service: bool) -> None:
        self.spec = spec
        self.detached_service = detached_service
        self.placements: dict[str, PlacementGroup] = {}  # actor name → the group we made

    async def start(self, role: Role, worker_id: int) -> ActorRef:
        name = worker_name(self.spec.namespace, role, worker_id)
        pg = new_placement(self.spec, name, "detached")
        self.placements[name] = pg
        await asyncio.wait_for(pg.ready(), READY_TIMEOUT_S)
        handle = start_worker(self.spec, role, worker_id, pg, "detached")
        await asyncio.wait_for(WorkerRef(handle).ready(), READY_TIMEOUT_S)
        await asyncio.wait_for(
            worker_plug(self.spec).after_start(self.spec, handle), READY_TIMEOUT_S
        )
        return handle

    async def stop(self, role: Role, worker_id: int, handle: ActorRef) -> None:
        import ray

        name = worker_name(self.spec.namespace, role, worker_id)
        with contextlib.suppress(Exception):  # flush its last KV events and close its bus
            await asyncio.wait_for(WorkerRef(handle).shutdown(), 5.0)
        with contextlib.suppress(ValueError):  # gone already
            ray.kill(ray.get_actor(name, namespace=RAY_NAMESPACE), no_restart=True)
        remove_named_placement(name, self.placements.pop(name, None))

    def find(self, role: Role, worker_id: int) -> ActorRef | None:
        import ray

        try:
            return ray.get_actor(
                worker_name(self.spec.namespace, role, worker_id), namespace=RAY_NAMESPACE
            )
        except ValueError:
            return None

    async def release(self) -> None:
        if self.detached_service:
            return
        import ray

        for name, pg in list(self.placements.items()):
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(name, namespace=RAY_NAMESPACE), no_restart=True)
            remove_named_placement(name, pg)
        self.placements.clear()


def remove_named_placement(name: str, pg: PlacementGroup | None = None) -> None:
    """Remove placement group ``pg``, or every live one named ``name`` (the service's deploy-time
    groups carry their worker's name; a re-split's group is made by another process)."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    groups = [pg] if pg is not None else []
    if pg is None:
        with contextlib.suppress(Exception):
            for pg_id, info in ray.util.placement_group_table().items():
                if info.get("name") == name and info.get("state") != "REMOVED":
                    groups.append(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))
    for group in groups:
        with contextlib.suppress(Exception):
            remove_placement_group(group)
