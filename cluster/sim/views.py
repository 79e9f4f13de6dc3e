"""Router replicas and what each of them sees (docs/design.md §6, "Routers see load late").

A real deployment runs R frontends, each with its own KV router: its own KV index fed by the
workers' KV events and its own load view. A load balancer spreads requests over them round-robin
in release order; the replica that routes a request also picks its prefill worker. Two things
reach a replica through the bus, ``delay_s`` late:

- KV events: each replica's index applies a worker's event ``delay_s`` after it was published
  (``delay_s`` = 0: synchronously, the moment the cache changes);
- load reports (``routing.report_period_s``): every period the workers' true loads are snapshotted
  and delivered to every replica ``delay_s`` later. The truth is a ``LoadTracker`` per role that
  holds every routed request's reservation (as its deciding replica computed it) until its
  prefill and its completion return it, as a lone router's own bookkeeping would. At delivery a
  replica replaces each worker's reported load with the snapshot and drops its own reservations
  of the requests it routed before the snapshot (the snapshot counts them already), keeping the
  ones routed since (a router knows its own in-flight requests, as Dynamo's does).

No ``routing`` section means routers see load exactly: every replica reserves every request the
moment any replica routes it. One replica with a fresh view (the defaults) is a lone router with
instant events: the simulator before replicas existed, decision for decision.

Reports run only while some request holds load: when the truth is empty the last snapshot
(all zeros) is delivered and the ticker stops, so a loop run to exhaustion still ends; the next
routed request restarts it on the period's grid.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from cluster.dataplane.settings import RoutingSettings
from cluster.sim.loop import EventLoop
from router import Decision, KvEvent, LoadTracker, Policy, Reservation, Router, Selection
from router.hashing import Tokens

Role = Literal["prefill", "decode"]
ROLES: Final[tuple[Role, ...]] = ("prefill", "decode")
MAX_REPLICAS: Final = 64
MAX_DELAY_S: Final = 10.0
# Replica k's routers draw from seed + k·stride (decode) and + 1 (prefill): replica 0 keeps the
# seeds of the lone router, and a prime stride keeps replicas of nearby seeds apart.
_REPLICA_SEED_STRIDE: Final = 1_000_003


def _check_seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.0 <= value <= MAX_DELAY_S
    ):
        raise ValueError(f"{name} must be a finite number in [0, {MAX_DELAY_S:g}] s, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ViewSettings:
    """The deployment's routing views, in the service's own terms: ``replicas`` ingress replicas
    (the serve config's ``ingress_replicas``), each reporting its loads as ``routing`` says (the
    serve config's ``routing:`` section, :class:`~cluster.dataplane.settings.RoutingSettings`;
    None: every replica sees every request's load at once, i.e. exact load), over a bus that
    delivers ``delay_s`` late (the network's, not a setting of the service).

    So a simulated case is a deployment a user can run: :meth:`serve_config` is its part of the
    serve config. Of ``routing`` the simulator uses ``report_period_s``; replicas never die
    here, so ``report_ttl_s`` never expires a report, and the policy reaches every replica at
    once, so ``view_sync_s`` has nothing to catch up."""

    replicas: int = 1
    routing: RoutingSettings | None = None
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        r = self.replicas
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPLICAS:
            raise ValueError(f"replicas must be an int in [1, {MAX_REPLICAS}], got {r!r}")
        if self.routing is not None and not isinstance(self.routing, RoutingSettings):
            raise ValueError(f"routing must be RoutingSettings or None, got {self.routing!r}")
        object.__setattr__(self, "delay_s", _check_seconds("delay_s", self.delay_s))

    @classmethod
    def stale(cls, replicas: int, report_period_s: float, delay_s: float) -> ViewSettings:
        """``replicas`` replicas reporting every ``report_period_s``, the bus ``delay_s`` late
        (the report TTL: the service's default, or twice the period if that is longer)."""
        ttl = max(RoutingSettings().report_ttl_s, 2 * report_period_s)
        routing = RoutingSettings(report_period_s=report_period_s, report_ttl_s=ttl)
        return cls(replicas, routing, delay_s)

    @property
    def exact_load(self) -> bool:
        return self.routing is None

    @property
    def report_period_s(self) -> float:
        """0 with exact load."""
        return 0.0 if self.routing is None else self.routing.report_period_s

    def serve_config(self) -> dict[str, object]:
        """The serve config's part that deploys these views (``disaggctl serve``)."""
        out: dict[str, object] = {"ingress_replicas": self.replicas}
        if self.routing is not None:
            out["routing"] = self.routing.model_dump()
        return out

    def record(self) -> dict[str, object]:
        """What a report keeps (JSON): the deployment and the simulated bus's delay."""
        return {"serve_config": self.serve_config(), "bus_delay_s": self.delay_s}

    def __str__(self) -> str:
        load = (
            "exact load"
            if self.routing is None
            else f"load reports every {self.routing.report_period_s:g} s"
        )
        return f"{self.replicas} replica(s), {load}, KV events and reports {self.delay_s:g} s late"


@dataclass(frozen=True)
class RouterReplica:
    """One frontend's routers: ``decode`` picks the decode worker, ``prefill`` the prefill one."""

    index: int
    decode: Router
    prefill: Router

    def router(self, role: Role) -> Router:
        return self.decode if role == "decode" else self.prefill


@dataclass(frozen=True)
class _Snapshot:
    """The truth's load columns at one instant; ``routed`` requests had been routed by then."""

    role: Role
    routed: int
    loads: tuple[tuple[int, int, int, int], ...]  # (worker, prefill tokens, blocks, requests)


class RouterViews:
    """R replicas of (decode, prefill) routers behind a round-robin balancer (module doc)."""

    def __init__(
        self,
        settings: ViewSettings,
        loop: EventLoop,
        block_size: int,
        policy: Policy | None,
        seed: int,
        selection: Selection = "cost",
    ) -> None:
        self.settings = settings
        self.loop = loop
        policy = policy if policy is not None else Policy()
        self.replicas: tuple[RouterReplica, ...] = tuple(
            RouterReplica(
                k,
                Router(block_size, policy, seed + _REPLICA_SEED_STRIDE * k, selection),
                Router(block_size, policy, seed + _REPLICA_SEED_STRIDE * k + 1, selection),
            )
            for k in range(settings.replicas)
        )
        self._next = 0  # the balancer's round-robin pointer
        self._replica_of: dict[str, RouterReplica] = {}
        # Stale load only: the truth per role, the routing sequence number (orders routings
        # against snapshots exactly, ties in time included) and each replica's own routings.
        self._truth: dict[Role, LoadTracker] = {role: LoadTracker() for role in ROLES}
        self._routed = 0
        self._own: dict[tuple[int, Role], deque[tuple[int, str]]] = {
            (k, role): deque() for k in range(settings.replicas) for role in ROLES
        }
        self._ticking = False
        # A worker's incarnation: a KV event still on the bus when its worker changed role
        # belongs to the old engine and must not reach the new one's index.
        self._epoch: dict[int, int] = {}

    # -- workers and policy ------------------------------------------------------------------

    def add_worker(self, role: Role, worker: int) -> None:
        self._epoch[worker] = self._epoch.get(worker, -1) + 1
        for replica in self.replicas:
            replica.router(role).add_worker(worker)
        self._truth[role].add_worker(worker)

    def remove_worker(self, role: Role, worker: int) -> None:
        for replica in self.replicas:
            replica.router(role).remove_worker(worker)
        self._truth[role].remove_worker(worker)

    def truth(self, role: Role) -> LoadTracker:
        """The exact load of ``role``'s workers (kept only with load reports: with exact load
        every replica's own view is the truth)."""
        return self._truth[role]

    def workers(self, role: Role) -> tuple[int, ...]:
        """Workers the routers of ``role`` route to (every replica has the same set)."""
        return self.replicas[0].router(role).workers

    def set_policy(self, policy: Policy) -> None:
        """The policy on every router of every replica (DESIGN §4: every router with a choice)."""
        for replica in self.replicas:
            for role in ROLES:
                replica.router(role).set_policy(policy)

    # -- routing -----------------------------------------------------------------------------

    def route(
        self, role: Role, request_id: str, tokens: Tokens, local_hashes: Sequence[int]
    ) -> Decision:
        """Route ``request_id`` in ``role``: its decode routing picks the next replica in
        round-robin order; its prefill routing stays on that replica."""
        if role == "decode":
            replica = self.replicas[self._next]
            self._next = (self._next + 1) % len(self.replicas)
            self._replica_of[request_id] = replica
        else:
            replica = self._replica_of[request_id]
        router = replica.router(role)
        decision = router.decide(request_id, tokens, local_hashes=local_hashes)
        if len(self.replicas) == 1 and self.settings.exact_load:
            return decision  # the lone router's own reservation is the exact load
        held = router.loads.reservation(request_id)
        assert held is not None
        if self.settings.exact_load:
            for other in self.replicas:
                if other is not replica:
                    other.router(role).loads.reserve(request_id, *_fields(held))
        else:
            self._truth[role].reserve(request_id, *_fields(held))
            self._routed += 1
            self._own[replica.index, role].append((self._routed, request_id))
            if not self._ticking:
                self._ticking = True
                period = self.settings.report_period_s
                self.loop.at((math.floor(self.loop.now / period) + 1) * period, self._report)
        return decision

    def finish_prefill(self, role: Role, request_id: str) -> None:
        """The request's prefill is done: its prefill tokens leave every view that holds them."""
        for replica in self.replicas:
            replica.router(role).finish_prefill(request_id)
        self._truth[role].finish_prefill(request_id)

    def complete(self, role: Role, request_id: str) -> None:
        """The request is done in ``role``: its load leaves every view that holds it."""
        for replica in self.replicas:
            replica.router(role).complete(request_id)
        self._truth[role].release(request_id)
        if role == "decode":
            self._replica_of.pop(request_id, None)

    # -- the bus -----------------------------------------------------------------------------

    def publish(self, role: Role, event: KvEvent) -> None:
        """A worker of ``role`` published ``event``; each replica's index gets it late."""
        delay = self.settings.delay_s
        if delay == 0.0:
            self._apply(role, event)
        else:
            epoch = self._epoch.get(event.worker, 0)
            self.loop.after(delay, self._deliver_event, role, event, epoch)

    def _deliver_event(self, role: Role, event: KvEvent, epoch: int) -> None:
        if self._epoch.get(event.worker, 0) == epoch:
            self._apply(role, event)

    def _apply(self, role: Role, event: KvEvent) -> None:
        for replica in self.replicas:
            replica.router(role).index.apply(event)

    def _report(self) -> None:
        busy = False
        for role in ROLES:
            truth = self._truth[role]
            busy = busy or len(truth) > 0
            loads = tuple(
                (w, truth.prefill_tokens[i], truth.decode_blocks[i], truth.requests[i])
                for i, w in enumerate(truth.workers)
            )
            snapshot = _Snapshot(role, self._routed, loads)
            self.loop.after(self.settings.delay_s, self._deliver_report, snapshot)
        self._ticking = busy  # an empty truth was just reported: stop until the next routing
        if busy:
            self.loop.after(self.settings.report_period_s, self._report)

    def _deliver_report(self, snapshot: _Snapshot) -> None:
        for replica in self.replicas:
            router = replica.router(snapshot.role)
            own = self._own[replica.index, snapshot.role]
            while own and own[0][0] <= snapshot.routed:
                router.loads.release(own.popleft()[1])  # False if it finished already
            known = set(router.loads.workers)
            for worker, prefill_tokens, blocks, requests in snapshot.loads:
                if worker in known:  # not one that left the pool since the snapshot
                    router.loads.report(worker, prefill_tokens, blocks, requests)


def _fields(held: Reservation) -> tuple[int, int, int]:
    """(worker, prefill tokens, decode blocks): the arguments of ``LoadTracker.reserve``."""
    return held.worker, held.prefill_tokens, held.decode_blocks
