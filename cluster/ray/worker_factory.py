"""Starting one worker actor the way the service deploys it (docs/design.md "Serve runtime").

The composer (``cluster.service``) starts every worker at deploy time and the controller actor's
re-split (``cluster.ray.pools``) starts one in its new role at run time; both go through
:func:`new_placement` and :func:`start_worker`, so a worker that changed role has exactly the
options, resources and placement its role gets at deploy time.

Workers are named ``<namespace>-<role>-<id>`` in the Ray namespace :data:`RAY_NAMESPACE`: the
request path and the controller find a worker by its role and id (``ray.get_actor``), so a
worker that a re-split replaced is reached without anyone holding a list of handles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from cluster.actor_ref import ActorRef
from cluster.worker_spec import WorkerSpec, worker_plug

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

__all__ = [
    "RAY_NAMESPACE",
    "control_actor_name",
    "new_placement",
    "start_actor",
    "start_worker",
    "worker_name",
    "worker_seed",
]

RAY_NAMESPACE = "disaggctl"
Lifetime = Literal["detached"] | None


def worker_name(namespace: str, role: str, worker_id: int) -> str:
    """The worker actor's (and its placement group's) name."""
    return f"{namespace}-{role}-{worker_id}"


def control_actor_name(namespace: str, role: str) -> str:
    """A control-plane actor's name (``router``, ``auction``, ``poa``, ``controller``,
    ``metrics``), in the same Ray namespace as the workers."""
    return f"{namespace}-{role}"


def worker_seed(seed: int, worker_id: int) -> int:
    # Per worker id, not per role: a worker keeps its seed across a re-split.
    return seed * 7919 + worker_id


def new_placement(spec: WorkerSpec, name: str, lifetime: Lifetime) -> PlacementGroup:
    """A placement group of one bundle holding the worker's TP share of the accelerator (a TP
    group never spans nodes); not yet waited for (``pg.ready()``)."""
    from ray.util.placement_group import placement_group

    tp = float(spec.tp)
    bundle = {spec.accelerator_resource: tp}
    if spec.request_gpus:
        bundle["GPU"] = tp
    group: PlacementGroup = placement_group(
        [bundle], strategy="STRICT_PACK", name=name, lifetime=lifetime
    )
    return group


def start_worker(
    spec: WorkerSpec, role: str, worker_id: int, placement: PlacementGroup, lifetime: Lifetime
) -> ActorRef:
    """Start the ``role`` worker ``worker_id`` on ``placement``; its handle (call ``ready()``)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
    plug = worker_plug(spec)
    cls = plug.worker_class(role)
    args, kwargs = plug.worker_arguments(spec, role, worker_id)
    tp = float(spec.tp)
    options: dict[str, object] = {
        "name": worker_name(spec.namespace, role, worker_id),
        "namespace": RAY_NAMESPACE,
        "num_cpus": 0,
        "num_gpus": tp if spec.request_gpus else 0,
        "resources": {spec.accelerator_resource: tp},
        "max_restarts": spec.max_restarts,
        "max_task_retries": 0,  # a request is retried by the path, on another worker
        "max_concurrency": 10_000,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(placement),
    }
    if spec.env_vars:
        options["runtime_env"] = {"env_vars": dict(spec.env_vars)}
    if lifetime is not None:
        options["lifetime"] = lifetime
    return start_actor(cls, options, *args, **kwargs)


def start_actor(
    cls: type, options: Mapping[str, object], *args: object, **kwargs: object
) -> ActorRef:
    """``ray.remote(cls).options(**options).remote(*args, **kwargs)``: the new actor's handle."""
    import ray
    from ray.actor import ActorHandle

    handle: object = ray.remote(cls).options(**options).remote(*args, **kwargs)
    if not isinstance(handle, ActorHandle):  # ray.remote's overloads also admit a class
        raise TypeError(f"ray.remote({cls.__name__}) started no actor")
    return handle
