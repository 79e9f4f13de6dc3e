"""Game 1 — P/D resource allocation (docs/design.md §3).

Two players, the prefill pool P and the decode pool D, split G GPUs in steps of the tensor-parallel
degree TP: G_P, G_D ∈ {TP, 2·TP, …}, G_P + G_D ≤ G, with n_P = G_P/TP and n_D = G_D/TP workers.

Service model of one worker (a hardware profile's cost models; λ requests/s arrive, each with I
input and O output tokens; SLOs: TTFT ≤ τ_T with probability q, ITL ≤ τ_I):

- prefill: a full chunked-prefill iteration serves B_P = min(max_batch_requests, max_batch_tokens/I)
  requests in a + (b·I + c)·B_P seconds, so a worker serves μ_P = 1/s_P requests/s with
  s_P = a/B_P + b·I + c. A prompt whose first C tokens a cache holds computes I' = I − C of
  them, so I' stands for I here (and in B_P) when a window measured its reuse, and a profile
  that states attention adds e·I'·(C + I'/2) per request; the decode side keeps I, as the cache
  hit still occupies KV. As an M/M/1 queue at rate λ_w its sojourn (the
  TTFT) is exponential with rate μ_P − λ_w, so P(TTFT ≤ τ_T) ≥ q exactly while
  λ_w ≤ κ_P = μ_P − ln(1/(1 − q))/τ_T.
- decode: continuous batching. At rate λ_w a worker holds B = λ_w·O·ITL sequences (Little) of
  K̄ = I + O/2 KV tokens on average, and an iteration takes ITL = d0 + (d1 + d2·K̄)·B, hence
  ITL = d0/(1 − e_D·O·λ_w) with e_D = d1 + d2·K̄. ITL ≤ τ_I and B ≤ B_D = min(max_batch,
  kv_capacity_tokens // (I + O)) hold while λ_w ≤ κ_D = min((1 − d0/τ_I)/(e_D·O),
  B_D/(O·(d0 + e_D·B_D))).

Utilities: each pool's goodput (requests/s served within its own SLO; the admission stage holds
what a pool cannot take within its SLO, the DistServe notion of goodput):

    U_P(G_P)       = min(λ, n_P·κ_P)
    U_D(G_P, G_D)  = min(U_P(G_P), n_D·κ_D)

Prefill's throughput is decode's arrival rate: that is prefill's externality on decode. Welfare is
the end-to-end goodput W = U_D (the sum U_P + U_D would count prefill output that decode cannot
carry). Goodput is never negative, so PoA_1 = W(optimum)/W(worst VE) ≥ 1 needs no cost form;
it is 1 when both are 0 and ∞ when only the equilibrium's is.

Variational equilibrium (Rosen's normalised equilibrium with equal weights, i.e. equal marginal
utility per GPU): the split x = (G_P, G_D) and a price r ≥ 0 per GPU such that every player i
maximises U_i(g, x_−i) − r·g over its own range g ∈ {TP, …, G − TP} (each ignores its effect on
the other), and r = 0 unless fewer than TP GPUs are left over. On a finite grid such a split need
not exist, so each split gets the gap ε = max(0, lo − hi) between the largest price its players'
upward deviations require (lo) and the smallest their downward ones allow (hi); the equilibria are
the splits of least ε (ε = 0: exact). The social optimum maximises W over all splits, ties broken
by the least mean end-to-end latency E[TTFT] + O·ITL at the carried rates, then fewer GPUs.
Past every split's capacity this best split maximises min(n_P·κ_P, n_D·κ_D); below it, latency
decides among the splits that carry all of λ, so the advice need not move monotonically towards
the bottleneck pool as λ grows (prefill may get GPUs at moderate load that overload hands back).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "PdGame",
    "PdOutcome",
    "PoolCosts",
    "SloCapacity",
    "SloTargets",
    "Split",
    "VariationalEquilibrium",
    "best_splits",
    "pd_game",
    "poa_pd",
    "slo_capacity",
    "social_optimum",
    "tabulate_game",
    "variational_equilibrium",
]


@dataclass(frozen=True)
class PoolCosts:
    """One TP group's service model, named as in a hardware profile (``cluster/sim/profile.py``):
    prefill iteration a + b·tokens + c·requests seconds within ``max_batch_tokens`` /
    ``max_batch_requests``; decode iteration d0 + d1·batch + d2·KV tokens within ``max_batch``
    sequences and ``kv_capacity_tokens`` (the decode worker's); I input, O output tokens."""

    tp: int
    a_s: float
    b_s_per_token: float
    c_s_per_request: float
    max_batch_tokens: int
    max_batch_requests: int
    d0_s: float
    d1_s_per_seq: float
    d2_s_per_kv_token: float
    max_batch: int
    kv_capacity_tokens: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    e_s_per_token_pair: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kinds = (int,) if f.type == "int" else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds):
                kind = "an integer" if f.type == "int" else "a number"
                raise ValueError(f"{f.name} must be {kind}, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{f.name} must be finite and >= 0, got {value!r}")
        positive = (
            "tp",
            "max_batch_tokens",
            "max_batch_requests",
            "max_batch",
            "input_tokens",
            "output_tokens",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.cached_tokens >= self.input_tokens:
            raise ValueError(
                f"cached_tokens must be < input_tokens ({self.input_tokens}): a prefill "
                f"computes at least one token, got {self.cached_tokens}"
            )
        if self.s_prefill <= 0:
            raise ValueError("a prefill request must take time: a, b or c must be > 0")
        if self.d0_s <= 0:
            raise ValueError(f"d0_s must be > 0 (a decode iteration takes time), got {self.d0_s}")

    @property
    def new_tokens(self) -> int:
        """I − cached: the prompt tokens a prefill computes (a cache hit is prefill capacity)."""
        return self.input_tokens - self.cached_tokens

    @property
    def s_prefill(self) -> float:
        """s_P = a/B_P + b·I' + e·I'·(C + I'/2) + c with I' = I − C, C cached: seconds of
        prefill per request at a full iteration (e: attention over the context, 0 unless the
        profile states it; at the mean prompt, a lower bound for prompts of spread lengths)."""
        new = self.new_tokens
        b_p = min(self.max_batch_requests, self.max_batch_tokens / new)
        attention = self.e_s_per_token_pair * new * (self.cached_tokens + new / 2)
        return self.a_s / b_p + self.b_s_per_token * new + attention + self.c_s_per_request

    @property
    def e_decode(self) -> float:
        """e_D = d1 + d2·K̄, K̄ = I + O/2: decode seconds per iteration per running sequence."""
        mean_kv = self.input_tokens + self.output_tokens / 2
        return self.d1_s_per_seq + self.d2_s_per_kv_token * mean_kv


@dataclass(frozen=True)
class SloTargets:
    """TTFT ≤ ``ttft_s`` with probability ``attainment``; ITL ≤ ``itl_s``."""

    ttft_s: float
    itl_s: float
    attainment: float = 0.9

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttft_s) and self.ttft_s > 0):
            raise ValueError(f"ttft_s must be finite and > 0, got {self.ttft_s!r}")
        if not (math.isfinite(self.itl_s) and self.itl_s > 0):
            raise ValueError(f"itl_s must be finite and > 0, got {self.itl_s!r}")
        if not 0 < self.attainment < 1:
            raise ValueError(f"attainment must lie in (0, 1), got {self.attainment!r}")


@dataclass(frozen=True)
class SloCapacity:
    """Per-worker rates (requests/s) within the SLOs: κ_P, κ_D, and the prefill service rate μ_P."""

    prefill: float
    decode: float
    mu_prefill: float


def slo_capacity(costs: PoolCosts, slo: SloTargets) -> SloCapacity:
    """κ_P = μ_P − ln(1/(1−q))/τ_T and κ_D = min((1 − d0/τ_I)/(e_D·O), B_D/(O·(d0 + e_D·B_D))),
    each clipped at 0 (an SLO no load can meet)."""
    mu = 1.0 / costs.s_prefill
    kappa_p = max(0.0, mu - math.log(1.0 / (1.0 - slo.attainment)) / slo.ttft_s)
    out, e = costs.output_tokens, costs.e_decode
    b_d = min(costs.max_batch, costs.kv_capacity_tokens // (costs.input_tokens + out))
    headroom = 1.0 - costs.d0_s / slo.itl_s
    if headroom <= 0 or b_d < 1:
        kappa_d = 0.0
    else:
        by_itl = math.inf if e == 0 else headroom / (e * out)
        kappa_d = min(by_itl, b_d / (out * (costs.d0_s + e * b_d)))
    return SloCapacity(prefill=kappa_p, decode=kappa_d, mu_prefill=mu)


@dataclass(frozen=True, eq=False)
class PdGame:
    """Game 1 on the TP grid: entry [i, j] is G_P = (i+1)·TP, G_D = (j+1)·TP, i, j < N − 1 with
    N = G/TP (the whole box, as a player's deviations may overrun the budget before the price
    counts). ``latency`` breaks welfare ties in the optimum (lower is better)."""

    tp: int
    gpus: int
    utility_p: FloatArray
    utility_d: FloatArray
    welfare: FloatArray
    latency: FloatArray
    arrival_rate: float | None = None

    @property
    def steps(self) -> int:
        return self.gpus // self.tp


@dataclass(frozen=True)
class Split:
    gpus_p: int
    gpus_d: int
    welfare: float


@dataclass(frozen=True)
class VariationalEquilibrium:
    """The splits of least marginal-utility gap ε (0: exact VE); ``worst`` has the least welfare,
    ``price`` (per GPU) supports it: the least supporting price, or the midpoint when ε > 0."""

    splits: tuple[Split, ...]
    worst: Split
    price: float
    gap: float


@dataclass(frozen=True)
class PdOutcome:
    arrival_rate: float | None
    optimum: Split
    equilibrium: VariationalEquilibrium
    poa: float


def _check_grid(tp: int, gpus: int) -> int:
    for name, value in (("tp", tp), ("gpus", gpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if gpus % tp:
        raise ValueError(f"TP = {tp} does not divide G = {gpus}")
    if gpus < 2 * tp:
        raise ValueError(f"G = {gpus} cannot hold one prefill and one decode worker of TP = {tp}")
    return gpus // tp


def tabulate_game(
    tp: int,
    gpus: int,
    utility_p: Callable[[int, int], float],
    utility_d: Callable[[int, int], float],
    welfare: Callable[[int, int], float] | None = None,
    latency: Callable[[int, int], float] | None = None,
) -> PdGame:
    """A game from callables of (G_P, G_D) in GPUs; welfare defaults to U_P + U_D."""
    N = _check_grid(tp, gpus)
    g = [tp * k for k in range(1, N)]

    def table(f: Callable[[int, int], float]) -> FloatArray:
        return np.array([[float(f(gp, gd)) for gd in g] for gp in g], dtype=np.float64)

    up, ud = table(utility_p), table(utility_d)
    w = up + ud if welfare is None else table(welfare)
    lat = np.zeros_like(up) if latency is None else table(latency)
    if not all(np.all(np.isfinite(a)) for a in (up, ud, w, lat)):
        raise ValueError("utilities, welfare and latency must be finite")
    return PdGame(tp, gpus, up, ud, w, lat)


def pd_game(costs: PoolCosts, slo: SloTargets, gpus: int, arrival_rate: float) -> PdGame:
    """The profile's game at arrival rate λ (module docstring): goodput utilities, W = U_D."""
    N = _check_grid(costs.tp, gpus)
    if not (math.isfinite(arrival_rate) and arrival_rate >= 0):
        raise ValueError(f"arrival_rate must be finite and >= 0, got {arrival_rate!r}")
    cap = slo_capacity(costs, slo)
    n = np.arange(1, N, dtype=np.float64)
    up = np.minimum(arrival_rate, n * cap.prefill)[:, None] * np.ones(N - 1)
    ud = np.minimum(up, n[None, :] * cap.decode)
    # Latency at the carried per-worker rates; both stay below capacity, so it is finite.
    ttft = 1.0 / (cap.mu_prefill - up / n[:, None])
    itl = costs.d0_s / (1.0 - costs.e_decode * costs.output_tokens * ud / n[None, :])
    latency = ttft + costs.output_tokens * itl
    return PdGame(costs.tp, gpus, up, ud, ud.copy(), latency, arrival_rate)


def _price_bounds(u: FloatArray, tp: int) -> tuple[FloatArray, FloatArray]:
    """For the player moving along axis 0 of u: lo[i, j] = max_{i'>i} ΔU/ΔG (the price that
    stops it growing), hi[i, j] = min_{i'<i} ΔU/ΔG (the price under which it would not shrink)."""
    M = u.shape[0]
    idx = np.arange(M)
    dg = (idx[:, None] - idx[None, :]).astype(np.float64) * tp  # [i', i]
    du = u[:, None, :] - u[None, :, :]  # [i', i, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = du / dg[:, :, None]
    up = (dg > 0)[:, :, None]
    lo = np.where(up, slope, -np.inf).max(axis=0)
    hi = np.where((dg < 0)[:, :, None], slope, np.inf).min(axis=0)
    return lo, hi


def _feasible(game: PdGame) -> npt.NDArray[np.bool_]:
    M = game.steps - 1
    used = np.arange(1, M + 1)[:, None] + np.arange(1, M + 1)[None, :]
    feasible: npt.NDArray[np.bool_] = used <= game.steps
    return feasible


def _tol(game: PdGame) -> float:
    scale = max(float(np.abs(game.utility_p).max()), float(np.abs(game.utility_d).max()), 1.0)
    return 1e-9 * scale


def _split(game: PdGame, i: int, j: int) -> Split:
    return Split((i + 1) * game.tp, (j + 1) * game.tp, float(game.welfare[i, j]))


def variational_equilibrium(game: PdGame) -> VariationalEquilibrium:
    """The (ε-)variational equilibria of the game, by exact enumeration of the TP grid."""
    lo_p, hi_p = _price_bounds(game.utility_p, game.tp)
    lo_d_t, hi_d_t = _price_bounds(game.utility_d.T, game.tp)
    lo = np.maximum(np.maximum(lo_p, lo_d_t.T), 0.0)
    hi = np.minimum(hi_p, hi_d_t.T)
    feasible = _feasible(game)
    M = game.steps - 1
    slack = game.steps - (np.arange(1, M + 1)[:, None] + np.arange(1, M + 1)[None, :])
    hi = np.where(slack >= 1, np.minimum(hi, 0.0), hi)  # idle GPUs: the budget is free
    gap = np.where(feasible, np.maximum(lo - hi, 0.0), np.inf)
    tol = _tol(game) / game.tp
    gap = np.where(gap <= tol, 0.0, gap)  # marginals equal up to rounding are equal
    least = float(gap.min())
    chosen = np.argwhere(gap <= least + tol)
    splits = tuple(_split(game, int(i), int(j)) for i, j in chosen)
    # Worst: least welfare, then highest latency.
    i, j = min(chosen, key=lambda c: (game.welfare[c[0], c[1]], -game.latency[c[0], c[1]]))
    price = float((lo[i, j] + hi[i, j]) / 2) if least > 0 else float(lo[i, j])
    return VariationalEquilibrium(splits, _split(game, int(i), int(j)), price, least)


def social_optimum(game: PdGame) -> Split:
    """argmax W over the feasible splits; ties: least latency, then fewer GPUs, then less G_P."""
    feasible = _feasible(game)
    w = np.where(feasible, game.welfare, -np.inf)
    best = float(w.max())
    near = np.argwhere(w >= best - _tol(game))
    i, j = min(near, key=lambda c: (game.latency[c[0], c[1]], int(c[0]) + int(c[1]), int(c[0])))
    return _split(game, int(i), int(j))


def _ratio(opt: float, eq: float) -> float:
    if eq <= 0:
        return 1.0 if opt <= 0 else math.inf
    return opt / eq


def poa_pd(game: PdGame) -> PdOutcome:
    """PoA_1 = W(optimum)/W(worst VE), with the best split (the optimum) and the equilibria."""
    opt = social_optimum(game)
    ve = variational_equilibrium(game)
    return PdOutcome(game.arrival_rate, opt, ve, _ratio(opt.welfare, ve.worst.welfare))


def best_splits(
    costs: PoolCosts, slo: SloTargets, gpus: int, arrival_rates: Sequence[float]
) -> tuple[PdOutcome, ...]:
    """The planner's table: PoA_1, the best split and the equilibria at each arrival rate."""
    return tuple(poa_pd(pd_game(costs, slo, gpus, float(lam))) for lam in arrival_rates)
