"""The router actor: the KV-aware routers of the decode and prefill pools behind Ray
(docs/design.md "Serve runtime", §2 routing; interface: the serve spec's "Actor APIs").

Two ``router.Router`` objects, as ``SimCluster`` composes them: the decode pool's router (policy
tau, omega from the controller) picks the decode worker of every request; when that worker lacks
more than ``local_prefill_max_tokens`` of the prompt and a prefill pool exists, the prefill pool's
router picks the prefill worker too. Both indexes are fed by the workers' Dynamo KV events on NATS
(``kv_subject(ns, "decode"|"prefill")``). Prompt hashes are computed once and returned, so the
workers never hash again.

Reservations follow ``SimCluster``: a decision reserves the request's load on its decode worker
(and prefill worker); ``finish_prefill`` returns the prefill tokens and ``complete`` everything.
Both are idempotent, so the ingress may call them on every path (success, retry, disconnect).

``exclude`` (a retry after a worker failed) is applied to the router's own decision breakdown: the
excluded workers' columns are removed and the choice is made among the rest with the router's
rule (lowest cost, ties to fewer cached blocks then lower id; or the tau-softmax). The route
event then lists only the workers that could be chosen.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cluster.events import MAX_LABEL_CHARS, MAX_WORKER_ID, RouteEvent
from cluster.kv_wire import kv_subject
from cluster.ray.actor_support import (
    MAX_PROMPT_TOKENS,
    ActorBus,
    actor_info,
    check_int,
    check_request_id,
    wake_after_restart,
)
from cluster.ray.metrics_export import OWNERS, owned_metrics_text
from controller.metrics import ROUTING_COST
from router import (
    Decision,
    Policy,
    Router,
    block_hashes,
    lowest_cost_index,
    sample_index,
    sequence_hashes,
    softmax_probabilities,
)

__all__ = ["ROLES", "RouterActor"]

ROLES = ("prefill", "decode")
READY_TIMEOUT_S = 10.0
MAX_USER_CHARS = 256  # RouteEvent.user


class RouterActor:
    def __init__(
        self, *, prefill_workers: list[int], decode_workers: list[int], block_size: int,
        local_prefill_max_tokens: int, tau: float = 0.0, omega: float = 1.0, seed: int = 0,
        nats_url: str | None, namespace: str = "disagg",
    ) -> None:  # fmt: skip
        check_int("block_size", block_size, 1, 1 << 16)
        self.local_prefill_max_tokens = check_int(
            "local_prefill_max_tokens", local_prefill_max_tokens, 0, MAX_PROMPT_TOKENS
        )
        check_int("seed", seed, 0, 2**63 - 1)
        policy = Policy(tau, omega, 0)  # ValueError naming tau / omega
        self.routers = {
            "decode": Router(block_size, policy, seed=seed),
            "prefill": Router(block_size, policy, seed=seed + 1),
        }
        self.block_size = block_size
        self.regime = "below"
        for role, ids in (("prefill", prefill_workers), ("decode", decode_workers)):
            if not isinstance(ids, list | tuple):
                raise ValueError(f"{role}_workers must be a list of worker ids")
            for worker in ids:
                self._add(role, worker)
        if not self.routers["decode"].workers:
            raise ValueError("decode_workers must name at least one worker")
        self._rng = np.random.default_rng((seed, 2))  # draws for retries that exclude workers
        self.bus = ActorBus(nats_url, namespace, name="router")
        self._namespace = namespace
        self._subscribed = False
        self.routed = 0
        self.retries = 0  # routes with a non-empty exclude
        # Requests routed to each worker, by role: shows a worker a re-split added taking work.
        self.routed_to: dict[str, dict[int, int]] = {r: {} for r in ROLES}
        wake_after_restart()  # a restarted router subscribes to KV events at once

    # -- lifecycle ---------------------------------------------------------------------------

    async def _start(self) -> None:
        if not self._subscribed:
            self._subscribed = True
            for role in ROLES:
                await self.bus.subscribe_kv(
                    kv_subject(self._namespace, role), self._kv_handler(role)
                )
            self.bus.start()

    async def ready(self) -> dict[str, Any]:
        await self._start()
        connected = await self.bus.wait_connected(READY_TIMEOUT_S)
        nats = connected if self.bus.bus is not None else None  # None: running without NATS
        return {"role": "router", **actor_info(), "nats_connected": nats}

    async def metrics_text(self) -> str:
        return owned_metrics_text(OWNERS["router"])

    async def shutdown(self) -> None:
        await self.bus.close()

    # -- KV events ---------------------------------------------------------------------------

    def _kv_handler(self, role: str) -> Callable[[Any], None]:
        def handle(payload: Any) -> None:
            self.feed_kv(role, payload)

        return handle

    def feed_kv(self, role: str, payload: object) -> bool:
        """Apply one KV payload (Dynamo shape) to ``role``'s index; never raises (the index
        counts what it skips). The NATS handler; also for in-process use without NATS."""
        router = self.routers.get(role)
        return False if router is None else router.apply_event(payload)

    async def apply_kv_events(self, role: str, payloads: list[dict[str, Any]]) -> int:
        """Apply KV payloads without NATS (in-process compositions); how many were applied."""
        self._role(role)
        return sum(self.feed_kv(role, p) for p in payloads)

    # -- routing -----------------------------------------------------------------------------

    async def route(
        self, request_id: str, tokens: list[int], user: str = "anonymous",
        exclude: list[int] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Pick the decode worker (and a prefill worker when the decode worker lacks more than
        ``local_prefill_max_tokens``), reserve their load, publish the route event."""
        await self._start()
        local = self._checked_request(request_id, tokens, user)
        banned = self._exclude(exclude)
        seq = sequence_hashes(local)
        decode = self.routers["decode"]
        decision = self._decide(decode, request_id, tokens, local, banned)
        try:
            uncached = decision.chosen.uncached_tokens
            prefill_worker = None
            prefill = self.routers["prefill"]
            allowed = [w for w in prefill.workers if w not in banned]
            if uncached > self.local_prefill_max_tokens and allowed:
                pick = self._decide(prefill, request_id, tokens, local, banned)
                prefill_worker = pick.worker
            event = RouteEvent.from_decision(decision, time.time(), user, self.regime)
        except BaseException:
            decode.complete(request_id)  # no half-made reservation survives a failure
            self.routers["prefill"].complete(request_id)
            raise
        ROUTING_COST.set(decision.chosen.cost)
        self.bus.publish(event)
        self.routed += 1
        self.retries += bool(banned)
        for role, worker in (("decode", decision.worker), ("prefill", prefill_worker)):
            if worker is not None:
                self.routed_to[role][worker] = self.routed_to[role].get(worker, 0) + 1
        return {
            "request_id": request_id,
            "decode_worker": decision.worker,
            "prefill_worker": prefill_worker,
            "uncached_tokens": uncached,
            "prompt_tokens": len(tokens),
            "local_hashes": local,
            "seq_hashes": seq,
            "policy_version": decision.policy_version,
            "tau": decision.tau,
            "omega": decision.omega,
            "regime": self.regime,
        }

    def _checked_request(self, request_id: str, tokens: object, user: object) -> list[int]:
        """``ValueError`` naming the field for a bad request; the prompt's block hashes."""
        check_request_id(request_id)
        if not isinstance(tokens, list | tuple) or not 0 < len(tokens) <= MAX_PROMPT_TOKENS:
            raise ValueError(f"tokens must be a list of 1 to {MAX_PROMPT_TOKENS} token ids")
        if type(user) is not str or len(user) > MAX_USER_CHARS:
            raise ValueError(f"user must be a str of at most {MAX_USER_CHARS} characters")
        try:
            return block_hashes(tokens, self.block_size)
        except ValueError as exc:
            raise ValueError(f"tokens: {exc}") from None

    def _exclude(self, exclude: object) -> frozenset[int]:
        if exclude is None:
            return frozenset()
        if not isinstance(exclude, list | tuple) or len(exclude) > 4096:
            raise ValueError("exclude must be a list of at most 4096 worker ids")
        return frozenset(check_int("exclude", w, 0, MAX_WORKER_ID) for w in exclude)

    def _decide(
        self, router: Router, request_id: str, tokens: list[int], local: list[int],
        banned: frozenset[int],
    ) -> Decision:  # fmt: skip
        if not banned.intersection(router.workers):
            return router.decide(request_id, tokens, local_hashes=local)
        keep = [i for i, w in enumerate(router.workers) if w not in banned]
        if not keep:
            raise ValueError("no workers to route to: every worker is excluded")
        if request_id in router.loads:
            raise ValueError(f"request {request_id!r} is already in flight")
        full = router.decide(request_id, tokens, local_hashes=local, reserve=False)

        def column(values: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(values[i] for i in keep)

        workers, costs = column(full.workers), column(full.costs)
        softmax = None
        if full.tau == 0:
            cached = router.index.cached_blocks
            best = lowest_cost_index(list(costs), lambda i: (cached(workers[i]), workers[i]))
        else:
            softmax = tuple(softmax_probabilities(costs, full.tau))
            best = sample_index(softmax, float(self._rng.random()))
        decision = dataclasses.replace(
            full, worker=workers[best], workers=workers,
            overlap_blocks=column(full.overlap_blocks),
            active_prefill_tokens=column(full.active_prefill_tokens),
            decode_blocks=column(full.decode_blocks), costs=costs, softmax=softmax,
        )  # fmt: skip
        # The same reservation Router.decide makes: uncached prefill tokens, ceil(|r|/B) blocks.
        blocks = -(-len(tokens) // self.block_size)
        router.loads.reserve(request_id, decision.worker, decision.chosen.uncached_tokens, blocks)
        return decision

    async def finish_prefill(self, request_id: str) -> None:
        """The prefill is done: the decode worker's prefill tokens and the prefill worker's
        reservation are returned (idempotent)."""
        check_request_id(request_id)
        self.routers["decode"].finish_prefill(request_id)
        self.routers["prefill"].complete(request_id)

    async def complete(self, request_id: str) -> None:
        """The request ended (any way): release everything it holds (idempotent)."""
        check_request_id(request_id)
        for router in self.routers.values():
            router.complete(request_id)

    # -- control -----------------------------------------------------------------------------

    async def set_policy(self, tau: float, omega: float, version: int, regime: str) -> None:
        """New (tau, omega) from the controller, for both pools. With one prefill worker the
        prefill pool's policy changes nothing; setting it anyway keeps it right when the pool
        grows."""
        if type(regime) is not str or len(regime) > MAX_LABEL_CHARS:
            raise ValueError(f"regime must be a str of at most {MAX_LABEL_CHARS} characters")
        policy = Policy(tau, omega, version)  # validates before either router changes
        for router in self.routers.values():
            router.set_policy(policy.tau, policy.omega, policy.version)
        self.regime = regime

    async def add_worker(self, role: str, worker_id: int) -> None:
        self._add(role, worker_id)

    async def remove_worker(self, role: str, worker_id: int) -> None:
        """Stop routing to ``worker_id``; its index entries and reservations go with it."""
        router = self.routers[self._role(role)]
        if worker_id not in router.workers:
            raise ValueError(f"worker_id {worker_id!r} is not in the {role} pool")
        if role == "decode" and len(router.workers) == 1:
            raise ValueError("worker_id: the decode pool cannot lose its last worker")
        router.remove_worker(worker_id)

    def _role(self, role: object) -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return str(role)

    def _add(self, role: str, worker_id: object) -> None:
        check_int("worker_id", worker_id, 0, MAX_WORKER_ID)
        other = self.routers["decode" if self._role(role) == "prefill" else "prefill"]
        if worker_id in other.workers:
            raise ValueError(f"worker_id {worker_id} is already in the other pool")
        self.routers[role].add_worker(worker_id)  # type: ignore[arg-type]

    async def stats(self) -> dict[str, Any]:
        """Policy, workers, KV events applied/dropped per pool, requests in flight."""
        policy = self.routers["decode"].policy
        out: dict[str, Any] = {
            "policy": {
                "tau": policy.tau,
                "omega": policy.omega,
                "version": policy.version,
                "regime": self.regime,
            },
            "workers": {r: list(self.routers[r].workers) for r in ROLES},
            "kv_events": {
                r: {
                    "applied": dict(self.routers[r].index.applied),
                    "dropped": dict(self.routers[r].index.dropped),
                }
                for r in ROLES
            },
            "in_flight": {r: len(self.routers[r].loads) for r in ROLES},
            "routed": self.routed,
            "routed_to": {r: dict(self.routed_to[r]) for r in ROLES},
            "retries": self.retries,
            "nats_connected": self.bus.connected if self.bus.bus is not None else None,
            "events_dropped": self.bus.dropped,
        }
        return out
