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

from typing import Any, Literal

from pydantic import Field

from cluster.dynamo.discovery import Discovery
from cluster.models import StrictModel
from cluster.ray.workers import DecodeWorkerActor, PrefillWorkerActor

__all__ = [
    "RAY_NAMESPACE",
    "WorkerSpec",
    "control_actor_name",
    "dynamo_worker_settings",
    "new_placement",
    "start_worker",
    "worker_class",
    "worker_name",
    "worker_seed",
]

RAY_NAMESPACE = "disaggctl"
Role = Literal["prefill", "decode"]
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


def worker_class(role: str) -> type:
    if role == "prefill":
        return PrefillWorkerActor
    if role == "decode":
        return DecodeWorkerActor
    raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")


class DynamoWorkerSpec(StrictModel):
    """Where a service's Dynamo workers run: their settings (``DynamoSettings`` as a dict), the
    discovery every Dynamo process of the service shares (``cluster.dynamo.discovery``) and the
    folder of their logs (one file per worker, on each worker's node)."""

    settings: dict[str, Any]
    discovery: Discovery
    log_dir: str = Field(min_length=1, max_length=4096)


def _dynamo_worker_class(role: str) -> type:
    from cluster.dynamo.worker_actor import DynamoWorkerActor

    worker_class(role)  # the same check of the role
    return DynamoWorkerActor


class WorkerSpec(StrictModel):
    """What every worker of one service is started with (from its ``ServeConfig``); a plain
    JSON-able shape so the composer can hand it to the controller actor."""

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
    # The Dynamo backend (docs/design.md §6): the workers are Dynamo processes, each owned by a
    # ``cluster.dynamo.worker_actor.DynamoWorkerActor``; None: the simulated engines.
    dynamo: DynamoWorkerSpec | None = None


def dynamo_worker_settings(spec: WorkerSpec) -> dict[str, Any]:
    """A Dynamo worker's settings: the service's, and for vLLM the TP size of its placement
    (``--tensor-parallel-size``, unless ``vllm_args`` already sets it), so the engine spans
    exactly the GPUs its bundle holds."""
    if spec.dynamo is None:
        raise ValueError("not a Dynamo service: spec.dynamo is None")
    settings = dict(spec.dynamo.settings)
    args = tuple(settings.get("vllm_args", ()))
    if settings.get("engine") == "vllm" and "--tensor-parallel-size" not in args:
        settings["vllm_args"] = (*args, "--tensor-parallel-size", str(spec.tp))
    return settings


def new_placement(spec: WorkerSpec, name: str, lifetime: Lifetime) -> Any:
    """A placement group of one bundle holding the worker's TP share of the accelerator (a TP
    group never spans nodes); not yet waited for (``pg.ready()``)."""
    from ray.util.placement_group import placement_group

    tp = float(spec.tp)
    bundle = {spec.accelerator_resource: tp}
    if spec.request_gpus:
        bundle["GPU"] = tp
    return placement_group([bundle], strategy="STRICT_PACK", name=name, lifetime=lifetime)


def start_worker(
    spec: WorkerSpec, role: str, worker_id: int, placement: Any, lifetime: Lifetime
) -> Any:
    """Start the ``role`` worker ``worker_id`` on ``placement``; its handle (call ``ready()``)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cls = worker_class(role) if spec.dynamo is None else _dynamo_worker_class(role)
    tp = float(spec.tp)
    options: dict[str, Any] = {
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
    if spec.dynamo is not None:
        # The actor restarts its process itself (its watch loop); Ray restarts the actor when
        # its own process or node dies, and the restarted actor starts a process again
        # (``restore``). Never two at once: a dead actor's process dies with it (the watchdog).
        d = spec.dynamo
        return ray.remote(cls).options(**options).remote(
            role, worker_id, dynamo_worker_settings(spec), nats_url=spec.nats_url,
            discovery=d.discovery, log_dir=d.log_dir, model_path=spec.model_dir,
            router_name=control_actor_name(spec.namespace, "router"),
        )  # fmt: skip
    kwargs: dict[str, Any] = {
        "speedup": spec.speedup,
        "epoch_wall": spec.epoch_wall,
        "nats_url": spec.nats_url,
        "namespace": spec.namespace,
        "seed": worker_seed(spec.seed, worker_id),
    }
    if role == "decode":
        kwargs["model_dir"] = spec.model_dir
    return ray.remote(cls).options(**options).remote(worker_id, spec.profile, **kwargs)
