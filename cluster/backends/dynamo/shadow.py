"""Our router in shadow beside Dynamo's: the control plane's side (docs/design.md §6 "Dynamo
backend").

On the Dynamo backend, Dynamo's ``KvRouter`` picks the workers, with the controller's
(tau, omega) as a per-request ``router_config_override``, and each ingress replica follows every
pick with our router in-process (``cluster/backends/dynamo/shadow_view.py: ShadowView``). This
actor is
what the replicas sync to, off the request path:

1. ``view()``: the policy, the pools and which Dynamo instance each slot runs as;
2. its own copy of our router's index on the same KV events (for ``stats`` and ``overlaps``).

It routes nothing: the replicas follow Dynamo's picks, reserve, publish the route events and
count the agreement (``ShadowView.follow``).

Worker ids. Dynamo names a worker by its instance id (a u64 that changes when the process
restarts); the service names it by its slot (0..P+D−1, stable across restarts and re-splits).
Events, pools and the estimator speak slots. Each Dynamo worker actor binds its current instance
id to its slot (``bind_instance``) after every (re)start; KV events are translated to slots on the
way in, and a KV event from an instance no slot holds is dropped and counted (``unbound``). A
restarted worker's index entries are cleared on rebinding: its cache died with the process.

Which subject: Dynamo's workers publish KV events on
``namespace.<ns>.component.<component>.endpoint.<endpoint>.kv-events``, one subject per pool
(components "prefill" and "backend" by default). In disaggregated mode only prefill workers
publish them (DESIGN §6): the decode pool's index stays empty, as it does in Dynamo's own router.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from cluster.dataplane.routing import RoutingView
from cluster.events import MAX_WORKER_ID
from cluster.kv_wire import kv_subject
from cluster.ray.actor_support import MAX_PROMPT_TOKENS, check_int
from cluster.ray.router_actor import ROLES, RouterActor
from cluster.ray.status import InstanceBinding, RouterStats

__all__ = ["DynamoPolicy", "ShadowRouterActor", "dynamo_override"]


def dynamo_override(tau: float, omega: float) -> dict[str, float]:
    """The controller's policy in Dynamo's ``router_config_override`` fields.

    ``overlap_score_weight`` is Dynamo 1.6's name for omega (a deprecated alias of
    ``prefill_load_scale`` that takes precedence over it), ``router_temperature`` for tau: the
    same two numbers in the same cost (docs/design.md §2)."""
    return {"router_temperature": float(tau), "overlap_score_weight": float(omega)}


@dataclass(frozen=True, slots=True)
class DynamoPolicy:
    """The controller's policy as Dynamo's router takes it (``router_config_override``)."""

    override: dict[str, float]
    policy_version: int
    regime: str


class ShadowRouterActor(RouterActor):
    """:class:`RouterActor` fed by Dynamo's KV events, choosing nothing itself."""

    def __init__(
        self, *, prefill_workers: list[int], decode_workers: list[int], block_size: int,
        components: Mapping[str, str], dynamo_namespace: str = "dynamo",
        dynamo_endpoint: str = "generate", instances: Mapping[str, Mapping[int, int]] | None = None,
        tau: float = 0.0, omega: float = 1.0, seed: int = 0, nats_url: str | None,
        namespace: str = "disagg",
    ) -> None:  # fmt: skip
        # Every request of a disaggregated Dynamo deployment is prefilled on a prefill worker.
        super().__init__(
            prefill_workers=prefill_workers, decode_workers=decode_workers,
            block_size=block_size, local_prefill_max_tokens=0, tau=tau, omega=omega, seed=seed,
            nats_url=nats_url, namespace=namespace,
        )  # fmt: skip
        if set(components) != set(ROLES):
            raise ValueError(f"components must map exactly {ROLES} to Dynamo component names")
        self.kv_subjects: dict[str, str] = {
            role: kv_subject(dynamo_namespace, components[role], dynamo_endpoint) for role in ROLES
        }
        self.slot_of: dict[int, tuple[str, int]] = {}  # instance id → (role, slot)
        self.instance_of: dict[tuple[str, int], int] = {}
        self.unbound = {"kv": 0}
        for role, bound in (instances or {}).items():
            for slot, instance in bound.items():
                self._bind(role, int(slot), instance)

    def kv_subject_of(self, role: str) -> str:
        return self.kv_subjects[role]  # Dynamo's, per component

    # -- instances ---------------------------------------------------------------------------

    async def bind_instance(self, role: str, slot: int, instance_id: int) -> None:
        """``slot`` now runs as Dynamo instance ``instance_id`` (a worker actor calls this after
        every start of its process). A new instance starts with an empty cache."""
        self._bind(role, slot, instance_id)

    def _bind(self, role: str, slot: int, instance_id: object) -> None:
        self._role(role)
        check_int("slot", slot, 0, MAX_WORKER_ID)
        instance = check_int("instance_id", instance_id, 0, MAX_WORKER_ID)
        # A slot may bind before it joins its pool: a re-split's new worker binds when it
        # starts and joins at ``warm`` (cluster/ray/pools.py); its KV events count from then.
        router = self.routers[role]
        old = self.instance_of.get((role, slot))
        if old == instance:
            return
        if old is not None:
            self.slot_of.pop(old, None)
            if slot in router.workers:
                router.apply_event({"worker_id": slot, "event_id": 0, "data": "cleared"})
        self.slot_of[instance] = (role, slot)
        self.instance_of[(role, slot)] = instance

    async def remove_worker(self, role: str, worker_id: int) -> None:
        await super().remove_worker(role, worker_id)
        instance = self.instance_of.pop((role, worker_id), None)
        if instance is not None:
            self.slot_of.pop(instance, None)

    def feed_kv(self, role: str, payload: object) -> bool:
        """One Dynamo KV payload, its ``worker_id`` (an instance) translated to the slot."""
        if not isinstance(payload, dict):
            return super().feed_kv(role, payload)  # the index counts it as malformed
        bound = self.slot_of.get(payload.get("worker_id"))  # type: ignore[arg-type]
        if bound is None or bound[0] != role:
            self.unbound["kv"] += 1
            return False
        return super().feed_kv(role, {**payload, "worker_id": bound[1]})

    # -- the view ----------------------------------------------------------------------------

    async def policy(self) -> DynamoPolicy:
        """The override for Dynamo's router, with the version and regime it belongs to."""
        await self._start()
        policy = self.routers["decode"].policy
        return DynamoPolicy(dynamo_override(policy.tau, policy.omega), policy.version, self.regime)

    async def view(self) -> RoutingView:
        """The replicas' view, with the instance each slot runs as (``ShadowView`` follows
        Dynamo's picks by instance id and names them by slot)."""
        view = await super().view()
        bound = tuple((r, s, i) for (r, s), i in sorted(self.instance_of.items()))
        return dataclasses.replace(view, instances=bound)

    async def overlaps(self, role: str, tokens: list[int]) -> dict[int, int]:
        """Blocks of ``tokens`` our ``role`` index holds per worker that holds any, keyed by
        Dynamo instance id (what ``KvRouter.get_overlap_scores`` reports as ``device_blocks``)."""
        self._role(role)
        if not isinstance(tokens, list | tuple) or not 0 < len(tokens) <= MAX_PROMPT_TOKENS:
            raise ValueError(f"tokens must be a list of 1 to {MAX_PROMPT_TOKENS} token ids")
        by_slot = self.routers[role].index.overlap(list(tokens))
        return {
            self.instance_of[(role, slot)]: int(blocks)
            for slot, blocks in by_slot.items()
            if blocks and (role, slot) in self.instance_of
        }

    async def stats(self) -> RouterStats:
        binding = InstanceBinding(
            instances={f"{r}/{s}": i for (r, s), i in self.instance_of.items()},
            unbound=dict(self.unbound),
            kv_subjects=dict(self.kv_subjects),
        )
        return dataclasses.replace(await super().stats(), binding=binding)
