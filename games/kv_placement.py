"""Game 2 — KV placement as selfish caching (docs/design.md §3).

Workers w = 0..n−1 with capacities cap_w (blocks) each choose a set S_w of prefix blocks,
|S_w| ≤ cap_w. Worker w needs block k d_wk times per unit time; an access costs 0 when k ∈ S_w and
otherwise

    a_wk(S_−w) = min(f_k, min_{v ≠ w, k ∈ S_v} t_wv),

t_wv the cost of fetching a block from v by tier (NVLink within a node, InfiniBand across nodes)
and f_k the fallback when no holder is nearer: recompute, or a host-memory tier that holds every
block, f_k = min(recompute_k, host). Worker cost c_w(S) = Σ_{k ∉ S_w} d_wk·a_wk(S_−w); social cost
C(S) = Σ_w c_w(S).

Best response: with S_−w fixed, c_w = Σ_k d_wk·a_wk − Σ_{k ∈ S_w} d_wk·a_wk and no a_wk depends
on S_w, so w maximises an additive function of S_w under |S_w| ≤ cap_w: the cap_w blocks of
largest saving d_wk·a_wk (positive savings only) are an exact best response.

Blocks are independent items, as in selfish caching (Chun et al. 2004) and capacitated selfish
replication; a prefix run whose blocks are only useful together can be one item.

PoA_KV = C(worst pure Nash equilibrium)/C(optimum), both found by enumerating every feasible
placement (Π_w Σ_{s ≤ cap_w} binom(m, s) of them); it is 1 when both costs are 0, ∞ when only the
optimum's is, and NaN when no pure equilibrium exists (possible with asymmetric costs).

Complete graphs (t_wv = t for all w ≠ v, f ≥ t): a second copy of k helps nobody else, while the
first copy spares the others Σ_{v ≠ w} d_vk·(f_k − t), which its holder ignores. PoA_KV = 1 when
that externality vanishes (f ≤ t, e.g. a host tier as near as a peer) or when each worker's demand
is uniform over blocks (d_wk = d_w > 0: every equilibrium covers as many distinct blocks as the
caches hold, and all such full placements cost the same). With demand skewed over blocks it can
exceed 1: two workers with one slot each, both demanding A 20 times and B 3 times, t = 1, f = 5:
the only equilibrium has both holding A (C = 2·3·5 = 30), while {A}, {B} costs 3 + 20 = 23.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Placement = tuple[frozenset[int], ...]

MAX_PLACEMENTS = 200_000
_CHUNK = 4096

__all__ = [
    "MAX_PLACEMENTS",
    "BrDynamics",
    "KvInstance",
    "KvPoa",
    "Placement",
    "access_costs",
    "best_response",
    "best_response_dynamics",
    "equilibria",
    "is_equilibrium",
    "kv_instance",
    "optimal_placement",
    "poa_kv",
    "social_cost",
    "tiered_transfer",
    "worker_costs",
]


@dataclass(frozen=True, eq=False)
class KvInstance:
    """capacity (n,), demand (n, m), transfer (n, n) with t_wv = cost for w to read from v (the
    diagonal is unused: local is free), fallback (m,). Build it with ``kv_instance``."""

    capacity: IntArray
    demand: FloatArray
    transfer: FloatArray
    fallback: FloatArray

    @property
    def workers(self) -> int:
        return int(self.demand.shape[0])

    @property
    def blocks(self) -> int:
        return int(self.demand.shape[1])


def kv_instance(
    capacity: Sequence[int] | npt.ArrayLike,
    demand: npt.ArrayLike,
    transfer: npt.ArrayLike,
    recompute: float | npt.ArrayLike,
    host: float | None = None,
) -> KvInstance:
    """Validate and freeze an instance; f_k = min(recompute_k, host)."""
    cap = np.asarray(capacity)
    d = np.asarray(demand, dtype=np.float64)
    t = np.asarray(transfer, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"demand must be a workers × blocks matrix, got shape {d.shape}")
    n, m = d.shape
    if n == 0:
        raise ValueError("an instance needs at least one worker")
    if cap.shape != (n,) or not np.issubdtype(cap.dtype, np.integer):
        raise ValueError(f"capacity must be {n} integers (one per worker), got {capacity!r}")
    if np.any(cap < 0):
        raise ValueError(f"capacity must be >= 0 blocks, got {cap.tolist()}")
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise ValueError("demand must be finite and >= 0")
    if t.shape != (n, n):
        raise ValueError(f"transfer must be {n} × {n}, got shape {t.shape}")
    if np.any(np.isnan(t)) or np.any(t < 0):
        raise ValueError("transfer costs must be >= 0 (inf: no link)")
    f = np.broadcast_to(np.asarray(recompute, dtype=np.float64), (m,)).copy()
    if host is not None:
        if not (math.isfinite(host) and host >= 0):
            raise ValueError(f"host cost must be finite and >= 0, got {host!r}")
        f = np.minimum(f, host)
    if not np.all(np.isfinite(f)) or np.any(f < 0):
        raise ValueError("recompute costs must be finite and >= 0")
    return KvInstance(cap.astype(np.int64), d, t, f)


def tiered_transfer(node_of: Sequence[int], nvlink: float, infiniband: float) -> FloatArray:
    """t_wv = 0 for w = v, ``nvlink`` within a node, ``infiniband`` across nodes."""
    if not (nvlink >= 0 and infiniband >= 0 and math.isfinite(nvlink + infiniband)):
        raise ValueError("tier costs must be finite and >= 0")
    node = np.asarray(node_of)
    same = node[:, None] == node[None, :]
    t: FloatArray = np.where(same, nvlink, infiniband).astype(np.float64)
    np.fill_diagonal(t, 0.0)
    return t


def _held(inst: KvInstance, placement: Placement) -> BoolArray:
    if len(placement) != inst.workers:
        raise ValueError(f"a placement needs one set per worker ({inst.workers})")
    H = np.zeros((inst.workers, inst.blocks), dtype=np.bool_)
    for w, S in enumerate(placement):
        if len(S) > inst.capacity[w]:
            raise ValueError(f"worker {w} holds {len(S)} blocks, capacity {inst.capacity[w]}")
        if any(not 0 <= k < inst.blocks for k in S):
            raise ValueError(f"worker {w} holds an unknown block: {sorted(S)}")
        H[w, sorted(S)] = True
    return H


def _remote(inst: KvInstance, H: npt.NDArray[np.bool_]) -> FloatArray:
    """a[..., w, k] for held-matrices H[..., v, k]: cheapest non-local source or the fallback."""
    t = inst.transfer.copy()
    np.fill_diagonal(t, np.inf)
    via = np.where(H[..., None, :, :], t[:, :, None], np.inf).min(axis=-2)
    a: FloatArray = np.minimum(via, inst.fallback)
    return a


def access_costs(inst: KvInstance, placement: Placement) -> FloatArray:
    """Cost per access of block k by worker w under the placement (0 where held)."""
    H = _held(inst, placement)
    a: FloatArray = np.where(H, 0.0, _remote(inst, H))
    return a


def worker_costs(inst: KvInstance, placement: Placement) -> FloatArray:
    """c_w(S) for every worker."""
    c: FloatArray = (inst.demand * access_costs(inst, placement)).sum(axis=1)
    return c


def social_cost(inst: KvInstance, placement: Placement) -> float:
    """C(S) = Σ_w c_w(S)."""
    return float(worker_costs(inst, placement).sum())


def _tol(inst: KvInstance) -> float:
    finite = inst.transfer[np.isfinite(inst.transfer)]
    scale = float(inst.demand.sum()) * max(float(inst.fallback.max(initial=0.0)),
                                           float(finite.max(initial=0.0)), 1.0)
    return 1e-9 * max(scale, 1.0)


def best_response(inst: KvInstance, placement: Placement, w: int) -> frozenset[int]:
    """An exact best response of w to the others' sets: its cap_w largest positive savings
    d_wk·a_wk (ties by block index)."""
    H = _held(inst, placement)
    saving = inst.demand[w] * _remote(inst, H)[w]
    order = sorted(range(inst.blocks), key=lambda k: (-saving[k], k))
    return frozenset(k for k in order[: int(inst.capacity[w])] if saving[k] > 0)


def _regret(inst: KvInstance, H: npt.NDArray[np.bool_]) -> tuple[FloatArray, FloatArray]:
    """(worker costs, best-response costs) for held-matrices H[..., w, k]."""
    saving = inst.demand * _remote(inst, H)
    cost = np.where(H, 0.0, saving).sum(axis=-1)
    ranked = -np.sort(-saving, axis=-1)
    cum = np.concatenate([np.zeros((*ranked.shape[:-1], 1)), np.cumsum(ranked, axis=-1)], -1)
    take = np.minimum(inst.capacity, inst.blocks)
    best_kept = np.take_along_axis(cum, np.broadcast_to(take[:, None], (*cum.shape[:-1], 1)), -1)
    br: FloatArray = saving.sum(axis=-1) - best_kept[..., 0]
    return cost, br


def is_equilibrium(inst: KvInstance, placement: Placement) -> bool:
    """No worker can lower its own cost by more than a rounding tolerance."""
    cost, br = _regret(inst, _held(inst, placement))
    return bool(np.all(cost <= br + _tol(inst)))


@dataclass(frozen=True)
class BrDynamics:
    """Where round-robin best responses stopped: ``converged`` (a round without a change: an
    equilibrium), ``cycled`` (a round began from a placement seen before), else the round cap."""

    placement: Placement
    cost: float
    rounds: int
    converged: bool
    cycled: bool


def best_response_dynamics(
    inst: KvInstance, start: Placement | None = None, max_rounds: int = 1000
) -> BrDynamics:
    """Workers 0..n−1 in turn switch to their exact best response when it lowers their cost."""
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    S = list(start) if start is not None else [frozenset[int]() for _ in range(inst.workers)]
    _held(inst, tuple(S))
    tol = _tol(inst)
    seen: set[Placement] = set()
    for rounds in range(1, max_rounds + 1):
        if tuple(S) in seen:
            return BrDynamics(tuple(S), social_cost(inst, tuple(S)), rounds - 1, False, True)
        seen.add(tuple(S))
        changed = False
        for w in range(inst.workers):
            br = best_response(inst, tuple(S), w)
            trial = (*S[:w], br, *S[w + 1 :])
            if worker_costs(inst, trial)[w] < worker_costs(inst, tuple(S))[w] - tol:
                S[w], changed = br, True
        if not changed:
            return BrDynamics(tuple(S), social_cost(inst, tuple(S)), rounds, True, False)
    return BrDynamics(tuple(S), social_cost(inst, tuple(S)), max_rounds, False, False)


def _strategies(inst: KvInstance) -> list[BoolArray]:
    out = []
    for cap in inst.capacity:
        rows = [
            np.isin(np.arange(inst.blocks), subset)
            for size in range(min(int(cap), inst.blocks) + 1)
            for subset in itertools.combinations(range(inst.blocks), size)
        ]
        out.append(np.array(rows, dtype=np.bool_).reshape(len(rows), inst.blocks))
    return out


def _enumerate(inst: KvInstance, limit: int) -> tuple[list[BoolArray], FloatArray, BoolArray]:
    """Every feasible placement (as indices into each worker's strategy list): social cost and
    whether it is an equilibrium."""
    strategies = _strategies(inst)
    shape = tuple(len(s) for s in strategies)
    total = math.prod(shape)
    if total > limit:
        raise ValueError(f"{total} placements exceed the enumeration limit {limit}")
    cost = np.empty(total, dtype=np.float64)
    stable = np.empty(total, dtype=np.bool_)
    tol = _tol(inst)
    for lo in range(0, total, _CHUNK):
        idx = np.unravel_index(np.arange(lo, min(total, lo + _CHUNK)), shape)
        H = np.stack([strategies[w][idx[w]] for w in range(inst.workers)], axis=1)
        c, br = _regret(inst, H)
        cost[lo : lo + len(c)] = c.sum(axis=-1)
        stable[lo : lo + len(c)] = np.all(c <= br + tol, axis=-1)
    return strategies, cost, stable


def _placement(strategies: list[BoolArray], flat: int) -> Placement:
    idx = np.unravel_index(flat, tuple(len(s) for s in strategies))
    rows = (s[i] for s, i in zip(strategies, idx, strict=True))
    return tuple(frozenset(int(k) for k in np.flatnonzero(row)) for row in rows)


def optimal_placement(inst: KvInstance, limit: int = MAX_PLACEMENTS) -> tuple[Placement, float]:
    """A placement of least social cost, by enumeration (first found in lexicographic order)."""
    strategies, cost, _ = _enumerate(inst, limit)
    best = int(np.argmin(cost))
    return _placement(strategies, best), float(cost[best])


def equilibria(inst: KvInstance, limit: int = MAX_PLACEMENTS) -> list[tuple[Placement, float]]:
    """Every pure Nash equilibrium with its social cost, by enumeration."""
    strategies, cost, stable = _enumerate(inst, limit)
    return [(_placement(strategies, int(i)), float(cost[i])) for i in np.flatnonzero(stable)]


@dataclass(frozen=True)
class KvPoa:
    optimum: Placement
    optimum_cost: float
    worst_equilibrium: Placement | None
    worst_cost: float  # NaN when there is no pure equilibrium
    best_equilibrium_cost: float
    equilibria: int
    poa: float  # C(worst equilibrium)/C(optimum)
    pos: float  # price of stability: C(best equilibrium)/C(optimum)
    dynamics: BrDynamics  # best-response dynamics from empty caches


def _ratio(eq: float, opt: float) -> float:
    if math.isnan(eq):
        return math.nan
    if opt <= 0:
        return 1.0 if eq <= 0 else math.inf
    return eq / opt


def poa_kv(inst: KvInstance, limit: int = MAX_PLACEMENTS) -> KvPoa:
    """PoA_KV and price of stability by enumeration, plus where best-response dynamics lands."""
    strategies, cost, stable = _enumerate(inst, limit)
    best = int(np.argmin(cost))
    opt_cost = float(cost[best])
    dynamics = best_response_dynamics(inst)
    if not stable.any():
        return KvPoa(_placement(strategies, best), opt_cost, None, math.nan, math.nan, 0,
                     math.nan, math.nan, dynamics)
    eq_idx = np.flatnonzero(stable)
    worst = int(eq_idx[np.argmax(cost[eq_idx])])
    worst_cost = float(cost[worst])
    best_eq = float(cost[eq_idx].min())
    return KvPoa(
        _placement(strategies, best),
        opt_cost,
        _placement(strategies, worst),
        worst_cost,
        best_eq,
        int(eq_idx.size),
        _ratio(worst_cost, opt_cost),
        _ratio(best_eq, opt_cost),
        dynamics,
    )
