"""One Dynamo worker slot (prefill or decode) as an actor: starts, watches and restarts its process.

A plain class; the composer wraps it with ``ray.remote(num_cpus=0)(DynamoWorkerActor)`` (the
process, not the actor, does the work) and tests call it in-process. Each slot owns one
``DynamoProcess`` at a time. A process that exits without being asked to is restarted (up to
``max_restarts``, with exponential backoff from ``restart_backoff_s``); every (re)start registers a
*new* Dynamo instance id, so after each one the actor tells the attached router
(``router_handle.bind_instance.remote(role, slot, instance_id)``), which is how routing learns the
id that KV events and ``KvRouter.best_worker`` will carry from then on. A router call that fails
is logged, never raised: the worker serves either way.

``shutdown`` and ``drain`` stop the watch task before they stop the process, so an intended stop
is never mistaken for a crash and restarted.

Liveness: a process can be alive and still serve nothing (stopped, deadlocked, its event loop
stuck). The watch asks its ``/health`` every ``health_period_s``; after ``health_failures``
answers in a row that are not "generate: ready", it kills the process, which the watch then
restarts like any exit (``hung_kills`` counts these).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster.actor_ref import ActorRef
from cluster.backends.dynamo.discovery import Discovery, listen_host
from cluster.backends.dynamo.install import require_dynamo
from cluster.backends.dynamo.process import DynamoProcess, DynamoStartError, parse_metrics
from cluster.backends.dynamo.settings import (
    DynamoSettings,
    Role,
    dynamo_env,
    free_system_port,
    worker_command,
)
from cluster.ray.actor_support import restore_after_restart
from cluster.ray.status import EngineInflight

__all__ = ["DynamoWorkerActor", "EngineProcess", "EngineProcessState", "dynamo_worker_name"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineProcess:
    """An engine actor's process, as ``start`` and ``ready`` answer it: the actor's ``slot``
    in its ``role``'s pool, the Dynamo ``instance_id`` its process registered (None until it
    serves), that process's ``pid`` and ``system_port`` (None before one started), its
    ``log`` file, and how often the watch restarted it (``restarts``), of which for failing
    its health checks (``hung_kills``)."""

    slot: int
    role: str
    instance_id: int | None
    pid: int | None
    system_port: int | None
    log: str
    restarts: int
    hung_kills: int


@dataclass(frozen=True)
class EngineProcessState(EngineProcess):
    """``info``: the process, whether it is ``alive``, its ``/health`` JSON (empty when it is
    not) and why the watch gave up on it (``failed``; None while it has not)."""

    alive: bool
    health: Mapping[str, object]
    failed: str | None


PORT_ATTEMPTS = 3  # a free port can be taken between our probe and Dynamo's bind: try again
MAX_BACKOFF_S = 30.0
STOP_GRACE_S = 10.0
INFLIGHT_METRIC = "dynamo_component_inflight_requests"


def dynamo_worker_name(namespace: str, role: str, slot: int) -> str:
    """The name of a worker slot's actor (and log file): ``<namespace>-dynamo-<role>-<slot>``."""
    return f"{namespace}-dynamo-{role}-{slot}"


class DynamoWorkerActor:
    """One worker slot; see the module docstring. Constructing it validates and starts nothing."""

    def __init__(
        self,
        role: str,
        slot: int,
        settings: Mapping[str, object],
        *,
        nats_url: str,
        discovery: Discovery,
        log_dir: str,
        model_path: str | None = None,
        router_name: str | None = None,
    ) -> None:
        if role not in ("prefill", "decode"):
            raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"slot must be an int >= 0, got {slot!r}")
        self.settings = DynamoSettings.model_validate(settings)
        self.role: Role = role  # type: ignore[assignment]
        self.slot = slot
        self.nats_url = nats_url
        self.discovery = Discovery.model_validate(discovery)
        name = dynamo_worker_name(self.settings.namespace, role, slot)
        self.log_path = Path(log_dir) / f"{name}.log"
        # The process's own working directory, beside its log on its node: no two workers share
        # one, as on hosts of their own. Made fresh at the first start and removed at shutdown;
        # an actor killed outright leaves it in the deployment's log folder, never in /tmp.
        self._work_path = Path(log_dir) / f"{name}.work"
        self.work_dir: Path | None = None
        self.model_path = model_path or self.settings.model_path
        self.component = self.settings.component(self.role)
        self.process: DynamoProcess | None = None
        self.instance_id: int | None = None
        self.restarts = 0
        self.hung_kills = 0  # processes killed for failing their health checks
        self.failed: str | None = None  # why the watch gave up, once it has
        self._router: ActorRef | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self._lock = asyncio.Lock()
        # The router actor's name (in cluster.ray.worker_factory.RAY_NAMESPACE): what a restarted
        # actor attaches to again, having lost the handle the composer gave its predecessor.
        self.router_name = router_name
        self._restored = False  # set by restore(): the router is then found by name
        self._restoring: asyncio.Task[EngineProcess] | None = None
        self._restarted = restore_after_restart("restore")

    def attach(self, router_handle: ActorRef) -> None:
        """The router to tell each new instance id (``bind_instance.remote(role, slot, id)``)."""
        self._router = router_handle

    # -- lifecycle ---------------------------------------------------------------------------

    async def restore(self) -> EngineProcess:
        """After Ray restarted this actor (its node was lost, say, and its placement group
        re-placed elsewhere): attach to the router again and start a process, which registers
        a new instance id and is bound at the router. The composer's ``attach`` and ``start``
        did this for the first actor; the old process died with its owner (the watchdog)."""
        self._restored = True
        try:
            return await self.start()
        except Exception:  # the first start after a loss may meet a loaded cluster
            log.exception("%s: restore: the first start failed; the watch retries", self._name)
            async with self._lock:
                if self._watch is None or self._watch.done():
                    self._watch = asyncio.create_task(self._watch_loop())
            return self._summary()

    async def _find_router(self) -> None:
        """A restarted actor's router, by name (the composer's handle died with its
        predecessor); looked up again at every bind until found."""
        if not self._restored or self.router_name is None or self._router is not None:
            return
        import ray

        from cluster.ray.worker_factory import RAY_NAMESPACE

        try:
            self._router = await asyncio.to_thread(
                ray.get_actor, self.router_name, namespace=RAY_NAMESPACE
            )
        except Exception as exc:  # not there yet, or the GCS slow to answer
            log.warning("%s: router %r not found yet: %s", self._name, self.router_name, exc)

    async def start(self) -> EngineProcess:
        """Start the process, wait until it serves, tell the router; idempotent."""
        async with self._lock:
            if self.process is None or not self.process.alive:
                require_dynamo()
                self._stopping = False
                await self._launch()
            if self._watch is None or self._watch.done():
                self._watch = asyncio.create_task(self._watch_loop())
        return self._summary()

    async def _model_path(self) -> str:
        if self.model_path is None:
            from cluster.model_dir import default_model_dir

            self.model_path = str(await asyncio.to_thread(default_model_dir))
        return self.model_path

    async def _launch(self) -> None:
        """One process up and ready (retrying a taken system port), then bound at the router."""
        argv = worker_command(self.settings, self.role, await self._model_path())
        if self.work_dir is None:
            await asyncio.to_thread(_fresh_dir, self._work_path)
            self.work_dir = self._work_path
        host = listen_host(self.settings.bind)
        for attempt in range(PORT_ATTEMPTS):
            port = free_system_port()
            env = dynamo_env(
                self.settings,
                nats_url=self.nats_url,
                discovery=self.discovery,
                system_port=port,
                host=host,
            )
            process = DynamoProcess(
                argv,
                env,
                self.log_path,
                port,
                component=self.component,
                endpoint=self.settings.endpoint,
                cwd=self.work_dir,
            )
            self.process = process
            await asyncio.to_thread(process.start)
            try:
                self.instance_id = await process.wait_ready(self.settings.startup_timeout_s)
                break
            except DynamoStartError:
                if not process.port_taken() or attempt + 1 == PORT_ATTEMPTS:
                    raise
                log.warning("%s: system port %d was taken; retrying", self._name, port)
        await self._bind()

    async def _bind(self) -> None:
        await self._find_router()
        if self._router is None or self.instance_id is None:
            return
        try:
            result: object = self._router.bind_instance.remote(
                self.role, self.slot, self.instance_id
            )
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, timeout=30.0)
        except Exception:  # the worker serves either way; the router may be restarting
            log.exception("%s: bind_instance(%s) failed", self._name, self.instance_id)

    async def _watch_loop(self) -> None:
        """Restart the process whenever it exits unasked (or hangs: module docstring), up to
        ``max_restarts`` times."""
        loop = asyncio.get_running_loop()
        next_check, failures = loop.time() + self.settings.health_period_s, 0
        while not self._stopping:
            process = self.process
            if process is not None and process.alive:
                await asyncio.sleep(0.1)
                if loop.time() >= next_check and not self._stopping:
                    next_check = loop.time() + self.settings.health_period_s
                    failures = 0 if await self._serving(process) else failures + 1
                    if failures >= self.settings.health_failures and process.alive:
                        log.error("%s: /health failed %d times in a row; killing pid %s",
                                  self._name, failures, process.pid)  # fmt: skip
                        self.hung_kills += 1
                        failures = 0
                        await asyncio.to_thread(process.kill)
                continue
            failures = 0
            if self.restarts >= self.settings.max_restarts:
                self.failed = f"exited {self.restarts + 1} times; restarts exhausted"
                log.error("%s: %s", self._name, self.failed)
                return
            rc = process.returncode if process is not None else None
            delay = min(MAX_BACKOFF_S, self.settings.restart_backoff_s * 2**self.restarts)
            log.warning("%s: exited (%s); restarting in %.2f s", self._name, rc, delay)
            self.restarts += 1
            await asyncio.sleep(delay)
            async with self._lock:
                if self._stop_requested():
                    return
                try:
                    await self._launch()
                except Exception as exc:  # the next round retries; the watch must survive
                    log.error("%s: restart failed: %s", self._name, exc)

    @staticmethod
    async def _serving(process: DynamoProcess) -> bool:
        health = await process.health()
        endpoints = health.get("endpoints") if isinstance(health, dict) else None
        return isinstance(endpoints, dict) and endpoints.get("generate") == "ready"

    def _stop_requested(self) -> bool:
        """``_stopping`` read afresh: another task may have set it while this one awaited."""
        return self._stopping

    async def _stop_watch(self) -> None:
        self._stopping = True
        watch, self._watch = self._watch, None
        if watch is not None and not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def drain(self, timeout_s: float) -> bool:
        """Stop taking work: SIGTERM makes Dynamo deregister at once and finish what is in
        flight. True if the process exited within ``timeout_s`` (else it keeps running until
        :meth:`shutdown`)."""
        await self._stop_watch()
        process = self.process
        if process is None or not process.alive:
            return True
        process.terminate()
        return await process.wait_exit(max(timeout_s, 0.0))

    async def shutdown(self) -> None:
        """Stop the watch first (no restart), then the process; idempotent."""
        await self._stop_watch()
        async with self._lock:
            if self.process is not None:
                await asyncio.to_thread(self.process.stop, STOP_GRACE_S)
            if self.work_dir is not None:
                shutil.rmtree(self.work_dir, ignore_errors=True)
                self.work_dir = None

    async def kill_engine(self) -> int:
        """SIGKILL the Dynamo process (tests, chaos drills); the watch restarts it. Its pid."""
        process = self.process
        pid = process.pid if process is not None else None
        if process is None or pid is None:
            raise RuntimeError(f"{self._name}: no running process to kill")
        await asyncio.to_thread(process.kill)
        return pid

    # -- observation -------------------------------------------------------------------------

    @property
    def _name(self) -> str:
        return dynamo_worker_name(self.settings.namespace, self.role, self.slot)

    def _summary(self) -> EngineProcess:
        process = self.process
        return EngineProcess(
            slot=self.slot,
            role=self.role,
            instance_id=self.instance_id,
            pid=process.pid if process is not None else None,
            system_port=process.system_port if process is not None else None,
            log=str(self.log_path),
            restarts=self.restarts,
            hung_kills=self.hung_kills,
        )

    def _restore_if_forgotten(self) -> None:
        """A restarted actor whose queued ``restore`` has not run (yet) restores on the first
        call that reaches it (a readiness or metrics poll)."""
        if self._restarted and not self._restored:
            self._restored = True  # one restore, however many polls arrive before it runs
            # Held, or the loop's weak reference would let it be collected mid-way.
            self._restoring = asyncio.get_running_loop().create_task(self.restore())

    async def ready(self) -> EngineProcess:
        """What :meth:`start` returned, for the composer's readiness wait."""
        self._restore_if_forgotten()
        return self._summary()

    async def info(self) -> EngineProcessState:
        """The summary with whether the process is alive, its /health JSON and why the watch
        gave up (if it has)."""
        self._restore_if_forgotten()
        process = self.process
        alive = process is not None and process.alive
        health = await process.health() if process is not None and alive else {}
        summary = dataclasses.asdict(self._summary())
        return EngineProcessState(**summary, alive=alive, health=health, failed=self.failed)

    async def load(self) -> EngineInflight:
        """Best effort, to pick the least-loaded worker."""
        text = await self.metrics_text()
        values = [
            value
            for name, labels, value in parse_metrics(text)
            if name == INFLIGHT_METRIC and labels.get("dynamo_endpoint") == self.settings.endpoint
        ]
        return EngineInflight(self.slot, self.role, self.instance_id,
                              sum(values) if values else None)  # fmt: skip

    async def metrics_text(self) -> str:
        """The process's own ``/metrics`` text (its system port), "" while it does not run. The
        ingress merges it into the service's one ``/metrics`` as it does every worker actor's
        (``cluster.ray.metrics_export.merge_metrics_texts``): Dynamo's ``dynamo_component_*``
        families, one series per worker by their ``worker_id`` label."""
        self._restore_if_forgotten()
        process = self.process
        if process is None or not process.alive:
            return ""
        return await process.metrics_text()


def _fresh_dir(path: Path) -> None:
    """``path`` as an empty directory (what a killed predecessor left in it removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)
