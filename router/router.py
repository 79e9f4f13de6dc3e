"""The KV-aware router: index + loads + cost → one decision per request (docs/design.md §2, §4).

``Router.decide`` hashes the prompt, walks the KV index once to get every worker's overlap,
prices each worker with ``router.cost`` and picks one (tau = 0: lowest cost; tau > 0: seeded
softmax). The returned ``Decision`` carries the whole per-candidate breakdown, the tau and
omega used and the policy version, because the PoA estimator and the ``disagg.<ns>.route``
event need them. The controller changes the policy with ``set_policy`` at any time; a
per-request override wins over it for that request only.

Every public entry point refuses bad input with a ``ValueError`` that names the field: a
per-request override is a mapping whose keys are ``tau``, ``omega`` or Dynamo's aliases
(``router_temperature``; ``overlap_score_weight`` and ``prefill_load_scale``), each field set at
most once, and whose values are real numbers in the ranges of ``router.cost`` (tau finite ≥ 0;
omega finite in [0, ``MAX_OMEGA``]; a bool is not a number). An unhashable value such as
``{"tau": [1]}`` used to escape as ``TypeError`` from the policy cache.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

import numpy as np

from router.cost import (
    CandidateCost,
    lowest_cost_index,
    policy_value,
    prefill_blocks,
    routing_costs,
    sample_index,
    softmax_probabilities,
    uncached_tokens,
)
from router.hashing import DEFAULT_BLOCK_SIZE, Tokens, block_hashes
from router.kv_index import KvIndex
from router.load import LoadTracker

_DRAW_BATCH: Final = 1024
MAX_REGIME_CHARS: Final = 32

# How a decision picks its worker: by the cost (the policy's τ, ω), or in turn regardless of it
# (Dynamo's ``round_robin`` router mode, the baseline a KV-aware router is compared against;
# the breakdown is still computed, so the PoA estimator sees what each worker would have cost).
Selection = Literal["cost", "round_robin"]
SELECTIONS: Final[tuple[str, ...]] = get_args(Selection)

# Dynamo's names for the override fields, accepted next to ours.
_OVERRIDE_KEYS: Final = {
    "tau": "tau",
    "router_temperature": "tau",
    "omega": "omega",
    "overlap_score_weight": "omega",
    "prefill_load_scale": "omega",  # Dynamo 1.6's alias of overlap_score_weight
}


@dataclass(frozen=True, slots=True)
class Policy:
    """The routing policy the controller sets, one record from the controller to every router
    (across actors and, as the ``regime`` event, on the wire): temperature tau, overlap weight
    omega, the controller's version of it, and the regime it was chosen for (a label the
    routers carry, not one they read). A new weight is a new field here, with its default."""

    tau: float = 0.0
    omega: float = 1.0
    version: int = 0
    regime: str = "below"

    def __post_init__(self) -> None:
        # Stored as floats: equal policies compare and hash equal whatever number type built them.
        object.__setattr__(self, "tau", policy_value("tau", self.tau))
        object.__setattr__(self, "omega", policy_value("omega", self.omega))
        if type(self.version) is not int or self.version < 0:
            raise ValueError(f"policy version must be an int >= 0, got {self.version!r}")
        if not isinstance(self.regime, str) or not 0 < len(self.regime) <= MAX_REGIME_CHARS:
            raise ValueError(f"policy regime must be a short label, got {self.regime!r}")


@dataclass(frozen=True, slots=True)
class Override:
    """Per-request tau and/or omega; None keeps the policy's value."""

    tau: float | None = None
    omega: float | None = None

    def __bool__(self) -> bool:
        return self.tau is not None or self.omega is not None

    def __post_init__(self) -> None:
        for field in ("tau", "omega"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, policy_value(field, value))

    @classmethod
    def from_mapping(cls, fields: Mapping[str, float]) -> Override:
        """From ``{"tau"|"router_temperature": x, "omega"|"overlap_score_weight": y}``."""
        return cls(**override_fields(fields))


def override_fields(fields: object) -> dict[str, float]:
    """A per-request override mapping, validated: ``{"tau": x, "omega": y}`` (either optional).

    ``ValueError`` naming the key for a non-mapping, an unknown or non-string key, a field set
    twice (``tau`` and ``router_temperature`` together) or a value out of range."""
    if not isinstance(fields, Mapping):
        raise ValueError(f"an override must be a mapping or an Override, got {fields!r}")
    values: dict[str, float] = {}
    named: dict[str, str] = {}
    for key, value in fields.items():
        field = _OVERRIDE_KEYS.get(key) if isinstance(key, str) else None
        if field is None:
            known = ", ".join(sorted(_OVERRIDE_KEYS))
            raise ValueError(f"unknown override field {key!r}; known: {known}")
        if field in named:
            raise ValueError(f"override sets {field} twice: {named[field]!r} and {key!r}")
        named[field] = key
        values[field] = policy_value(field, value, key)
    return values


@dataclass(frozen=True, slots=True)
class Decision:
    """A routing decision and its full breakdown, one column entry per candidate worker.

    Columns are aligned with ``workers`` (ascending id) and hold the inputs of the cost as they
    were at decision time; ``uncached_tokens`` and ``prefill_blocks`` are derived from them
    with ``router.cost``'s formulas. ``policy`` is what routed this request (the router's
    policy, or a copy carrying the per-request override, then ``overridden`` is set).
    ``softmax`` is the selection distribution for tau > 0 and None for tau = 0.
    """

    request_id: str
    worker: int
    policy: Policy
    overridden: bool
    prompt_tokens: int
    block_size: int
    workers: tuple[int, ...]
    overlap_blocks: tuple[int, ...]
    active_prefill_tokens: tuple[int, ...]
    decode_blocks: tuple[int, ...]
    costs: tuple[float, ...]
    softmax: tuple[float, ...] | None

    @property
    def tau(self) -> float:
        return self.policy.tau

    @property
    def omega(self) -> float:
        return self.policy.omega

    @property
    def policy_version(self) -> int:
        return self.policy.version

    @property
    def uncached_tokens(self) -> tuple[int, ...]:
        """u(r, w) per candidate."""
        n, b = self.prompt_tokens, self.block_size
        return tuple(uncached_tokens(n, o, b) for o in self.overlap_blocks)

    @property
    def prefill_blocks(self) -> tuple[float, ...]:
        """prefill_blocks(r, w) per candidate."""
        b = self.block_size
        return tuple(
            prefill_blocks(a, u, b)
            for a, u in zip(self.active_prefill_tokens, self.uncached_tokens, strict=True)
        )

    @property
    def probabilities(self) -> tuple[float, ...]:
        """Selection probability per candidate (all mass on ``worker`` when tau = 0)."""
        if self.softmax is not None:
            return self.softmax
        return tuple(float(w == self.worker) for w in self.workers)

    @property
    def candidates(self) -> tuple[CandidateCost, ...]:
        """The breakdown as one record per candidate."""
        return tuple(
            CandidateCost(*row)
            for row in zip(
                self.workers,
                self.overlap_blocks,
                self.uncached_tokens,
                self.prefill_blocks,
                self.decode_blocks,
                self.costs,
                self.probabilities,
                strict=True,
            )
        )

    def candidate(self, worker: int) -> CandidateCost:
        """The breakdown line of ``worker``."""
        return self.candidates[self.workers.index(worker)]

    @property
    def chosen(self) -> CandidateCost:
        return self.candidate(self.worker)


@functools.lru_cache(maxsize=1024, typed=True)
def _policy(tau: float, omega: float, version: int) -> Policy:
    """Policies for per-request overrides: a few distinct values, each built once. Callers pass
    validated floats only (``override_fields``), so the cache never sees an unhashable or a bool;
    ``typed`` stays as a second guard against ``True`` hitting the entry of ``1.0``."""
    return Policy(tau, omega, version)


def _overridden(policy: Policy, override: Override | Mapping[str, float]) -> Policy:
    """``policy`` with the override's tau and omega in place of its own."""
    if isinstance(override, Override):  # validated when it was made
        tau = policy.tau if override.tau is None else override.tau
        omega = policy.omega if override.omega is None else override.omega
    else:
        # Validated before the cache: an unhashable or out-of-range value must be a ValueError.
        fields = override_fields(override)
        tau, omega = fields.get("tau", policy.tau), fields.get("omega", policy.omega)
    return _policy(tau, omega, policy.version)


class Router:
    """KV-aware router over a set of workers; plain object, fed by the caller."""

    def __init__(
        self,
        block_size: int = DEFAULT_BLOCK_SIZE,
        policy: Policy | None = None,
        seed: int | None = 0,
        selection: Selection = "cost",
        max_blocks_per_worker: int | None = None,
    ) -> None:
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
        if type(block_size) is not int or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        if policy is not None and not isinstance(policy, Policy):
            raise ValueError(f"policy must be a router.Policy or None, got {policy!r}")
        given: object = seed  # typed int | None, but callers are not type-checked
        if given is not None and (
            isinstance(given, bool) or not isinstance(given, numbers.Integral) or given < 0
        ):
            raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
        self.index = KvIndex(block_size, max_blocks_per_worker)
        self.loads = LoadTracker()
        self.block_size = block_size
        self._policy = policy if policy is not None else Policy()
        self._rng = np.random.default_rng(seed)
        self._draws: list[float] = []
        self._workers: tuple[int, ...] = ()
        self.selection: Selection = selection
        self._turn = 0  # round robin: the next turn

    # -- workers and events ------------------------------------------------------------------

    @property
    def workers(self) -> tuple[int, ...]:
        return self._workers

    def add_worker(self, worker: int) -> None:
        """Route to ``worker`` from now on; its KV events are accepted from now on."""
        self.index.add_worker(worker)
        self.loads.add_worker(worker)
        self._workers = self.index.workers

    def remove_worker(self, worker: int) -> None:
        """Drop ``worker``: its cached blocks, its load and its requests' reservations."""
        self.index.remove_worker(worker)
        self.loads.remove_worker(worker)
        self._workers = self.index.workers

    def apply_event(self, payload: object) -> bool:
        """Feed one KV event (plain dict, Dynamo shape); never raises, see ``KvIndex``."""
        return self.index.apply_event(payload)

    # -- policy ------------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    def set_policy(self, policy: Policy) -> None:
        """Replace the default policy; decisions from now on use it."""
        if not isinstance(policy, Policy):
            raise ValueError(f"a policy is a router.Policy, got {policy!r}")
        self._policy = policy

    # -- decisions ---------------------------------------------------------------------------

    def decide(
        self,
        request_id: str,
        tokens: Tokens,
        override: Override | Mapping[str, float] | None = None,
        *,
        reserve: bool = True,
        local_hashes: Sequence[int] | None = None,
    ) -> Decision:
        """Route one request; with ``reserve``, its load stays on the chosen worker until
        ``finish_prefill`` (prefill tokens) and ``complete`` (everything) release it.

        ``local_hashes`` are the prompt's block hashes when the caller already has them (a
        simulated engine hashes every prompt anyway); they must be ``block_hashes(tokens)``."""
        if type(request_id) is not str or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        policy, overridden = self._policy, False
        if override is not None and not isinstance(override, Override | Mapping):
            raise ValueError(f"override must be a mapping or an Override, got {override!r}")
        if override:  # None, {} and Override() leave the policy as it is
            policy, overridden = _overridden(policy, override), True
        workers = self._workers
        if not workers:
            raise ValueError("no workers to route to")
        try:
            prompt_tokens = len(tokens)
        except TypeError:
            raise ValueError(f"tokens must be a sequence of token ids, got {tokens!r}") from None
        if prompt_tokens == 0:
            raise ValueError("cannot route an empty prompt")
        loads = self.loads
        if reserve and request_id in loads:
            raise ValueError(f"request {request_id!r} is already in flight")
        block_size = self.block_size
        if local_hashes is None:
            local_hashes = block_hashes(tokens, block_size)
        elif len(local_hashes) != prompt_tokens // block_size:
            raise ValueError(
                f"local_hashes must be block_hashes(tokens): {prompt_tokens} tokens make "
                f"{prompt_tokens // block_size} blocks of {block_size}, got {len(local_hashes)}"
            )
        overlaps = self.index.overlap_column(local_hashes)
        prefill_now = tuple(loads.prefill_tokens)
        decode_now = tuple(loads.decode_blocks)
        costs = routing_costs(
            prompt_tokens, overlaps, prefill_now, decode_now, policy.omega, block_size
        )
        softmax = None
        if self.selection == "round_robin":
            best = self._turn % len(workers)
            self._turn += 1
        elif policy.tau == 0:
            cached = self.index.cached_blocks
            best = lowest_cost_index(costs, lambda i: (cached(workers[i]), workers[i]))
        else:
            softmax = tuple(softmax_probabilities(costs, policy.tau))
            best = sample_index(softmax, self._uniform())

        worker = workers[best]
        if reserve:
            # The request's KV occupies ceil(|r| / B) blocks on its worker until it completes.
            uncached = uncached_tokens(prompt_tokens, overlaps[best], block_size)
            loads.reserve(request_id, worker, uncached, -(-prompt_tokens // block_size))
        return Decision(
            request_id,
            worker,
            policy,
            overridden,
            prompt_tokens,
            block_size,
            workers,
            tuple(overlaps),
            prefill_now,
            decode_now,
            tuple(costs),
            softmax,
        )

    def _uniform(self) -> float:
        """Next draw of the seeded stream; drawn in batches, one numpy call being ~1 µs."""
        if not self._draws:
            self._draws = self._rng.random(_DRAW_BATCH).tolist()
            self._draws.reverse()
        return self._draws.pop()

    def finish_prefill(self, request_id: str) -> bool:
        """The request's prefill is done: release its prefill tokens."""
        return self.loads.finish_prefill(request_id)

    def complete(self, request_id: str) -> bool:
        """The request finished: release all its load (False if unknown, e.g. a duplicate)."""
        return self.loads.release(request_id)
