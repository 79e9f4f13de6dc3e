"""The actors of one running service, and finding them by name (docs/design.md "Serve runtime").

Actors are named ``<namespace>-<role>[-<id>]`` in the Ray namespace ``disaggctl``; a re-split
(the controller actor's, cluster/ray/pools.py) starts a worker under its new role's name, so
after one the service finds its workers by name rather than by the handles it started with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import ray

from cluster.actor_ref import ActorHandles, ActorRef
from cluster.ray.worker_factory import RAY_NAMESPACE, worker_name

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

__all__ = ["ServiceHandles", "head_node_id", "kill_named_workers", "named_workers"]

ROLES = ("prefill", "decode")


@dataclass
class ServiceHandles:
    """The actors of one running service, by role."""

    prefill: dict[int, ActorRef] = field(default_factory=dict)
    decode: dict[int, ActorRef] = field(default_factory=dict)
    router: ActorRef | None = None
    auction: ActorRef | None = None
    poa: ActorRef | None = None
    controller: ActorRef | None = None
    metrics: ActorRef | None = None  # cluster.ray.metrics_server: /metrics on its own port
    placement_groups: list[PlacementGroup] = field(default_factory=list)

    def actors(self) -> list[ActorRef]:
        singles = [self.metrics, self.controller, self.poa, self.auction, self.router]
        return [a for a in singles if a is not None] + [
            *self.decode.values(),
            *self.prefill.values(),
        ]

    def for_ingress(self) -> ActorHandles:
        """The running actors as an ingress replica is given them."""
        if self.auction is None:
            raise RuntimeError("the service's auction actor has not started")
        return ActorHandles(
            auction=self.auction, router=self.router, poa=self.poa, controller=self.controller,
            prefill=dict(self.prefill), decode=dict(self.decode),
        )  # fmt: skip


def head_node_id() -> str:
    """Ray's head node (the one holding ``node:__internal_head__``), else this process's."""
    for node in ray.nodes():  # type: ignore[no-untyped-call]  # Ray leaves it untyped
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return str(node["NodeID"])
    return str(ray.get_runtime_context().get_node_id())


def named_workers(
    namespace: str, worker_ids: Sequence[int]
) -> tuple[dict[int, ActorRef], dict[int, ActorRef]]:
    """The prefill and decode worker actors running now, by worker id."""
    pools: dict[str, dict[int, ActorRef]] = {role: {} for role in ROLES}
    for wid in worker_ids:
        for role in ROLES:
            with contextlib.suppress(ValueError):  # no actor of that name
                name = worker_name(namespace, role, wid)
                pools[role][wid] = ray.get_actor(name, namespace=RAY_NAMESPACE)
    return pools["prefill"], pools["decode"]


def kill_named_workers(namespace: str, worker_ids: Sequence[int]) -> None:
    """Kill every worker actor of these ids under either role, and remove its placement group."""
    from cluster.ray.launcher import remove_named_placement

    for wid in worker_ids:
        for role in ROLES:
            name = worker_name(namespace, role, wid)
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(name, namespace=RAY_NAMESPACE), no_restart=True)
            remove_named_placement(name)
