"""The P/D routing rule over two pools, in one place (docs/design.md "Data flow (serve mode)").

``PoolRouting`` holds one ``router.Router`` per pool. The decode pool's router picks the decode
worker of every request; when that worker lacks more than ``local_prefill_max_tokens`` of the
prompt and a prefill pool exists, the prefill pool's router picks the prefill worker too. A
decision reserves the request's load on its workers (``router.LoadTracker``: uncached prompt
tokens as prefill load, ⌈|r|/B⌉ blocks as decode load); ``finish_prefill`` returns the prefill
part and ``complete`` the rest, both idempotent.

It is a plain object: each ingress replica routes with its own (``cluster.dataplane.replica``),
and the router actor of the control plane keeps one for its view of the pools and policy.

``exclude`` (a retry after a worker failed) removes the excluded workers' columns from the
router's breakdown and chooses among the rest by the router's rule: lowest cost, ties to fewer
cached blocks then lower id; or the τ-softmax. The route event then lists only the workers that
could be chosen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import numpy as np

from router import (
    Decision,
    LoadView,
    Policy,
    Router,
    block_hashes,
    lowest_cost_index,
    sample_index,
    sequence_hashes,
    softmax_probabilities,
)

__all__ = ["MAX_PROMPT_TOKENS", "ROLES", "PoolRouting", "Role", "Route", "RoutingView"]

Role = Literal["prefill", "decode"]
ROLES: Final[tuple[Role, ...]] = ("prefill", "decode")
MAX_PROMPT_TOKENS: Final = 1 << 20
MAX_USER_CHARS: Final = 256  # RouteEvent.user
MAX_REQUEST_ID_CHARS: Final = 256
MAX_WORKER_ID: Final = 2**64 - 1
MAX_EXCLUDED: Final = 4096


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request runs, and what its workers need to run it.

    ``prefill_worker`` is None when the decode worker prefills locally; ``local_hashes`` and
    ``seq_hashes`` are the prompt's block and sequence hashes (computed once, here, so the
    workers never hash again); ``decision`` is the decode router's breakdown and
    ``prefill_decision`` the prefill router's (both in the route event)."""

    request_id: str
    decode_worker: int
    prefill_worker: int | None
    prompt_tokens: int
    uncached_tokens: int
    local_hashes: tuple[int, ...]
    seq_hashes: tuple[int, ...]
    regime: str
    decision: Decision
    prefill_decision: Decision | None = None  # the prefill router's, when it chose a worker

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.uncached_tokens

    @property
    def policy_version(self) -> int:
        return self.decision.policy_version


@dataclass(frozen=True, slots=True)
class RoutingView:
    """The control plane's routing state: the controller's policy and the pools' members (the
    router actor's ``view``; an ingress replica syncs to it)."""

    policy: Policy
    prefill_workers: tuple[int, ...]
    decode_workers: tuple[int, ...]
    # (role, slot, instance id) where the engines name a worker otherwise than by its slot
    # (Dynamo's instances; cluster/backends/dynamo/shadow_view.py); empty for the simulated engines.
    instances: tuple[tuple[str, int, int], ...] = ()


T = TypeVar("T")


def _column(values: tuple[T, ...], keep: list[int]) -> tuple[T, ...]:
    return tuple(values[i] for i in keep)


def _int(name: str, value: object, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return value


class PoolRouting:
    """The decode and prefill routers of one routing view (module docstring)."""

    def __init__(
        self,
        *,
        block_size: int,
        local_prefill_max_tokens: int,
        policy: Policy | None = None,
        seed: int = 0,
        prefill_workers: Iterable[int] = (),
        decode_workers: Iterable[int] = (),
        max_blocks_per_worker: int | None = None,
    ) -> None:
        _int("block_size", block_size, 1, 1 << 16)
        _int("local_prefill_max_tokens", local_prefill_max_tokens, 0, MAX_PROMPT_TOKENS)
        _int("seed", seed, 0, 2**63 - 1)
        policy = policy if policy is not None else Policy()
        self.block_size = block_size
        self.local_prefill_max_tokens = local_prefill_max_tokens
        self.routers: dict[Role, Router] = {
            "decode": Router(
                block_size, policy, seed=seed, max_blocks_per_worker=max_blocks_per_worker
            ),
            "prefill": Router(
                block_size, policy, seed=seed + 1, max_blocks_per_worker=max_blocks_per_worker
            ),
        }
        self._rng = np.random.default_rng((seed, 2))  # draws for retries that exclude workers
        for role, ids in (("prefill", prefill_workers), ("decode", decode_workers)):
            for worker in ids:
                self.add_worker(role, worker)  # type: ignore[arg-type]
        self.routed = 0
        self.retries = 0  # routes with a non-empty exclude
        # Requests routed to each worker, by role: shows a worker a re-split added taking work.
        self.routed_to: dict[Role, dict[int, int]] = {r: {} for r in ROLES}

    # -- pools and policy --------------------------------------------------------------------

    def workers(self, role: Role) -> tuple[int, ...]:
        return self.routers[role].workers

    def add_worker(self, role: Role, worker: object) -> None:
        """Route to ``worker`` in ``role`` (idempotent); a worker serves one role at a time."""
        _int("worker_id", worker, 0, MAX_WORKER_ID)
        other = self.routers["decode" if self._role(role) == "prefill" else "prefill"]
        if worker in other.workers:
            raise ValueError(f"worker_id {worker} is already in the other pool")
        if worker not in self.routers[role].workers:
            self.routers[role].add_worker(worker)  # type: ignore[arg-type]

    def remove_worker(self, role: Role, worker: int) -> None:
        """Stop routing to ``worker``; its index entries and reservations go with it."""
        router = self.routers[self._role(role)]
        if worker not in router.workers:
            raise ValueError(f"worker_id {worker!r} is not in the {role} pool")
        router.remove_worker(worker)

    def set_workers(self, prefill: Sequence[int], decode: Sequence[int]) -> bool:
        """Make the pools exactly these (a view synced from the control plane); True if they
        changed. Removals first, so that a worker moving between roles is never in both."""
        changed = False
        wanted: dict[Role, set[int]] = {"prefill": set(prefill), "decode": set(decode)}
        if wanted["prefill"] & wanted["decode"]:
            raise ValueError("a worker is listed in both pools")
        for role in ROLES:
            for worker in set(self.routers[role].workers) - wanted[role]:
                self.routers[role].remove_worker(worker)
                changed = True
        for role in ROLES:
            for worker in sorted(wanted[role] - set(self.routers[role].workers)):
                self.add_worker(role, worker)
                changed = True
        return changed

    @property
    def policy(self) -> Policy:
        return self.routers["decode"].policy

    @property
    def regime(self) -> str:
        return self.policy.regime

    def set_policy(self, policy: Policy) -> None:
        """The policy on both pools. With one prefill worker the prefill pool's policy changes
        nothing; setting it anyway keeps it right when the pool grows."""
        for router in self.routers.values():
            router.set_policy(policy)

    def view(self) -> RoutingView:
        return RoutingView(self.policy, self.workers("prefill"), self.workers("decode"))

    def apply_view(self, view: RoutingView) -> None:
        """Sync to the control plane's view, policy and pools: it is the truth. A regime event
        may have brought a newer policy a moment before the router actor got it; the view then
        takes the replica back for at most one sync period. A restarted controller may number
        its policies from lower again: only the view can follow it there. Version 0 is a router
        actor that has not heard from the controller yet (it just restarted): its policy is
        not taken over one the replica has."""
        self.set_workers(view.prefill_workers, view.decode_workers)
        if view.policy.version == 0 and self.policy.version > 0:
            return  # a router actor just restarted, before the controller's re-push: not news
        if view.policy != self.policy:
            self.set_policy(view.policy)

    def feed_kv(self, role: str, payload: object) -> bool:
        """Apply one KV payload (Dynamo shape) to ``role``'s index; never raises (the index
        counts what it skips)."""
        router = self.routers.get(role)  # type: ignore[call-overload]
        return False if router is None else bool(router.apply_event(payload))

    def _role(self, role: object) -> Role:
        if role == "prefill" or role == "decode":
            return role
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")

    # -- routing -----------------------------------------------------------------------------

    def route(
        self, request_id: str, tokens: Sequence[int], user: str = "anonymous",
        exclude: Iterable[int] = (),
    ) -> Route:  # fmt: skip
        """Pick the decode worker (and a prefill worker when the decode worker lacks more than
        ``local_prefill_max_tokens``) and reserve their load. ``ValueError`` naming the field
        for a bad request."""
        local = self.checked_request(request_id, tokens, user)
        banned = self._exclude(exclude)
        decode = self.routers["decode"]
        decision = self._decide(decode, request_id, tokens, local, banned)
        try:
            uncached = decision.chosen.uncached_tokens
            picked: Decision | None = None
            prefill = self.routers["prefill"]
            allowed = [w for w in prefill.workers if w not in banned]
            if uncached > self.local_prefill_max_tokens and allowed:
                picked = self._decide(prefill, request_id, tokens, local, banned)
            prefill_worker = None if picked is None else picked.worker
            seq = tuple(sequence_hashes(local))
        except BaseException:
            self.complete(request_id)  # no half-made reservation survives a failure
            raise
        self.routed += 1
        self.retries += bool(banned)
        for role, worker in (("decode", decision.worker), ("prefill", prefill_worker)):
            if worker is not None:
                counts = self.routed_to[role]  # type: ignore[index]
                counts[worker] = counts.get(worker, 0) + 1
        return Route(
            request_id=request_id, decode_worker=int(decision.worker),
            prefill_worker=prefill_worker, prompt_tokens=len(tokens), uncached_tokens=uncached,
            local_hashes=tuple(local), seq_hashes=seq, regime=self.regime, decision=decision,
            prefill_decision=picked,
        )  # fmt: skip

    def checked_request(self, request_id: object, tokens: object, user: object) -> list[int]:
        """``ValueError`` naming the field for a bad request; the prompt's block hashes."""
        if type(request_id) is not str or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
            raise ValueError(f"request_id must be a str of 1 to {MAX_REQUEST_ID_CHARS} characters")
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
        if not isinstance(exclude, list | tuple | frozenset | set):
            raise ValueError(f"exclude must be a list of at most {MAX_EXCLUDED} worker ids")
        if len(exclude) > MAX_EXCLUDED:
            raise ValueError(f"exclude must be a list of at most {MAX_EXCLUDED} worker ids")
        return frozenset(_int("exclude", w, 0, MAX_WORKER_ID) for w in exclude)

    def _decide(
        self, router: Router, request_id: str, tokens: Sequence[int], local: list[int],
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
        workers = _column(full.workers, keep)
        costs = _column(full.costs, keep)
        softmax = None
        if full.tau == 0:
            cached = router.index.cached_blocks
            best = lowest_cost_index(list(costs), lambda i: (cached(workers[i]), workers[i]))
        else:
            softmax = tuple(softmax_probabilities(costs, full.tau))
            best = sample_index(softmax, float(self._rng.random()))
        decision = dataclasses.replace(
            full, worker=workers[best], workers=workers,
            overlap_blocks=_column(full.overlap_blocks, keep),
            active_prefill_tokens=_column(full.active_prefill_tokens, keep),
            decode_blocks=_column(full.decode_blocks, keep), costs=costs, softmax=softmax,
        )  # fmt: skip
        # The same reservation Router.decide makes: uncached prefill tokens, ceil(|r|/B) blocks.
        blocks = -(-len(tokens) // self.block_size)
        router.loads.reserve(request_id, decision.worker, decision.chosen.uncached_tokens, blocks)
        return decision

    def finish_prefill(self, request_id: str) -> None:
        """The prefill is done: the decode worker's prefill tokens and the prefill worker's
        reservation are returned (idempotent)."""
        self.routers["decode"].finish_prefill(request_id)
        self.routers["prefill"].complete(request_id)

    def complete(self, request_id: str) -> None:
        """The request ended (any way): release everything it holds (idempotent)."""
        for router in self.routers.values():
            router.complete(request_id)

    # -- loads -------------------------------------------------------------------------------

    def in_flight(self, role: Role) -> int:
        return len(self.routers[role].loads)

    def own_loads(self, role: Role) -> dict[int, LoadView]:
        """What this view's own reservations hold on each worker of ``role``."""
        loads = self.routers[role].loads
        return {w: loads.reserved(w) for w in loads.workers}

    def report_loads(self, role: Role, loads: dict[int, LoadView]) -> None:
        """Replace the load measured elsewhere (other replicas, engines) on ``role``'s workers;
        a worker absent from ``loads`` is reported idle, one not in the pool is ignored."""
        tracker = self.routers[role].loads
        for worker in tracker.workers:
            view = loads.get(worker)
            if view is None:
                tracker.report(worker, 0, 0, 0)
            else:
                tracker.report(
                    worker, view.active_prefill_tokens, view.active_decode_blocks,
                    view.active_requests,
                )  # fmt: skip
