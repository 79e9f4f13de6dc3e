"""The Dynamo backend's engines (``disaggctl serve --backend dynamo``; docs/design.md §6).

:class:`cluster.service.Service` composes the same service — NATS, Ray, the auction, PoA and
controller actors, the OpenAI ingress — whatever its engines; :class:`DynamoEngines` is what
it is given for Dynamo (``cluster.backends.engines_for`` picks it when ``backend`` is
``dynamo``), and changes three parts:

- workers: one :class:`cluster.backends.dynamo.worker_actor.DynamoWorkerActor` per slot, each
owning one
  Dynamo process (``dynamo.mocker`` or ``dynamo.vllm``) placed by the same accelerator resources;
- the router: :class:`cluster.backends.dynamo.shadow.ShadowRouterActor`, fed by Dynamo's KV events,
told
  each worker's instance id (and again after every restart of its process);
- the request path: :class:`cluster.serve.path.ActorRequestPath` over
  :class:`cluster.backends.dynamo.backend.DynamoBackend`, which routes with Dynamo's
  ``KvRouter`` and the controller's override.

The Dynamo processes of one service share its discovery (``cluster/backends/dynamo/discovery.py``):
a
fresh file-discovery folder (removed at stop: a stale entry would name a dead worker), or etcd
at ``dynamo.etcd_endpoints``, or an etcd the engines start themselves
(``cluster/backends/dynamo/etcd_server.py``,
stopped at stop). They keep their logs under ``<ledger folder>/dynamo-logs`` on their nodes.
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.actor_ref import ActorHandles, answer_of
from cluster.backends.dynamo.discovery import Discovery, listen_host
from cluster.backends.dynamo.etcd_auth import ensure_etcd_credentials
from cluster.backends.dynamo.etcd_server import EtcdServer
from cluster.backends.dynamo.install import require_dynamo
from cluster.backends.dynamo.shadow import ShadowRouterActor
from cluster.backends.dynamo.worker_actor import EngineProcess
from cluster.backends.dynamo.worker_spec import DynamoWorkerSpec
from cluster.backends.registry import engine_spec
from cluster.nats_auth import CREDENTIALS_ENV, credentials_directory
from cluster.ray.launcher import READY_TIMEOUT_S
from cluster.ray.refs import get_answers
from cluster.ray.service_handles import ServiceHandles
from cluster.serve.deployment import PathFactory
from cluster.worker_spec import WorkerSpec

if TYPE_CHECKING:
    from cluster.config import ServeConfig

__all__ = ["DynamoEngines"]

log = logging.getLogger(__name__)


class DynamoEngines:
    """Dynamo processes under the worker actors (module docstring)."""

    def __init__(self, config: ServeConfig) -> None:
        if config.backend != "dynamo":
            raise ValueError("DynamoEngines serve backend 'dynamo' only")
        require_dynamo()  # before anything starts: a clear error naming the install command
        self.config = config
        self.discovery: Discovery | None = None
        self.etcd: EtcdServer | None = None  # the one the engines started, if they did
        self.log_dir = config.dynamo.log_dir or str(
            Path(config.ledger_path).parent.resolve() / "dynamo-logs"
        )
        self.instances: dict[str, dict[int, int]] = {"prefill": {}, "decode": {}}

    def worker_spec(self, base: WorkerSpec) -> WorkerSpec:
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        own = DynamoWorkerSpec(
            settings=self.config.dynamo.model_dump(), discovery=self._discovery(),
            log_dir=self.log_dir,
        )  # fmt: skip
        return base.model_copy(update={"engine": engine_spec("dynamo", own.model_dump())})

    def _discovery(self) -> Discovery:
        if self.discovery is None:
            d = self.config.dynamo
            if d.discovery == "file":
                self.discovery = Discovery.folder(tempfile.mkdtemp(prefix="disagg-dyn-"))
            elif d.etcd_endpoints is not None:
                self.discovery = Discovery.etcd(d.etcd_endpoints)
            else:  # on the driver's node, where every node of the Ray cluster can reach it
                # With the bus's credentials, etcd admits only their `dynamo` user.
                directory = credentials_directory()
                user = None if directory is None else ensure_etcd_credentials(directory)
                if user is None:
                    log.warning("etcd without authentication: no credentials directory "
                                "(%s) to hold its password", CREDENTIALS_ENV)  # fmt: skip
                self.etcd = EtcdServer(listen_host(d.bind), user=user).start()
                self.discovery = Discovery.etcd(self.etcd.url)
        return self.discovery

    def started_workers(self, handles: ServiceHandles) -> None:
        for role, pool in (("prefill", handles.prefill), ("decode", handles.decode)):
            answers = get_answers([a.start.remote() for a in pool.values()], READY_TIMEOUT_S)
            for slot, answer in zip(pool, answers, strict=True):
                info = answer_of(EngineProcess, answer, f"{role} worker {slot}'s start()")
                if info.instance_id is None:  # start() returns once its process serves
                    raise RuntimeError(f"{role} worker {slot} serves without a Dynamo instance id")
                self.instances[role][slot] = info.instance_id

    def router_actor(self, base: Mapping[str, object]) -> tuple[type, dict[str, object]]:
        kwargs = {k: v for k, v in base.items() if k != "local_prefill_max_tokens"}
        d = self.config.dynamo
        kwargs.update(
            block_size=d.block_size,
            components={"prefill": d.prefill_component, "decode": d.decode_component},
            dynamo_namespace=d.namespace,
            dynamo_endpoint=d.endpoint,
            instances=self.instances,
        )
        return ShadowRouterActor, kwargs

    def started_control_plane(self, handles: ServiceHandles) -> None:
        workers = [*handles.prefill.values(), *handles.decode.values()]
        # From now on each worker re-binds its instance id after a restart of its process.
        get_answers([w.attach.remote(handles.router) for w in workers], READY_TIMEOUT_S)

    def path_factory(self, handles: ActorHandles, nats_url: str | None) -> PathFactory:
        from cluster.backends.dynamo.backend import make_dynamo_path

        cfg = self.config
        assert nats_url is not None and self.discovery is not None  # set at start
        return functools.partial(
            make_dynamo_path, handles=handles, profile=cfg.profile,
            nats_url=nats_url, namespace=cfg.namespace,
            settings=cfg.dynamo.model_dump(), discovery=self.discovery,
            model_name=cfg.dynamo.model_name, exchange_period_s=cfg.admission.exchange_period_s,
            chunk_interval_s=cfg.stream_chunk_s,
        )  # fmt: skip

    def stop(self) -> None:
        if self.discovery is not None and self.discovery.backend == "file":
            shutil.rmtree(self.discovery.location, ignore_errors=True)
        self.discovery = None
        if self.etcd is not None:
            self.etcd.close()
            self.etcd = None
