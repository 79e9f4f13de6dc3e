"""The router actor: the control plane's routing view (docs/design.md "Data flow (serve mode)").

Requests are routed inside the ingress replicas (``cluster.dataplane.replica``); this actor holds
what they sync to and what the operator reads:

- the controller's policy (``set_policy``) and the pools' members (``add_worker`` /
  ``remove_worker`` from a re-split), served as one :class:`RoutingView` (``view``);
- a KV index per pool fed by the workers' KV events on NATS, as each replica's is (its counts
  of applied and dropped events are in ``stats``);
- the fleet's routing stats, summed from the replicas' ``load`` reports: requests in flight per
  pool, routed, retries, routed per worker (a replica's share leaves with its last report's TTL).

It still routes for in-process compositions and tests (``route``, answering the replicas'
:class:`~cluster.dataplane.routing.Route` record, ``finish_prefill``, ``complete``), with the same
``PoolRouting`` the replicas use; nothing on the serve path calls them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from cluster.actor_bus import ActorBus, subscribe_when_connected
from cluster.dataplane.peers import PeerLoads
from cluster.dataplane.replica import peer_report
from cluster.dataplane.routing import ROLES, PoolRouting, Route, RoutingView
from cluster.events import Event, LoadEvent, RouteEvent
from cluster.kv_wire import kv_subject
from cluster.ray.actor_support import Ready, check_request_id, ready_record, wake_after_restart
from cluster.ray.metrics_export import OWNERS, owned_metrics_text
from cluster.ray.status import KvEventCounts, RouterStats
from router import Policy, Router
from telemetry.metrics import ROUTING_COST

__all__ = ["ROLES", "RouterActor"]

READY_TIMEOUT_S = 10.0


class RouterActor:
    def __init__(
        self, *, prefill_workers: list[int], decode_workers: list[int], block_size: int,
        local_prefill_max_tokens: int, tau: float = 0.0, omega: float = 1.0, seed: int = 0,
        nats_url: str | None, namespace: str = "disagg", max_blocks_per_worker: int | None = None,
    ) -> None:  # fmt: skip
        for role, ids in (("prefill", prefill_workers), ("decode", decode_workers)):
            if not isinstance(ids, list | tuple):
                raise ValueError(f"{role}_workers must be a list of worker ids")
        self.pools = PoolRouting(
            block_size=block_size, local_prefill_max_tokens=local_prefill_max_tokens,
            policy=Policy(tau, omega, 0), seed=seed, prefill_workers=prefill_workers,
            decode_workers=decode_workers, max_blocks_per_worker=max_blocks_per_worker,
        )  # fmt: skip
        if not self.pools.workers("decode"):
            raise ValueError("decode_workers must name at least one worker")
        self.routers: dict[str, Router] = self.pools.routers  # type: ignore[assignment]
        self.block_size = block_size
        self.local_prefill_max_tokens = local_prefill_max_tokens
        self.bus = ActorBus(nats_url, namespace, role="router", name="router")
        self._namespace = namespace
        self._subscribed = False
        self.replicas = PeerLoads()  # the ingress replicas' load reports
        self._tasks: list[asyncio.Task[object]] = []
        wake_after_restart()  # a restarted router subscribes to KV events at once

    @property
    def regime(self) -> str:
        return self.pools.regime

    @property
    def routed(self) -> int:
        return self.pools.routed

    @routed.setter
    def routed(self, value: int) -> None:
        self.pools.routed = value

    @property
    def routed_to(self) -> dict[str, dict[int, int]]:
        return self.pools.routed_to  # type: ignore[return-value]

    # -- lifecycle ---------------------------------------------------------------------------

    async def _start(self) -> None:
        if not self._subscribed:
            self._subscribed = True
            for role in ROLES:
                await self.bus.subscribe_kv(self.kv_subject_of(role), self._kv_handler(role))
            self.bus.start()
            self._tasks.append(
                asyncio.get_running_loop().create_task(
                    subscribe_when_connected(self.bus, self._on_event, ("load",))
                )
            )

    def kv_subject_of(self, role: str) -> str:
        """Where ``role``'s workers publish their KV events."""
        return kv_subject(self._namespace, role)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, LoadEvent):
            self.replicas.update(peer_report(event, time.monotonic()))

    async def ready(self) -> Ready:
        await self._start()
        connected = await self.bus.wait_connected(READY_TIMEOUT_S)
        nats = connected if self.bus.bus is not None else None  # None: running without NATS
        return ready_record("router", nats=nats)

    async def metrics_text(self) -> str:
        return owned_metrics_text(OWNERS["router"])

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.bus.close()

    # -- KV events ---------------------------------------------------------------------------

    def _kv_handler(self, role: str) -> Callable[[object], None]:
        def handle(payload: object) -> None:
            self.feed_kv(role, payload)

        return handle

    def feed_kv(self, role: str, payload: object) -> bool:
        """Apply one KV payload (Dynamo shape) to ``role``'s index; never raises (the index
        counts what it skips). The NATS handler; also for in-process use without NATS."""
        return self.pools.feed_kv(role, payload)

    async def apply_kv_events(self, role: str, payloads: Sequence[object]) -> int:
        """Apply KV payloads without NATS (in-process compositions); how many were applied."""
        self._role(role)
        return sum(self.feed_kv(role, p) for p in payloads)

    # -- the control plane's view ------------------------------------------------------------

    async def view(self) -> RoutingView:
        """The policy and pools every ingress replica routes with."""
        await self._start()
        return self.pools.view()

    # -- routing (in-process compositions; the serve path routes in its replicas) -------------

    async def route(
        self, request_id: str, tokens: list[int], user: str = "anonymous",
        exclude: list[int] | None = None,
    ) -> Route:  # fmt: skip
        """Pick the decode worker (and a prefill worker when the decode worker lacks more than
        ``local_prefill_max_tokens``), reserve their load, publish the route event."""
        await self._start()
        route = self.pools.route(request_id, tokens, user, exclude or ())
        decision = route.decision
        try:
            event = RouteEvent.from_decision(
                decision, time.time(), user, route.regime, route.prefill_decision
            )
        except BaseException:
            self.pools.complete(request_id)
            raise
        ROUTING_COST.set(decision.chosen.cost)
        self.bus.publish(event)
        return route

    def _checked_request(self, request_id: str, tokens: object, user: object) -> list[int]:
        """``ValueError`` naming the field for a bad request; the prompt's block hashes."""
        return self.pools.checked_request(request_id, tokens, user)

    async def finish_prefill(self, request_id: str) -> None:
        """The prefill is done: the decode worker's prefill tokens and the prefill worker's
        reservation are returned (idempotent)."""
        check_request_id(request_id)
        self.pools.finish_prefill(request_id)

    async def complete(self, request_id: str) -> None:
        """The request ended (any way): release everything it holds (idempotent)."""
        check_request_id(request_id)
        self.pools.complete(request_id)

    # -- control -----------------------------------------------------------------------------

    async def set_policy(self, policy: Policy) -> None:
        """The controller's new policy, for both pools."""
        if not isinstance(policy, Policy):
            raise ValueError(f"a policy is a router.Policy, got {type(policy).__name__}")
        self.pools.set_policy(policy)

    async def add_worker(self, role: str, worker_id: int) -> None:
        self.pools.add_worker(self._role(role), worker_id)  # type: ignore[arg-type]

    async def remove_worker(self, role: str, worker_id: int) -> None:
        """Stop routing to ``worker_id``; its index entries and reservations go with it."""
        role = self._role(role)
        if role == "decode" and self.pools.workers("decode") == (worker_id,):
            raise ValueError("worker_id: the decode pool cannot lose its last worker")
        self.pools.remove_worker(role, worker_id)  # type: ignore[arg-type]

    def _role(self, role: object) -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return str(role)

    async def stats(self) -> RouterStats:
        """Policy, workers, KV events applied/dropped per pool, and the fleet's routing: this
        actor's own routes plus what the ingress replicas' unexpired reports say."""
        self.replicas.expire(time.monotonic())
        policy = self.pools.policy
        routed, retries, routed_to = self.replicas.counters()
        in_flight = {r: self.pools.in_flight(r) for r in ROLES}
        for role in ROLES:
            for view in self.replicas.totals(role).values():
                in_flight[role] += view.active_requests
            for worker, n in self.pools.routed_to[role].items():
                routed_to[role][worker] = routed_to[role].get(worker, 0) + n
        return RouterStats(
            policy=policy,
            workers={r: tuple(self.pools.workers(r)) for r in ROLES},
            kv_events={
                r: KvEventCounts(
                    dict(self.routers[r].index.applied), dict(self.routers[r].index.dropped)
                )
                for r in ROLES
            },
            in_flight=in_flight,
            routed=self.pools.routed + routed,
            routed_to=routed_to,
            retries=self.pools.retries + retries,
            replicas=tuple(self.replicas.replicas()),
            routed_by_replica=self.replicas.routed_by_replica(),
            nats_connected=self.bus.connected if self.bus.bus is not None else None,
            events_dropped=self.bus.dropped,
        )
