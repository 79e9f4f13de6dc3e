"""Our router in shadow inside each Dynamo ingress replica (docs/design.md §6 "Dynamo backend").

Dynamo's ``KvRouter`` picks the workers; every request still gets our per-candidate cost
breakdown (what the PoA estimator needs), decided in the replica that serves it, with no actor
call: a :class:`ShadowView` is the replica's :class:`~cluster.dataplane.replica.ReplicaRouter`
fed by Dynamo's own KV events (instance ids translated to slots) and following Dynamo's picks.

- **Instances.** Dynamo names a worker by its instance id (changed by every restart); events,
  pools and the estimator speak slots. The shadow router actor holds the binding (each worker
  actor tells it after every start) and hands it out in its ``RoutingView.instances``, which
  each replica syncs every ``view_sync_s``. A KV event from an instance no slot holds yet is
  dropped and counted (``unbound``); a slot rebound to a new instance loses its index entries
  (its cache died with the process).
- **Following.** :meth:`ShadowView.follow`: after Dynamo chose, our router decides on the
  replica's view (no reservation), then reserves the request's load on the worker *Dynamo*
  chose, so the view follows what really runs; the route event names Dynamo's worker with our
  breakdown; agreement is counted in ``disagg_dynamo_router_agreement_total{role, agree}``
  ("same", "tie" — another worker at our lowest cost —, or "different"), and how much worse
  Dynamo's pick is in our cost in ``disagg_dynamo_router_cost_gap{role}`` (a summary of
  g = cost(Dynamo's pick) − min_w cost(w) ≥ 0: near-equal loads flip picks without costing
  anything, so the gap says more than the agreement rate alone). Each replica exports both
  and the ingress's ``/metrics`` sums them. Every request is followed, not a sample: the
  decision costs tens of microseconds in-process.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cluster.actor_bus import ActorBus
from cluster.actor_ref import ActorRef
from cluster.dataplane.replica import ReplicaRouter
from cluster.dataplane.routing import ROLES, PoolRouting, Role, RoutingView
from cluster.events import RouteEvent
from router import Decision, Router

__all__ = ["ShadowRoute", "ShadowView", "follow_pick", "shadow_metrics_text"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShadowRoute:
    """Where Dynamo sent a request, in slots (None: an instance no slot holds yet), and what our
    router made of it."""

    decode_worker: int | None
    prefill_worker: int | None
    prompt_tokens: int
    uncached_tokens: int
    policy_version: int
    regime: str
    agree: dict[str, str]

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.uncached_tokens


class ShadowView(ReplicaRouter):
    """A Dynamo replica's routing view (module docstring)."""

    def __init__(
        self,
        routing: PoolRouting,
        bus: ActorBus,
        *,
        control: ActorRef | None = None,
        kv_subjects: Mapping[Role, str] | None = None,
    ) -> None:
        super().__init__(routing, bus, control=control, kv_subjects=kv_subjects)
        self.slot_of: dict[int, tuple[str, int]] = {}  # instance id → (role, slot)
        self.instance_of: dict[tuple[str, int], int] = {}
        self.agreement: dict[str, Counter[str]] = {r: Counter() for r in ROLES}
        self.cost_gap: dict[str, CostGap] = {r: CostGap() for r in ROLES}
        self.unbound: Counter[str] = Counter()

    # -- the view ----------------------------------------------------------------------------

    def apply_view(self, view: RoutingView) -> None:
        super().apply_view(view)
        for role, slot, instance in view.instances:
            self.bind(role, slot, instance)

    def bind(self, role: str, slot: int, instance: int) -> None:
        old = self.instance_of.get((role, slot))
        if old == instance:
            return
        if old is not None:
            self.slot_of.pop(old, None)
            router = self.routing.routers.get(role)  # type: ignore[call-overload]
            if router is not None and slot in router.workers:
                router.apply_event({"worker_id": slot, "event_id": 0, "data": "cleared"})
        self.slot_of[instance] = (role, slot)
        self.instance_of[(role, slot)] = instance

    def feed_kv(self, role: Role, payload: object) -> bool:
        """One Dynamo KV payload, its ``worker_id`` (an instance) translated to the slot."""
        if not isinstance(payload, dict):
            return super().feed_kv(role, payload)  # the index counts it as malformed
        bound = self.slot_of.get(payload.get("worker_id"))  # type: ignore[arg-type]
        if bound is None or bound[0] != role:
            self.unbound["kv"] += 1
            return False
        return super().feed_kv(role, {**payload, "worker_id": bound[1]})

    def slot(self, role: str, instance: int | None) -> int | None:
        bound = self.slot_of.get(instance) if instance is not None else None
        return bound[1] if bound is not None and bound[0] == role else None

    # -- following Dynamo --------------------------------------------------------------------

    def follow(
        self, request_id: str, tokens: Sequence[int], user: str, prefill_instance: int | None,
        decode_instance: int,
    ) -> ShadowRoute:  # fmt: skip
        """Our decision beside Dynamo's (module docstring); publishes the route event."""
        local = self.routing.checked_request(request_id, tokens, user)
        decode_slot = self.slot("decode", decode_instance)
        prefill_slot = self.slot("prefill", prefill_instance)
        agree: dict[str, str] = {}
        decision = self._follow("decode", request_id, tokens, local, decode_slot, agree)
        uncached = len(tokens)
        if prefill_slot is not None:
            pick = self._follow("prefill", request_id, tokens, local, prefill_slot, agree)
            if pick is not None:
                uncached = pick.chosen.uncached_tokens
        policy, regime = self.routing.policy, self.routing.regime
        if decision is None:
            self.unbound["route"] += 1
        else:
            self.routing.routed += 1  # counted as the replica's own routing counts its routes
            for role, slot in (("decode", decode_slot), ("prefill", prefill_slot)):
                if slot is not None and role in agree:
                    counts = self.routing.routed_to[role]  # type: ignore[index]
                    counts[slot] = counts.get(slot, 0) + 1
            self.last_cost = float(decision.chosen.cost)
            self.bus.publish(RouteEvent.from_decision(decision, time.time(), user, regime))
        return ShadowRoute(decode_slot, prefill_slot, len(tokens), uncached, policy.version,
                           regime, agree)  # fmt: skip

    def _follow(
        self, role: Role, request_id: str, tokens: Sequence[int], local: list[int],
        chosen: int | None, agree: dict[str, str],
    ) -> Decision | None:  # fmt: skip
        router: Router = self.routing.routers[role]
        if chosen is None or chosen not in router.workers:
            return None
        followed, verdict, lowest = follow_pick(router, request_id, tokens, local, chosen)
        agree[role] = verdict
        self.agreement[role][verdict] += 1
        self.cost_gap[role].add(float(followed.chosen.cost) - lowest)
        return followed


def follow_pick(
    router: Router, request_id: str, tokens: Sequence[int], local: list[int], chosen: int
) -> tuple[Decision, str, float]:
    """Our decision on ``router`` (no reservation), Dynamo's ``chosen`` worker named in it and
    reserved: (the followed decision, the verdict, our lowest cost). The verdict is "same",
    "tie" (another worker than ours at our lowest cost: Dynamo breaks ties at random, we by
    fewest cached blocks then id, the same decision in the cost both routers share) or
    "different"."""
    if request_id in router.loads:
        raise ValueError(f"request {request_id!r} is already in flight")
    ours = router.decide(request_id, list(tokens), local_hashes=local, reserve=False)
    followed = dataclasses.replace(ours, worker=chosen)
    lowest = float(min(ours.costs))
    if ours.worker == chosen:
        verdict = "same"
    elif followed.chosen.cost <= lowest:
        verdict = "tie"
    else:
        verdict = "different"
    blocks = -(-len(tokens) // router.block_size)
    router.loads.reserve(request_id, chosen, followed.chosen.uncached_tokens, blocks)
    return followed, verdict, lowest


@dataclass(slots=True)
class CostGap:
    """The running sum and count of one role's g = cost(Dynamo's pick) − our lowest cost."""

    total: float = 0.0
    count: int = 0

    def add(self, gap: float) -> None:
        self.total += gap
        self.count += 1


AGREEMENT = "disagg_dynamo_router_agreement_total"
COST_GAP = "disagg_dynamo_router_cost_gap"


def shadow_metrics_text(agreement: dict[str, Counter[str]], cost_gap: dict[str, CostGap]) -> str:
    """One replica's agreement counts and cost gaps as Prometheus text (the ingress sums the
    replicas'); names and help as registered in ``telemetry/metrics.py``."""
    lines = [
        f"# HELP {AGREEMENT} Our router in shadow against Dynamo's KvRouter, by role: same "
        "worker, a tie in our cost, or different",
        f"# TYPE {AGREEMENT} counter",
    ]
    lines += [
        f'{AGREEMENT}{{agree="{a}",role="{r}"}} {n}'
        for r, counts in sorted(agreement.items())
        for a, n in sorted(counts.items())
    ]
    lines += [
        f"# HELP {COST_GAP} Our cost of Dynamo's pick minus our lowest cost, by role",
        f"# TYPE {COST_GAP} summary",
    ]
    for role, gap in sorted(cost_gap.items()):
        lines += [f'{COST_GAP}_count{{role="{role}"}} {gap.count}',
                  f'{COST_GAP}_sum{{role="{role}"}} {gap.total!r}']  # fmt: skip
    return "\n".join(lines) + "\n"
