"""The actors of one running service, and finding them by name (docs/design.md "Serve runtime").

Actors are named ``<namespace>-<role>[-<id>]`` in the Ray namespace ``disaggctl``; a re-split
(the controller actor's, cluster/ray/pools.py) starts a worker under its new role's name, so
after one the service finds its workers by name rather than by the handles it started with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from cluster.ray.worker_factory import RAY_NAMESPACE, worker_name

__all__ = ["ServiceHandles", "head_node_id", "kill_named_workers", "named_workers"]

ROLES = ("prefill", "decode")


@dataclass
class ServiceHandles:
    """The actors of one running service, by role."""

    prefill: dict[int, Any] = field(default_factory=dict)
    decode: dict[int, Any] = field(default_factory=dict)
    router: Any = None
    auction: Any = None
    poa: Any = None
    controller: Any = None
    metrics: Any = None  # cluster.ray.metrics_server: /metrics on its own port
    placement_groups: list[Any] = field(default_factory=list)

    def actors(self) -> list[Any]:
        singles = [self.metrics, self.controller, self.poa, self.auction, self.router]
        return [a for a in singles if a is not None] + [
            *self.decode.values(),
            *self.prefill.values(),
        ]


def head_node_id() -> str:
    """Ray's head node (the one holding ``node:__internal_head__``), else this process's."""
    for node in ray.nodes():  # type: ignore[no-untyped-call]  # Ray leaves it untyped
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return str(node["NodeID"])
    return str(ray.get_runtime_context().get_node_id())


def named_workers(
    namespace: str, worker_ids: Sequence[int]
) -> tuple[dict[int, Any], dict[int, Any]]:
    """The prefill and decode worker actors running now, by worker id."""
    pools: dict[str, dict[int, Any]] = {role: {} for role in ROLES}
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
