"""Regret of a pacing user against the best fixed multiplier in hindsight.

Counterfactual: user i alone replays the T batches of a ``RepeatedResult`` with another multiplier
schedule, against the same competitor bids b_{−i,t} and the same budget B = T·γ (it bids
α'_t·v with α'_t = ``capped_alpha``, so it stops when its budget runs out, as the autobidder does).
Its utility is U(α) = Σ_t [V_{i,t}(σ_t(α); v) − p_{i,t}(α)] under the true values.

No VCG call per candidate: with i's bids removed, the best schedule for the others does not depend
on α, so C_t = max_{σ∈D(T)} W_{−i}(σ) is computed once per batch and
p_{i,t}(α) = C_t − W_{−i}(σ_t(α)), where σ_t(α) is the ``dfs-bid`` order of the batch's bids. The
orders of K candidates come from one row-wise sort of a (K, nodes) key matrix, restricted to the
sibling groups under an ancestor of the user's requests (the only ones its bids can reorder), so a
whole grid of multipliers costs less than one VCG call per batch.

Regret = max_α U(α) − U(autobidder), α over [1/(1+μ_max), 1]: a log grid, refined around its best
point. Each batch's utility is piecewise constant in α (the order changes at finitely many α; only
the batch where the budget cap binds varies continuously), so the refined grid gives a lower bound
on the true maximum that tightens with the grid; the autobidder's own mean α' is tried as well. The
autobidder beats the comparator where the regret comes out ≤ 0. Theory (Balseiro–Lu–Mirrokni
2020): regret O(√T), a log-log slope of ½.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from auction.pacing import DEFAULT_MU_MAX, ROUNDING, FloatArray, alpha_of
from auction.radix import IntArray, RadixTree
from auction.repeated import RepeatedResult, requests_of
from auction.schedulers import dfs_bid_order
from auction.segments import run_start_of
from auction.welfare import welfare


@dataclass(frozen=True)
class Regret:
    """The autobidder's utility against the best fixed α in hindsight, for one user and horizon."""

    user: str
    T: int
    utility: float
    best_alpha: float
    best_utility: float
    spend: float
    budget: float

    @property
    def regret(self) -> float:
        """max_α U(α) − U(autobidder); ≤ 0 when the autobidder beats every fixed α tried."""
        return self.best_utility - self.utility


@dataclass(frozen=True, eq=False)
class _Layout:
    """The sibling groups whose order is computed per bid row, and the edges above each request.

    ``kids`` holds whole groups of siblings; ``above[k, r]`` = 1 if ``kids[k]`` is on the root path
    of request r (its leaf included); ``group_start`` gives, per sorted slot, its group's first slot
    (the grouping by parent is the same for every row)."""

    kids: IntArray
    local: IntArray  # local[v] = index of node v in ``kids``
    group_start: IntArray
    above: FloatArray


def _ancestry(tree: RadixTree) -> FloatArray:
    """(N, n): 1 where a non-root node lies on a request's root path (its leaf included)."""
    above = np.zeros((tree.num_nodes, tree.n), dtype=np.float64)
    node = tree.leaf_of.copy()
    requests = np.arange(tree.n)
    while node.size:  # one tree level per pass
        above[node, requests] = 1.0
        up = tree.parent[node]
        keep = up > 0
        node, requests = up[keep], requests[keep]
    return above


def _layout(tree: RadixTree, kids: IntArray, ancestry: FloatArray) -> _Layout:
    kids = kids[np.argsort(tree.parent[kids], kind="stable")]
    local = np.full(tree.num_nodes, -1, dtype=np.int64)
    local[kids] = np.arange(kids.size)
    return _Layout(
        kids=kids,
        local=local,
        group_start=run_start_of(tree.parent[kids]),
        above=ancestry[kids],
    )


def _positions(tree: RadixTree, b: FloatArray, lay: _Layout) -> FloatArray:
    """(K, n): the part of each request's 0-based ``dfs-bid`` position that the groups of
    ``lay`` contribute, for every row of the (K, n) bid matrix ``b``.

    A request's position is the sum, over the edges above it, of the sizes of the siblings served
    before that edge's child. The subtree sums and the sibling sort (decreasing F/s, ties to the
    earliest arrival) are row-wise those of ``dfs_bid_order``.
    """
    K, n = b.shape
    if lay.kids.size == 0:
        return np.zeros((K, n), dtype=np.float64)
    prefix = np.zeros((K, n + 1), dtype=np.longdouble)
    np.cumsum(b[:, tree.lex_order], axis=1, dtype=np.longdouble, out=prefix[:, 1:])
    lo, hi = tree.leaf_lo[lay.kids], tree.leaf_hi[lay.kids]
    F = np.asarray(prefix[:, hi] - prefix[:, lo], dtype=np.float64)
    leaves = tree.request[lay.kids] >= 0
    F[:, leaves] = b[:, tree.request[lay.kids[leaves]]]  # a leaf's own bid, exactly
    key = F / np.maximum(tree.size[lay.kids], 1)
    shape = (K, lay.kids.size)
    by_rank = np.lexsort(
        (
            np.broadcast_to(tree.first_rank[lay.kids], shape),
            -key,
            np.broadcast_to(tree.parent[lay.kids], shape),
        ),
        axis=-1,
    )
    served = lay.kids[by_rank]  # children grouped by parent, best first
    sizes = tree.size[served]
    before = np.cumsum(sizes, axis=1) - sizes
    offset = np.zeros(shape, dtype=np.float64)
    offset[np.arange(K)[:, None], lay.local[served]] = before - before[:, lay.group_start]
    return np.asarray(offset @ lay.above, dtype=np.float64)


def priorities_matrix(tree: RadixTree, bids: npt.ArrayLike) -> FloatArray:
    """x_r of the ``dfs-bid`` order for every row of a (K, n) bid matrix, as a (K, n) matrix.

    Row-wise the same arithmetic as ``dfs_bid_order``, so each row equals
    ``priorities(dfs_bid_order(tree, row))``.
    """
    b = np.atleast_2d(np.asarray(bids, dtype=np.float64))
    K, n = b.shape[0], tree.n
    if b.shape[1] != n:
        raise ValueError(f"expected {n} bids per row, got shape {b.shape}")
    if n <= 1:
        return np.ones((K, n), dtype=np.float64)
    everyone = _layout(tree, np.arange(1, tree.num_nodes, dtype=np.int64), _ancestry(tree))
    return np.asarray((n - 1 - _positions(tree, b, everyone)) / (n - 1), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class _Round:
    """What a counterfactual needs from batch t, independent of the user's multiplier.

    Only the sibling groups under an ancestor of the user's requests can change order with its
    bids (``varying``); the positions the other groups contribute are computed once (``fixed``).
    """

    tree: RadixTree
    varying: _Layout
    fixed: FloatArray  # (n,) positions contributed by the groups the user is not in
    mine: IntArray  # the user's requests
    values: FloatArray  # v_r of the user's requests
    others: FloatArray  # b_{−i,t}: the recorded bids with the user's set to 0
    best_for_others: float  # C_t = max_σ W_{−i}(σ)


def _split_layouts(tree: RadixTree, mine: IntArray) -> tuple[_Layout, _Layout]:
    """(groups under an ancestor of ``mine``, all other groups)."""
    touched = np.zeros(tree.num_nodes, dtype=bool)
    node = np.unique(tree.parent[tree.leaf_of[mine]])
    while node.size:
        touched[node] = True
        node = np.unique(tree.parent[node[node > 0]])
    kids = np.arange(1, tree.num_nodes, dtype=np.int64)
    varies = touched[tree.parent[kids]]
    ancestry = _ancestry(tree)
    return _layout(tree, kids[varies], ancestry), _layout(tree, kids[~varies], ancestry)


def _rounds(result: RepeatedResult, user: str) -> list[_Round | None]:
    layouts: dict[int, tuple[_Layout, _Layout]] = {}  # per tree: the user's requests are fixed
    rounds: list[_Round | None] = []
    for t, batch in enumerate(result.batches):
        tree = batch.tree
        mine = requests_of(tree, user)
        if mine.size == 0 or tree.n <= 1:
            rounds.append(None)  # the user wins and pays nothing in this batch
            continue
        if id(tree) not in layouts:
            layouts[id(tree)] = _split_layouts(tree, mine)
        varying, fixed = layouts[id(tree)]
        others = np.array(result.bids[t], dtype=np.float64)
        others[mine] = 0.0
        rounds.append(
            _Round(
                tree=tree,
                varying=varying,
                fixed=_positions(tree, result.bids[t][None, :], fixed)[0],
                mine=mine,
                values=batch.values[mine],
                others=others,
                best_for_others=welfare(dfs_bid_order(tree, others), others),
            )
        )
    return rounds


def counterfactual_utilities(
    result: RepeatedResult, user: str, alphas: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """(U, spend) of ``user`` for K multiplier schedules: ``alphas`` of shape (K,) (fixed α) or
    (K, T) (α_t per batch), each capped by the remaining budget, against the recorded
    competitor bids."""
    j = _pacing_index(result, user)
    return _replay(_rounds(result, user), alphas, result.T * float(result.gamma[j]))


def _replay(
    rounds: Sequence[_Round | None], alphas: npt.ArrayLike, budget: float
) -> tuple[FloatArray, FloatArray]:
    T = len(rounds)
    a = np.asarray(alphas, dtype=np.float64)
    schedule = np.broadcast_to(a[:, None], (a.shape[0], T)) if a.ndim == 1 else a
    if schedule.ndim != 2 or schedule.shape[1] != T:
        raise ValueError(f"alphas must have shape (K,) or (K, {T}), got {a.shape}")
    if not np.all(np.isfinite(schedule)) or np.any(schedule < 0):
        raise ValueError("alphas must be finite and >= 0")
    K = schedule.shape[0]
    spent = np.zeros(K, dtype=np.float64)
    utility = np.zeros(K, dtype=np.float64)
    for t, r in enumerate(rounds):
        if r is None:
            continue
        value_sum = float(r.values.sum())
        remaining = np.maximum(budget - spent, 0.0)
        # The formula of ``capped_alpha``, so that replaying the autobidder's own α_t is exact.
        capped = np.where(
            schedule[:, t] * value_sum <= remaining,
            schedule[:, t],
            remaining / max(value_sum, np.finfo(np.float64).tiny),
        )
        bids = np.broadcast_to(r.others, (K, r.tree.n)).copy()
        bids[:, r.mine] = capped[:, None] * r.values
        n = r.tree.n
        x = (n - 1 - (r.fixed + _positions(r.tree, bids, r.varying))) / (n - 1)
        payment = np.maximum(r.best_for_others - x @ r.others, 0.0)
        if np.any(payment > remaining + ROUNDING * max(budget, 1.0)):
            raise RuntimeError("a VCG payment exceeded the budget cap: the cap is broken")
        taken = np.minimum(payment, remaining)
        spent += taken
        utility += x[:, r.mine] @ r.values - taken
    return utility, spent


def best_fixed_alpha(
    result: RepeatedResult,
    user: str,
    *,
    mu_max: float = DEFAULT_MU_MAX,
    grid: int = 24,
    refine: int = 2,
    extra: Sequence[float] = (),
) -> tuple[float, float]:
    """(α*, U(α*)): the best fixed multiplier on a log grid over [1/(1+μ_max), 1], refined
    ``refine`` times between the neighbours of the best point. ``extra`` adds candidates that
    are tried on their own: they never move the grid's refinement, so adding one can only raise
    U(α*)."""
    if grid < 2 or refine < 0:
        raise ValueError(f"grid must be >= 2 and refine >= 0, got {grid}, {refine}")
    low = alpha_of(mu_max)
    rounds = _rounds(result, user)
    budget = result.T * float(result.gamma[_pacing_index(result, user)])
    best_alpha, best_u = 1.0, -np.inf
    extras = np.asarray(extra, dtype=np.float64)
    extras = extras[(extras >= low) & (extras <= 1.0)]
    if extras.size:
        utility, _spent = _replay(rounds, extras, budget)
        k = int(np.argmax(utility))
        best_alpha, best_u = float(extras[k]), float(utility[k])
    candidates = np.geomspace(low, 1.0, grid)
    for _ in range(refine + 1):
        utility, _spent = _replay(rounds, candidates, budget)
        k = int(np.argmax(utility))
        if utility[k] > best_u:
            best_alpha, best_u = float(candidates[k]), float(utility[k])
        lo = candidates[max(k - 1, 0)]
        hi = candidates[min(k + 1, candidates.size - 1)]
        candidates = np.linspace(lo, hi, grid + 2)[1:-1]
    return best_alpha, best_u


def autobidder_regret(
    result: RepeatedResult,
    user: str,
    *,
    mu_max: float = DEFAULT_MU_MAX,
    grid: int = 24,
    refine: int = 2,
) -> Regret:
    """The autobidder's regret for ``user`` against the best fixed α (``best_fixed_alpha``); the
    autobidder's own time-averaged α is a candidate too."""
    j = _pacing_index(result, user)
    best_alpha, best_u = best_fixed_alpha(
        result,
        user,
        mu_max=mu_max,
        grid=grid,
        refine=refine,
        extra=(float(result.alpha_capped[:, j].mean()),),
    )
    return Regret(
        user=user,
        T=result.T,
        utility=result.total_utility(user),
        best_alpha=best_alpha,
        best_utility=best_u,
        spend=result.spend(user),
        budget=float(result.budgets[j]),
    )


def loglog_slope(horizons: Sequence[int], regrets: Sequence[float]) -> float | None:
    """Least-squares slope of log(regret) on log(T); ``None`` when a regret is ≤ 0 (the autobidder
    beat the best fixed α there, and a log is undefined) or fewer than two points are given.

    >>> round(loglog_slope([100, 400, 1600], [10.0, 20.0, 40.0]), 6)
    0.5
    """
    r = np.asarray(regrets, dtype=np.float64)
    if len(horizons) != r.size:
        raise ValueError("horizons and regrets must have the same length")
    if r.size < 2 or np.any(r <= 0):
        return None
    slope = np.polyfit(np.log(np.asarray(horizons, dtype=np.float64)), np.log(r), 1)[0]
    return float(slope)


def _pacing_index(result: RepeatedResult, user: str) -> int:
    if user not in result.pacing:
        raise ValueError(f"{user!r} is not a pacing user of this run; pacing: {result.pacing}")
    return result.pacing.index(user)
