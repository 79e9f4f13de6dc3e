"""The repeated auction: T batches from a stationary workload, pacing and truthful users.

Each batch t is a radix tree with true values v_r (the caller draws them: the auction room does not
know the workload generators). Truthful users bid b_r = v_r; every pacing user i bids
b_r = α'_{i,t}·v_r (``PacingBidder``, α' the budget-capped multiplier). The batch is ordered by
``dfs-bid`` and priced by VCG; then each pacing user pays and updates its μ. Recorded per batch and
user: bids, payments p_{i,t}, the true value won V_{i,t} = Σ_{r∈R_i} v_r·x_r and the utility
V_{i,t} − p_{i,t}; per batch: the welfare W(σ_t; v) under the true values.

A stationary source that keeps T = 6400 cheap: a few prebuilt trees (``stationary_source``), one
drawn per batch, with fresh values; the tree is built once and re-priced with new bids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from auction.pacing import DEFAULT_ETA_SCALE, DEFAULT_MU_MAX, FloatArray, PacingBidder
from auction.radix import IntArray, RadixTree
from auction.schedulers import dfs_bid_order
from auction.vcg import vcg_payments
from auction.welfare import priorities, welfare


@dataclass(frozen=True, eq=False)
class Batch:
    """One batch of the repeated auction: its tree and the true value v_r of each request
    (batch order)."""

    tree: RadixTree
    values: FloatArray

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.float64)
        if v.shape != (self.tree.n,):
            raise ValueError(f"expected {self.tree.n} values, got shape {v.shape}")
        if not np.all(np.isfinite(v)) or (v.size and float(v.min()) < 0):
            raise ValueError("values must be finite and >= 0")
        v = v.copy()
        v.flags.writeable = False
        object.__setattr__(self, "values", v)


BatchSource = Callable[[int, np.random.Generator], Batch]
"""draw_batch(t, rng) -> the batch of round t (draw only from ``rng`` to stay reproducible)."""


def stationary_source(
    trees: Sequence[RadixTree], draw_values: Callable[[np.random.Generator, int], FloatArray]
) -> BatchSource:
    """A stationary workload: each batch is one of ``trees`` at random with fresh i.i.d. values
    ``draw_values(rng, n)`` (e.g. 1 + Pareto(1.5))."""
    shapes = tuple(trees)
    if not shapes:
        raise ValueError("stationary_source needs at least one tree")

    def draw_batch(t: int, rng: np.random.Generator) -> Batch:
        tree = shapes[int(rng.integers(len(shapes)))] if len(shapes) > 1 else shapes[0]
        return Batch(tree, np.asarray(draw_values(rng, tree.n), dtype=np.float64))

    return draw_batch


@dataclass(frozen=True, eq=False)
class RepeatedResult:
    """The record of a repeated auction over T batches.

    ``users`` indexes the (T, U) arrays; ``pacing`` lists the pacing users, indexing the (T, P)
    arrays. ``alpha`` is α before the cap, ``alpha_capped`` what was bid (b = α'·v), ``mu`` the
    dual variable μ the batch was bid with. ``bids[t]`` are the bids of batch t (batch order).
    """

    T: int
    users: tuple[str, ...]
    pacing: tuple[str, ...]
    gamma: FloatArray  # (P,) per-batch budget γ of each pacing user
    batches: tuple[Batch, ...]
    bids: tuple[FloatArray, ...]
    payments: FloatArray  # (T, U) p_{i,t}
    value_won: FloatArray  # (T, U) V_{i,t} = Σ_{r∈R_i} v_r·x_r
    welfare: FloatArray  # (T,) W(σ_t; v)
    alpha: FloatArray  # (T, P)
    alpha_capped: FloatArray  # (T, P)
    mu: FloatArray  # (T, P)

    @property
    def utilities(self) -> FloatArray:
        """(T, U) utility under the true values, V_{i,t} − p_{i,t}."""
        return self.value_won - self.payments

    @property
    def budgets(self) -> FloatArray:
        """(P,) B = T·γ."""
        return self.T * self.gamma

    def total_utility(self, user: str) -> float:
        return float(self.utilities[:, self.users.index(user)].sum())

    def spend(self, user: str) -> float:
        return float(self.payments[:, self.users.index(user)].sum())


def simulate(
    draw_batch: BatchSource,
    T: int,
    pacing: Mapping[str, float],
    *,
    users: Sequence[str] = (),
    seed: int = 0,
    eta_scale: float = DEFAULT_ETA_SCALE,
    mu_max: float = DEFAULT_MU_MAX,
    mu0: float = 0.0,
) -> RepeatedResult:
    """Run T batches; ``pacing`` maps each pacing user to its γ (B = T·γ); the rest bid truthfully.

    ``users`` fixes the order of the per-user columns (default: the pacing users, then the others
    in order of first appearance); a pacing user absent from a batch pays nothing in it.
    ``eta_scale``, ``mu_max`` and ``mu0`` configure every ``PacingBidder`` (``eta_scale=0`` with
    ``mu0 = 1/α − 1`` is a fixed-α bidder). Batches are drawn from ``draw_batch`` with a generator
    seeded by ``seed``, so a run is reproducible.
    """
    if isinstance(T, bool) or not isinstance(T, int | np.integer) or T < 1:
        raise ValueError(f"T must be an integer >= 1, got {T!r}")
    rng = np.random.default_rng(seed)
    bidders = {
        name: PacingBidder(gamma, int(T), eta_scale=eta_scale, mu_max=mu_max, mu0=mu0)
        for name, gamma in pacing.items()
    }
    pacers = tuple(bidders)
    columns: dict[str, int] = {}
    for name in (*pacers, *users):
        columns.setdefault(name, len(columns))

    batches: list[Batch] = []
    all_bids: list[FloatArray] = []
    paid: list[dict[int, float]] = []
    won: list[FloatArray] = []
    welfare_t = np.zeros(T, dtype=np.float64)
    alpha = np.zeros((T, len(pacers)), dtype=np.float64)
    alpha_capped = np.zeros_like(alpha)
    mu = np.zeros_like(alpha)

    for t in range(int(T)):
        batch = draw_batch(t, rng)
        tree, v = batch.tree, batch.values
        for name in tree.user_names:
            columns.setdefault(name, len(columns))
        b = v.copy()
        for j, name in enumerate(pacers):
            bidder = bidders[name]
            alpha[t, j], mu[t, j] = bidder.alpha, bidder.mu
            mine = requests_of(tree, name)
            b[mine] = bidder.bids(v[mine])
            alpha_capped[t, j] = bidder.alpha_bid
        order = dfs_bid_order(tree, b)
        prices = vcg_payments(tree, b)
        charged = {name: prices.get(name, 0.0) for name in tree.user_names}
        for name in pacers:  # what the bidder settled: never above its remaining budget
            charged[name] = bidders[name].pay(prices.get(name, 0.0)).payment
        x = priorities(order) if tree.n > 1 else np.zeros(tree.n)
        won_t = np.bincount(tree.users, weights=v * x, minlength=len(tree.user_names))
        won.append(np.asarray(won_t, dtype=np.float64))
        paid.append({columns[name]: p for name, p in charged.items()})
        welfare_t[t] = welfare(order, v)
        batches.append(batch)
        b.flags.writeable = False
        all_bids.append(b)

    names = tuple(columns)
    payments = np.zeros((T, len(names)), dtype=np.float64)
    value_won = np.zeros_like(payments)
    for t, batch in enumerate(batches):
        cols = [columns[name] for name in batch.tree.user_names]
        value_won[t, cols] = won[t]
        for col, p in paid[t].items():
            payments[t, col] = p
    return RepeatedResult(
        T=int(T),
        users=names,
        pacing=pacers,
        gamma=np.array([bidders[name].gamma for name in pacers], dtype=np.float64),
        batches=tuple(batches),
        bids=tuple(all_bids),
        payments=payments,
        value_won=value_won,
        welfare=welfare_t,
        alpha=alpha,
        alpha_capped=alpha_capped,
        mu=mu,
    )


def requests_of(tree: RadixTree, user: str) -> IntArray:
    """Batch indices of ``user``'s requests (empty if the user has none in this batch)."""
    if user not in tree.user_names:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(tree.users == tree.user_names.index(user)).astype(np.int64)
