"""The composition of the live service (``disaggctl serve``; docs/design.md "Serve runtime").

``Service.start`` brings up, in order: NATS (embedded unless a URL is configured), Ray (local, or
joined), the worker actors (one per worker, each on a placement group of one bundle holding its TP
share of the accelerator resource, so a TP group never spans nodes), the router, auction, PoA and
controller actors, and the Ray Serve ingress. ``Service.stop`` takes everything down in reverse,
so nothing is left running. Actors are named ``<namespace>-<role>[-<id>]`` in the Ray namespace
``disaggctl`` so that ``disaggctl status`` and tests can find them.

``start_actors`` and ``ingress_application`` are the two halves on their own: ``serve deploy``
(``cluster/app_builder.py``) runs them with ``lifetime="detached"`` on a Ray cluster, with
an external NATS server, and leaves the rest (HTTP options, shutdown) to Serve.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.actor_ref import ActorRef, answer_of
from cluster.backends.protocol import Engines, engines_for
from cluster.config import ServeConfig
from cluster.hub_cache import hub_cache_entry
from cluster.model_dir import default_model_dir, prepare_model_dir
from cluster.models import ConfigError
from cluster.nats_auth import exported_env
from cluster.nats_server import NatsServer
from cluster.ray.auction_actor import AuctionActor
from cluster.ray.controller_actor import ControllerActor
from cluster.ray.metrics_server import Listening, MetricsServerActor
from cluster.ray.named_actor import NamedActor
from cluster.ray.poa_actor import PoaActor
from cluster.ray.refs import get_answers, kill_actor
from cluster.ray.runtime import CONTROL_RESOURCE_UNIT, LocalRay, init_ray
from cluster.ray.service_handles import (
    ServiceHandles,
    head_node_id,
    kill_named_workers,
    named_workers,
)
from cluster.ray.worker_factory import (
    RAY_NAMESPACE,
    control_actor_name,
    new_placement,
    start_actor,
    start_worker,
    worker_name,
)
from cluster.serve.deployment import INGRESS_REPLICA_CPUS, check_ingress_cpus
from cluster.serve.direct_ingress import (
    REPLICA_ENV,
    direct_urls,
    serve_proxies,
    start_serve,
    wait_answering,
)
from cluster.serve.users import Users
from cluster.sim.cluster import Topology
from cluster.sim.profile import HardwareProfile, load_profile
from cluster.worker_spec import WorkerSpec
from controller.resplit import Pools

if TYPE_CHECKING:
    from ray.serve import Application

__all__ = ["RAY_NAMESPACE", "Service", "ServiceHandles"]

# Spare accelerators declared on a local session beyond what the topology needs, so a restarted
# worker can be placed while its predecessor's bundle is being released.
SPARE_TP_GROUPS = 1
READY_TIMEOUT_S = 120.0
# Serve's proxies learn the route table by long poll after ``serve.run`` returns and answer 404
# until then. Proxies on one host (the fake nodes of a test cluster) share the API port through
# SO_REUSEPORT and each new connection lands on any of them, so the service waits for this many
# answers in a row per proxy: one not yet routing escapes n proxies' 10·n draws with probability
# ((n - 1)/n)^(10·n) < e^-10.
PROXY_STREAK = 10


class Service:
    """One running service: start it, read its URLs, stop it."""

    def __init__(
        self, config: ServeConfig, *, users: Users | None = None, engines: Engines | None = None
    ) -> None:
        """``engines``: what the workers run; by default those ``config.backend`` names."""
        self.config = config
        self.engines = engines if engines is not None else engines_for(config)
        # The config decides whether keyless requests are served (as "anonymous", bid 0).
        self.users = Users.from_wire(
            None if users is None else users.to_wire(), allow_anonymous=config.allow_anonymous
        )
        self.profile: HardwareProfile = load_profile(config.profile)
        self.topology = Topology.parse(config.topology)
        self.handles = ServiceHandles()
        self.nats: NatsServer | None = None
        self.ray: LocalRay | None = None
        self.nats_url: str | None = config.nats_url
        self.url: str | None = None
        self.tokenizer_repo: str | None = None  # the tiny model's, laid out for offline tools
        self.direct_urls: list[str] = []  # each ingress replica's own port (config.direct_port)
        self.metrics_url: str | None = None  # http://host:port/metrics once started
        self.actor_env: dict[str, str] = {}  # what actors need that Ray does not pass on
        self.epoch_wall = 0.0
        self._lifetime: str | None = None  # "detached": see start_actors

    # -- start -------------------------------------------------------------------------------

    def start(
        self, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None
    ) -> Service:
        try:
            self._start(host, port, address)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, host: str, port: int, address: str | None) -> None:
        cfg = self.config
        if self.nats_url is None:
            self._start_embedded_nats()
        tp = self.profile.tp
        gpus = self.topology.gpus(tp) + SPARE_TP_GROUPS * tp
        # Each ingress replica reserves INGRESS_REPLICA_CPUS: a local session declares at least
        # that many logical CPUs (the replicas mostly wait on I/O and share the cores well).
        cpus = cfg.ingress_replicas * INGRESS_REPLICA_CPUS
        self.ray = init_ray(
            address, accelerators=gpus, accelerator=cfg.accelerator_resource,
            num_cpus=max(2, os.cpu_count() or 2, math.ceil(cpus)),
            control_resource=cfg.control_resource,
        )  # fmt: skip
        # A Ray session that this process started after naming the bus's credentials passes
        # them on to every actor; one that ran before (joined) does not: then each actor and
        # replica gets them in its runtime_env (a directory's name, no secret).
        if self.nats is not None and self.nats.exported and not self.ray.owned:
            self.actor_env = exported_env()
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]  # Ray leaves it untyped
        check_ingress_cpus(cfg.ingress_replicas, float(resources.get("CPU", 0.0)))
        model_dir = str(
            prepare_model_dir(Path(cfg.model_dir))
            if cfg.model_dir
            else default_model_dir(self.profile.context_tokens)
        )
        self.model_dir = model_dir
        # The tiny model's tokenizer, where offline tools that take a repo id find it (aiperf).
        self.tokenizer_repo = None if cfg.model_dir else hub_cache_entry(Path(model_dir))
        # The default directory is per node (a cache under $HOME): on a cluster the actors and
        # replicas elsewhere build their own (None). A configured one must exist on every node.
        shared = model_dir if cfg.model_dir else None
        self.start_actors(shared)
        self._deploy_ingress(host, port, shared)
        self.url = f"http://{host}:{port}"
        wait_answering([self.url], READY_TIMEOUT_S, streak=PROXY_STREAK * serve_proxies())
        if cfg.direct_port is not None:
            self.direct_urls = direct_urls(host, cfg.direct_port, cfg.ingress_replicas)
            wait_answering(self.direct_urls, READY_TIMEOUT_S)

    def _start_embedded_nats(self) -> None:
        """The laptop's nats-server: with the credentials this process already names (a test
        session, an operator's), else a fresh set for this run, exported to every process the
        service starts (``cluster.nats_auth``)."""
        self.nats = NatsServer().start()
        self.nats.export_credentials()
        self.nats_url = self.nats.url

    def start_actors(self, model_dir: str | None, *, lifetime: str | None = None) -> ServiceHandles:
        """Start the worker and control-plane actors on the Ray session already joined, talking
        to ``self.nats_url``; ``model_dir`` None: each node builds the default one.

        ``lifetime="detached"`` (``serve deploy``, :mod:`cluster.app_builder`): the actors
        and their placement groups outlive the job that starts them, and an actor whose name
        already exists in the namespace is reused (``ray.get_actor``) instead of started again.
        A reused actor keeps the clock epoch it was started with."""
        if lifetime not in (None, "detached"):
            raise ValueError(f"lifetime must be None or 'detached', got {lifetime!r}")
        control = self.config.control_resource
        if control is not None and not ray.cluster_resources().get(control):  # type: ignore[no-untyped-call]
            raise ConfigError(
                f"control_resource: no node of the Ray cluster joined declares {control!r}; "
                "the control plane and the ingress would wait for one forever"
            )
        self._lifetime = lifetime
        self.epoch_wall = time.time()
        self._start_workers(model_dir)
        self._start_control_plane()
        self._start_metrics_server()
        return self.handles

    def _existing(self, name: str) -> ActorRef | None:
        """The detached actor ``name`` if it already runs (reused by a redeploy), else None."""
        if self._lifetime != "detached":
            return None
        try:
            return ray.get_actor(name, namespace=RAY_NAMESPACE)
        except ValueError:  # no such actor
            return None

    def _lifetime_option(self) -> dict[str, object]:
        return {} if self._lifetime is None else {"lifetime": self._lifetime}

    def worker_spec(self, model_dir: str | None) -> WorkerSpec:
        """What every worker of this service starts with (deploy time and re-splits)."""
        cfg = self.config
        return self.engines.worker_spec(WorkerSpec(
            profile=cfg.profile, tp=self.profile.tp, speedup=cfg.speedup,
            epoch_wall=self.epoch_wall, seed=cfg.seed, nats_url=self.nats_url,
            namespace=cfg.namespace, model_dir=model_dir,
            accelerator_resource=cfg.accelerator_resource, request_gpus=cfg.request_gpus,
            max_restarts=cfg.worker_max_restarts, env_vars=self.actor_env,
        ))  # fmt: skip

    def _start_workers(self, model_dir: str | None) -> None:
        self._spec = self.worker_spec(model_dir)
        for p in range(self.topology.prefill):
            self.handles.prefill[p] = self._worker("prefill", p)
        for d in range(self.topology.decode):
            wid = self.topology.prefill + d
            self.handles.decode[wid] = self._worker("decode", wid)
        self._await_ready([*self.handles.prefill.values(), *self.handles.decode.values()])
        self.engines.started_workers(self.handles)

    def _worker(self, role: str, worker_id: int) -> ActorRef:
        """The worker actor: the running detached one, or a new one on its own placement group
        (created only when the actor is)."""
        name = worker_name(self.config.namespace, role, worker_id)
        existing = self._existing(name)
        if existing is not None:
            return existing
        pg = new_placement(self._spec, name, self._lifetime)  # type: ignore[arg-type]
        self.handles.placement_groups.append(pg)
        ray.get(pg.ready(), timeout=READY_TIMEOUT_S)
        return start_worker(self._spec, role, worker_id, pg, self._lifetime)  # type: ignore[arg-type]

    def _max_in_prefill(self) -> int:
        """The auction's bound as configured, or as derived for the largest prefill pool a
        re-split can make (every worker but one decode worker)."""
        fixed = self.config.auction.max_in_prefill
        workers = self.topology.prefill + self.topology.decode
        return fixed or self.config.prefill_slots_per_worker() * workers

    def _control_options(self, role: str) -> dict[str, object]:
        # Every queued admit holds one of the auction's concurrency slots while it waits.
        auction = self.config.auction
        concurrency = auction.max_queue + self._max_in_prefill() + 1024
        # The auction owns the ledger and runs on Ray's head: the one node that holds a SQLite
        # ledger's volume, or a PostgreSQL ledger's password (the Helm chart gives either to
        # the head only). The head carries the GCS, so pinning costs no availability.
        on_head = (
            {"scheduling_strategy": NodeAffinitySchedulingStrategy(head_node_id(), soft=False)}
            if role == "auction"
            else {}
        )
        control = self.config.control_resource
        return {
            "name": control_actor_name(self.config.namespace, role),
            **on_head,
            **({"resources": {control: CONTROL_RESOURCE_UNIT}} if control else {}),
            "namespace": RAY_NAMESPACE,
            "num_cpus": 0,
            "max_restarts": -1,  # the control plane always comes back
            "max_task_retries": 0,
            "max_concurrency": max(10_000, concurrency),
            **self._lifetime_option(),
            **({"runtime_env": {"env_vars": self.actor_env}} if self.actor_env else {}),
        }

    def _start_control_plane(self) -> None:
        cfg, h = self.config, self.handles
        nats = {"nats_url": self.nats_url, "namespace": cfg.namespace}
        h.router = self._control("router", *self.engines.router_actor(self._router_arguments()))
        users = self.users.ledger_users()
        h.auction = self._control(
            "auction",
            AuctionActor,
            dict(
                settings=cfg.auction.model_dump(),
                ledger=cfg.ledger_url or str(Path(cfg.ledger_path).resolve()),
                ledger_schema=cfg.ledger_schema,
                users=users,
                lease_ttl_s=cfg.admission.lease_ttl_s,
                hold_grace_s=cfg.admission.hold_grace_s,
                slots_per_prefill_worker=cfg.prefill_slots_per_worker(),
                prefill_workers=Pools(self.topology.prefill, self.topology.decode).prefilling,
                **nats,
            ),
        )
        h.poa = self._control(
            "poa",
            PoaActor,
            dict(
                profile=cfg.profile,
                speedup=cfg.speedup,
                epoch_wall=self.epoch_wall,
                workers={"prefill": list(h.prefill), "decode": list(h.decode)},
                **nats,
            ),
        )
        h.controller = self._control(
            "controller",
            ControllerActor,
            dict(
                # By name, not by handle: a handle argument would sit in the object store,
                # which a restarting actor may not find again (cluster/ray/named_actor.py).
                router=NamedActor(control_actor_name(cfg.namespace, "router")),
                auction=NamedActor(control_actor_name(cfg.namespace, "auction")),
                poa=NamedActor(control_actor_name(cfg.namespace, "poa")),
                settings=cfg.controller.model_dump(),
                epoch_wall=self.epoch_wall,
                pools={"prefill": len(h.prefill), "decode": len(h.decode)},
                workers={"prefill": list(h.prefill), "decode": list(h.decode)},
                worker_spec=self._spec.model_dump(),
                # Not a kwarg named "detached": under Ray 2.60 a restarted actor given one
                # never ran the ready() it queues itself (test_service_reliability).
                release_on_shutdown=self._lifetime != "detached",
                **nats,
            ),
        )
        self._await_ready([h.router, h.auction, h.poa, h.controller])
        self.engines.started_control_plane(h)

    def _start_metrics_server(self) -> None:
        """``/metrics`` on ``metrics_host:metrics_port``, on Ray's head node (where an operator
        looks for it; on Kubernetes the head pod, which the chart's ServiceMonitor selects)."""
        cfg, h = self.config, self.handles
        head = NodeAffinitySchedulingStrategy(node_id=head_node_id(), soft=False)
        options = {**self._control_options("metrics"), "scheduling_strategy": head}
        existing = self._existing(control_actor_name(cfg.namespace, "metrics"))
        metrics = existing or start_actor(
            MetricsServerActor, options,
            host=cfg.metrics_host, port=cfg.metrics_port, namespace=cfg.namespace,
            # Names, not handles, as the controller is given them (cluster/ray/named_actor.py).
            actors={role: NamedActor(control_actor_name(cfg.namespace, role))
                    for role in ("router", "auction", "poa", "controller")},
            prefill={}, decode={}, worker_ids=[*h.prefill, *h.decode],
        )  # fmt: skip
        h.metrics = metrics
        (answer,) = get_answers([metrics.ready.remote()], READY_TIMEOUT_S)
        where = answer_of(Listening, answer, "the metrics server's ready()")
        host = where.host if where.host not in ("0.0.0.0", "::") else "127.0.0.1"
        self.metrics_url = f"http://{host}:{where.port}/metrics"

    def _router_arguments(self) -> dict[str, object]:
        """What every router actor is given (the engines add theirs, or take some away)."""
        h = self.handles
        return dict(
            prefill_workers=list(h.prefill),
            decode_workers=list(h.decode),
            block_size=self.profile.block_size,
            local_prefill_max_tokens=self.profile.decode.local_prefill_max_tokens,
            seed=self.config.seed,
            nats_url=self.nats_url,
            namespace=self.config.namespace,
        )

    def _control(self, role: str, cls: type, kwargs: Mapping[str, object]) -> ActorRef:
        """The control-plane actor ``role``: the running detached one, or a new one."""
        existing = self._existing(control_actor_name(self.config.namespace, role))
        if existing is not None:
            return existing
        return start_actor(cls, self._control_options(role), **kwargs)

    def _await_ready(self, actors: Sequence[ActorRef | None]) -> None:
        get_answers([a.ready.remote() for a in actors if a is not None], READY_TIMEOUT_S)

    def _deploy_ingress(self, host: str, port: int, model_dir: str | None) -> None:
        cfg = self.config
        start_serve(host, port, cfg.direct_port, cfg.ingress_replicas)
        from ray import serve

        serve.run(self.ingress_application(model_dir), name="disaggctl", route_prefix="/")

    def ingress_application(self, model_dir: str | None) -> Application:
        """The OpenAI ingress bound to the running actors (``model_dir`` None: each replica's
        node builds the default one), for ``serve.run`` or a ``serve deploy`` builder."""
        from cluster.serve.deployment import ingress_app

        cfg = self.config
        return ingress_app(
            self.engines.path_factory(self.handles.for_ingress(), self.nats_url),
            model_name=cfg.model_name,
            model_dir=model_dir,
            context_tokens=self.profile.context_tokens,
            users=self.users,
            num_replicas=cfg.ingress_replicas,
            max_ongoing_requests=cfg.max_ongoing_requests,
            metrics_sink=self.handles.metrics,
            env_vars={**self.actor_env, **(REPLICA_ENV if cfg.direct_port is not None else {})},
            limits=cfg.limits,
            resources=(
                {cfg.control_resource: CONTROL_RESOURCE_UNIT} if cfg.control_resource else None
            ),
        )

    # -- stop --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Take everything down; safe to call twice and after a failed start."""
        if ray.is_initialized():
            with contextlib.suppress(Exception):
                from ray import serve

                serve.shutdown()  # type: ignore[no-untyped-call]  # Ray Serve leaves it untyped
            for actor in self.handles.actors():
                with contextlib.suppress(Exception):
                    get_answers([actor.shutdown.remote()], 5)
                with contextlib.suppress(Exception):
                    kill_actor(actor)
            for pg in self.handles.placement_groups:
                with contextlib.suppress(Exception):
                    remove_placement_group(pg)
            self._stop_moved_workers()
        self.handles = ServiceHandles()
        if self.ray is not None and self.ray.owned:
            ray.shutdown()
            if self.ray.tmpdir:  # the session's sockets and logs: ours to remove
                shutil.rmtree(self.ray.tmpdir, ignore_errors=True)
        self.ray = None
        if self.nats is not None:
            self.nats.close()
            self.nats = None
        self.engines.stop()

    def _worker_ids(self) -> list[int]:
        return list(range(self.topology.prefill + self.topology.decode))

    def _stop_moved_workers(self) -> None:
        """Workers a re-split started (the controller actor's, detached so that they survive
        its restarts; cluster/ray/pools.py) are not in ``handles``: find them by name."""
        if self._lifetime != "detached":
            kill_named_workers(self.config.namespace, self._worker_ids())

    def refresh_workers(self) -> ServiceHandles:
        """Point ``handles.prefill``/``decode`` at the workers serving now: a re-split (the
        controller actor's) moves a worker id to the other role under a new actor."""
        found = named_workers(self.config.namespace, self._worker_ids())
        self.handles.prefill, self.handles.decode = found
        return self.handles

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
