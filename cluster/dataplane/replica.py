"""One ingress replica's router: routing in-process, its view kept current off the request path
(docs/design.md "Data flow (serve mode)", "Router replicas").

A request is routed by :meth:`ReplicaRouter.route` without leaving the replica: its own
``PoolRouting`` decides, reserves and publishes the route event. What keeps the view current
runs beside the requests, never in their way:

- **KV index**: the workers' KV events on NATS (``kv_subject(ns, role)``), as Dynamo's frontend
  replicas keep theirs;
- **loads**: this replica's own in-flight requests exactly (its reservations), plus the other
  replicas' absolute per-worker reports (``load`` events, one every ``report_period_s`` from each
  replica, each counted for ``report_ttl_s``; ``cluster.dataplane.peers``), corrected by the
  engines' own snapshots (``engine_load`` events; ``cluster.dataplane.engine_loads``);
- **policy and pools**: the controller's ``regime`` events (applied when their policy version
  is newer), the ``pools`` events of a re-split, and every ``view_sync_s`` the router actor's
  :class:`~cluster.dataplane.routing.RoutingView` (what catches a replica up after a lost
  event, and what a new replica starts from).

Without NATS (in-process compositions) the replica routes on what it is told: ``feed_kv``,
``apply_view``; a lone replica then has no peers and its own reservations are the whole load.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from cluster.actor_bus import ActorBus, cancel_all, subscribe_when_connected
from cluster.actor_ref import ActorRef
from cluster.dataplane.calls import FailureCount, ask, detached_task
from cluster.dataplane.engine_loads import EngineLoads, engine_snapshot
from cluster.dataplane.peers import PeerLoads, PeerReport, ReportGate
from cluster.dataplane.refs import RouterCalls
from cluster.dataplane.routing import ROLES, PoolRouting, Role, Route, RoutingView
from cluster.dataplane.settings import RoutingSettings
from cluster.events import (
    EngineLoadEvent,
    Event,
    LoadEvent,
    PoolsEvent,
    RegimeEvent,
    RouteEvent,
    WorkerLoad,
)
from cluster.kv_wire import kv_subject
from router import LoadView
from telemetry.metrics import EVENTS_DROPPED

__all__ = ["ReplicaRouter"]

log = logging.getLogger(__name__)

VIEW_TIMEOUT_S = 5.0


class ReplicaRouter:
    """The routing view of one ingress replica (module docstring)."""

    def __init__(
        self,
        routing: PoolRouting,
        bus: ActorBus,
        *,
        control: ActorRef | None = None,
        settings: RoutingSettings | None = None,
        replica_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        kv_subjects: Mapping[Role, str] | None = None,
    ) -> None:
        self.routing = routing
        self.bus = bus
        # The router actor (its ``view``), or None: the replica is told in-process.
        self.control = RouterCalls(control) if control is not None else None
        self.settings = settings if settings is not None else RoutingSettings()
        self.replica_id = replica_id or f"ingress-{uuid.uuid4().hex[:12]}"
        self.clock = clock
        # Where the workers publish KV events: Dynamo's subjects, or (None) the service's.
        self.kv_subjects = dict(kv_subjects) if kv_subjects is not None else None
        self.peers = PeerLoads()
        self.engines = EngineLoads()
        # The deployment's workers: a re-split moves them between the pools, never adds one, so
        # a pools event naming any other, or leaving no decode worker, is refused.
        self.deployment = frozenset(w for role in ROLES for w in routing.workers(role))
        self.refused_pools = 0
        self.view_syncs = 0
        self._view_failures = FailureCount("routing view sync")
        self.reports = 0
        self.last_cost: float | None = None  # the chosen worker's cost in the last decision
        # Called with each regime the controller announces (the admission gate listens).
        self.regime_listeners: list[Callable[[str], None]] = []
        self._gate = ReportGate(self.settings.report_ttl_s)
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the control plane's view (so the first request routes with the current policy
        and pools), subscribe to the bus, start the report and sync loops."""
        await self.sync_view()
        subjects = self.kv_subjects or {r: kv_subject(self.bus.namespace, r) for r in ROLES}
        for role, subject in subjects.items():
            await self.bus.subscribe_kv(subject, self._kv(role))
        self.bus.start()
        # Started in the first request, but the replica's own (cluster.dataplane.calls).
        self._tasks = [
            detached_task(self._subscribe(), name="replica-events"),
            detached_task(self._report_loop(), name="replica-load-reports"),
            detached_task(self._sync_loop(), name="replica-view-sync"),
        ]

    async def aclose(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []

    # -- the request's calls (in-process, no await) ------------------------------------------

    def route(
        self, request_id: str, tokens: Sequence[int], user: str, exclude: Iterable[int] = ()
    ) -> Route:
        route = self.routing.route(request_id, tokens, user, tuple(exclude))
        self.last_cost = float(route.decision.chosen.cost)  # disagg_routing_cost
        event = RouteEvent.from_decision(
            route.decision, time.time(), user, route.regime, route.prefill_decision
        )
        self.bus.publish(event)
        return route

    def finish_prefill(self, request_id: str) -> None:
        self.routing.finish_prefill(request_id)

    def complete(self, request_id: str) -> None:
        self.routing.complete(request_id)

    # -- what keeps the view current ---------------------------------------------------------

    def _kv(self, role: Role) -> Callable[[object], None]:
        def handle(payload: object) -> None:
            self.feed_kv(role, payload)

        return handle

    def feed_kv(self, role: Role, payload: object) -> bool:
        return self.routing.feed_kv(role, payload)

    def apply_view(self, view: RoutingView) -> None:
        self.routing.apply_view(view)
        # The router actor is the control plane itself (an actor call, not the bus).
        self.deployment |= {*view.prefill_workers, *view.decode_workers}

    async def sync_view(self) -> bool:
        """Read the router actor's view and apply it; False when it did not answer (the
        replica keeps routing on what it has: the router restarting must not stop requests)."""
        if self.control is None:
            return False
        control = self.control
        view = await ask(control.view, VIEW_TIMEOUT_S, self._view_failures)
        if view is None:
            return False
        self.apply_view(view)
        self.view_syncs += 1
        return True

    def on_event(self, event: Event) -> None:
        if isinstance(event, LoadEvent):
            if event.replica != self.replica_id:
                self.peers.update(peer_report(event, self.clock()))
        elif isinstance(event, EngineLoadEvent):
            # Only the workers this replica routes to: a snapshot for any other id would sit in
            # the view (and in memory) for nothing.
            if any(event.worker_id in self.routing.workers(role) for role in ROLES):
                self.engines.update(engine_snapshot(event, self.clock()))
        elif isinstance(event, RegimeEvent):
            for listener in self.regime_listeners:
                listener(event.regime)
            if event.policy_version > self.routing.policy.version:
                self.routing.set_policy(event.policy())
        elif isinstance(event, PoolsEvent) and self._plausible_pools(event):
            self.routing.set_workers(event.prefill_workers, event.decode_workers)

    def _plausible_pools(self, event: PoolsEvent) -> bool:
        """Whether ``event`` could come from this deployment's controller: only its workers,
        at least one decoding (the server already refuses the subject to every other role)."""
        named = set(event.prefill_workers) | set(event.decode_workers)
        if event.decode_workers and named <= self.deployment:
            return True
        self.refused_pools += 1
        EVENTS_DROPPED.labels("implausible_worker").inc()
        if self.refused_pools & (self.refused_pools - 1) == 0:  # 1st, 2nd, 4th, ...
            log.warning("refused a pools event naming %s (deployment: %s)",
                        sorted(named)[:8], sorted(self.deployment)[:8])  # fmt: skip
        return False

    async def _subscribe(self) -> None:
        kinds = ("load", "engine_load", "regime", "pools")
        await subscribe_when_connected(self.bus, self.on_event, kinds)

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.view_sync_s)
            await self.sync_view()

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.report_period_s)
            try:
                self.refresh_loads()
                self.report()
            except Exception:  # a report is best-effort; the next period tries again
                log.exception("load report failed")

    def report(self) -> bool:
        """Publish this replica's load report if it changed since the last one, or as a
        heartbeat once a third of the TTL has passed (an idle replica stays in the others'
        views without a message every period); True if published."""
        event = self.load_event()
        now = self.clock()
        key = (event.prefill, event.decode, event.routed, event.retries)
        if not self._gate.due(key, now):
            return False
        self.bus.publish(event)
        self._gate.sent(key, now)
        self.reports += 1
        return True

    def refresh_loads(self) -> None:
        """Drop expired reports and snapshots; the peers' totals, corrected by the engines'
        snapshots, become each worker's load held elsewhere."""
        now = self.clock()
        self.peers.expire(now)
        self.engines.expire(now)
        for role in ROLES:
            peers = self.peers.totals(role)
            if len(self.engines):
                peers = self.engines.corrected(role, peers, self.routing.own_loads(role))
            self.routing.report_loads(role, peers)

    def load_event(self) -> LoadEvent:
        """This replica's own loads and counters, absolute (the ``load`` event)."""
        routing = self.routing

        def loads(role: Role) -> tuple[WorkerLoad, ...]:
            counts = routing.routed_to[role]
            return tuple(
                WorkerLoad(
                    worker_id=w,
                    prefill_tokens=v.active_prefill_tokens,
                    decode_blocks=v.active_decode_blocks,
                    requests=v.active_requests,
                    routed=counts.get(w, 0),
                )
                for w, v in routing.own_loads(role).items()
            )

        return LoadEvent(
            replica=self.replica_id, t=time.time(), ttl_s=self.settings.report_ttl_s,
            prefill=loads("prefill"), decode=loads("decode"), routed=routing.routed,
            retries=routing.retries,
        )  # fmt: skip

    def view_requests(self) -> dict[str, dict[int, int]]:
        """Requests in flight on each worker as this replica sees them: its own exactly, the
        other replicas' from their unexpired reports. Every replica's converge on the fleet's
        (within a report period), which ``disagg_ingress_view_requests`` shows."""
        self.refresh_loads()
        out: dict[str, dict[int, int]] = {}
        for role in ROLES:
            loads = self.routing.routers[role].loads
            out[role] = {w: loads.view(w).active_requests for w in loads.workers}
        return out


def peer_report(event: LoadEvent, now: float) -> PeerReport:
    """A ``load`` event as the view counts it: valid ``ttl_s`` from its arrival (``now``)."""

    def loads(items: tuple[WorkerLoad, ...]) -> dict[int, LoadView]:
        return {w.worker_id: LoadView(w.prefill_tokens, w.decode_blocks, w.requests) for w in items}

    return PeerReport(
        replica=event.replica,
        loads={"prefill": loads(event.prefill), "decode": loads(event.decode)},
        routed=event.routed,
        retries=event.retries,
        routed_to={
            "prefill": {w.worker_id: w.routed for w in event.prefill},
            "decode": {w.worker_id: w.routed for w in event.decode},
        },
        expires=now + event.ttl_s,
    )
