"""The simulated backend's registry entry (``cluster.backends``): its worker actors, and the
service's steps that change nothing (the workers need nothing after they start, the router
actor is ours, the path is each replica's own router over the worker actors)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cluster.actor_ref import ActorHandles, ActorRef
from cluster.backends.protocol import Engines
from cluster.backends.registry import engine_spec
from cluster.ray.router_actor import RouterActor
from cluster.ray.service_handles import ServiceHandles
from cluster.ray.worker_factory import worker_seed
from cluster.serve.deployment import PathFactory
from cluster.sim.profile import load_profile
from cluster.worker_spec import WorkerSpec

if TYPE_CHECKING:
    from cluster.config import ServeConfig

__all__ = ["PLUG", "SimEngines", "SimPlug"]


class SimEngines:
    """The simulated engines of the configured hardware profile (wall-clock, ``speedup``)."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config

    def worker_spec(self, base: WorkerSpec) -> WorkerSpec:
        return base.model_copy(update={"engine": engine_spec("sim")})

    def started_workers(self, handles: ServiceHandles) -> None:
        pass

    def router_actor(self, base: Mapping[str, object]) -> tuple[type, dict[str, object]]:
        profile = load_profile(self.config.profile)
        bound = profile.kv_index_bound(profile.block_size)
        return RouterActor, {**base, "max_blocks_per_worker": bound}

    def started_control_plane(self, handles: ServiceHandles) -> None:
        pass

    def path_factory(self, handles: ActorHandles, nats_url: str | None) -> PathFactory:
        from cluster.backends.sim.path import make_actor_path

        cfg = self.config
        profile = load_profile(cfg.profile)
        return functools.partial(
            make_actor_path, handles=handles, profile=cfg.profile, speedup=cfg.speedup,
            nats_url=nats_url, namespace=cfg.namespace, block_size=profile.block_size,
            local_prefill_max_tokens=profile.decode.local_prefill_max_tokens,
            seed=cfg.seed, routing=cfg.routing.model_dump(),
            chunk_interval_s=cfg.stream_chunk_s, submit_timeout_s=cfg.submit_timeout_s,
            prefill_timeout_s=cfg.prefill_timeout_s,
            exchange_period_s=cfg.admission.exchange_period_s,
        )  # fmt: skip

    def stop(self) -> None:
        pass


class SimPlug:
    """The simulated backend (``backend: sim``)."""

    name = "sim"
    settings_model = None

    def worker_class(self, role: str) -> type:
        from cluster.backends.sim.workers import DecodeWorkerActor, PrefillWorkerActor

        return PrefillWorkerActor if role == "prefill" else DecodeWorkerActor

    def worker_arguments(
        self, spec: WorkerSpec, role: str, worker_id: int
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        kwargs: dict[str, object] = {
            "speedup": spec.speedup,
            "epoch_wall": spec.epoch_wall,
            "nats_url": spec.nats_url,
            "namespace": spec.namespace,
            "seed": worker_seed(spec.seed, worker_id),
        }
        if role == "decode":
            kwargs["model_dir"] = spec.model_dir
        return (worker_id, spec.profile), kwargs

    async def after_start(self, spec: WorkerSpec, handle: ActorRef) -> None:
        pass

    def switch_warmup_s(self, spec: WorkerSpec, role_switch_s: float) -> float:
        # The profile's role switch (weights and KV layout), in wall seconds at the speed-up.
        return role_switch_s / spec.speedup

    def engines(self, config: ServeConfig) -> Engines:
        return SimEngines(config)


PLUG = SimPlug()
