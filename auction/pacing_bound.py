"""Welfare under heterogeneous pacing (docs/design.md §1, "Heterogeneous pacing").

With bids b_r = α_r·v_r the schedule is chosen by the bids but judged by the true values. The
value-weighted pacing of a subtree c is α(c) = F_b(c)/F_v(c), and at a node u

    κ_u = max_c α(c) / min_c α(c)   over u's children c with F_v(c) > 0.

Then W(A(b); v) ≥ (1/(n−1))·Σ_u L_u*(v)/κ_u, where L_u*(v) = L_u(π_u^v; F_v) is the optimal local
welfare at u (siblings by decreasing average value F_v/s). Per sibling pair {a, b}: the optimum
earns max(F_v(a)s(b), F_v(b)s(a)); if the bids put a first while the values prefer b, then
α(a)F_v(a)/s(a) ≥ α(b)F_v(b)/s(b), so F_v(a)s(b) ≥ F_v(b)s(a)/κ_u. Every pair keeps at least
1/κ_u of its optimal term, hence so does L_u; summing over u and dividing by n − 1 gives the bound.
Pacing costs welfare only where it reverses the average order of siblings; with one common α every
κ_u = 1 and nothing is lost.

Range and accuracy. Values and bids are money: finite, in [0, ``MAX_BID``] (auction/request.py;
anything else raises ``ValueError`` naming the request). Within that range α(c) and κ_u carry a
relative error of at most about 4·n·ε (ε = 2⁻⁵², n requests), however widely the values spread:
F_v(c) and F_b(c) are summed over each subtree (terms ≥ 0, so a sum of k of them is within
(k − 1)·ε/2 of exact, relatively), not taken as differences of prefix sums over the batch, whose
absolute error, about ε·Σ_r v_r, swamps the sum of a small subtree beside a large one (values 1
and 2e-16 under one common α gave κ = 1.00016). A positive bid or value below float64's smallest
normal number (≈ 2.2e-308) has fewer significant bits than that, so α(c) is only as precise as it;
bids formed as α·v should keep α·v normal.

Children without value. A child with F_v(c) = 0 and F_b(c) = 0 is left out of κ_u: its key is 0,
so it goes after every sibling with a positive bid and costs nothing. Two cases can lose a valued
sibling's whole term, and get κ_u = ∞ (the node's term in the bound is 0):
- a child with F_v(c) = 0 < F_b(c) (α(c) = ∞: a worthless subtree that bids can jump the queue);
- a valued child with F_b(c) = 0 (α(c) = 0) beside any sibling: it ties at key 0 and the tie-break
  may serve it last.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from auction.radix import FloatArray, RadixTree
from auction.request import check_bid_array
from auction.schedulers import average_bids, sibling_order
from auction.welfare import local_welfare


def subtree_pacing(tree: RadixTree, values: npt.ArrayLike, bids: npt.ArrayLike) -> FloatArray:
    """α(c) = F_b(c)/F_v(c) for every node: NaN where F_v(c) = F_b(c) = 0, ∞ where only F_v = 0."""
    v, b = _checked(tree, values, bids)
    F_v, F_b = subtree_sums_bottom_up(tree, v), subtree_sums_bottom_up(tree, b)
    # α(c) past float64's range (a large bid on a subtree worth ~1e-300) overflows to ∞, which
    # the bound treats like F_v = 0: conservative, the node's term becomes 0.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        alpha = F_b / F_v
    alpha[(F_v == 0) & (F_b == 0)] = np.nan
    alpha[(F_v == 0) & (F_b > 0)] = np.inf
    return np.asarray(alpha, dtype=np.float64)


def subtree_sums_bottom_up(tree: RadixTree, per_request: FloatArray) -> FloatArray:
    """Σ of a non-negative per-request quantity over each node's subtree, accumulated leaf to root.

    ``RadixTree.subtree_sums`` takes each sum as a difference of prefix sums (fast, and accurate
    relative to the whole batch, which is what welfare needs); a ratio of two subtree sums needs
    each sum accurate relative to itself, which only direct summation of its own terms gives.
    Nodes are numbered in pre-order (a parent before its children), so one pass from the last
    node to the first adds every finished subtree into its parent: O(N).
    """
    sums = np.zeros(tree.num_nodes, dtype=np.float64)
    sums[tree.leaf_of] = per_request
    acc: list[float] = sums.tolist()  # Python floats: the same float64 rounding, faster per item
    parent: list[int] = tree.parent.tolist()
    for node in range(tree.num_nodes - 1, 0, -1):
        acc[parent[node]] += acc[node]
    return np.asarray(acc, dtype=np.float64)


def pacing_kappa(tree: RadixTree, values: npt.ArrayLike, bids: npt.ArrayLike) -> FloatArray:
    """κ_u for every node u (1 for a leaf or a node with at most one valued child; ∞ in the cases
    the module docstring lists)."""
    alpha = subtree_pacing(tree, values, bids)
    N = tree.num_nodes
    kids = np.arange(1, N, dtype=np.int64)
    parent = tree.parent[kids]
    a = alpha[kids]
    counted = ~np.isnan(a)
    hi = np.full(N, 0.0)
    lo = np.full(N, np.inf)
    np.maximum.at(hi, parent[counted], a[counted])
    np.minimum.at(lo, parent[counted], a[counted])
    valued = np.bincount(parent[counted & np.isfinite(a)], minlength=N)
    fan_out = np.bincount(parent, minlength=N)
    # A spread past float64's range (α(c) can be subnormal when a tiny bid paces a huge value)
    # becomes κ = ∞: the node's term L_u*/κ_u ≤ n²·MAX_BID/1.8e308 is 0 to float64 precision anyway.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kappa = hi / lo
    kappa[valued == 0] = 1.0  # no valued child: L_u* = 0, any κ will do
    # A worthless child that bids (α = ∞) or a valued child that does not (α = 0, a tie at key 0).
    kappa[(valued > 0) & ((hi == np.inf) | ((lo == 0) & (fan_out > 1)))] = np.inf
    kappa[(valued > 0) & (fan_out == 1) & (lo == 0)] = 1.0  # an only child has no one to trail
    return np.asarray(kappa, dtype=np.float64)


def optimal_local_welfare(tree: RadixTree, values: npt.ArrayLike) -> FloatArray:
    """L_u*(v) for every node: siblings by decreasing average value F_v/s (Smith's rule)."""
    v = check_bid_array(values, tree.requests, what="values")
    kids = sibling_order(tree, average_bids(tree, v))
    rank = np.zeros(tree.num_nodes, dtype=np.int64)
    rank[kids] = np.arange(kids.size)  # a global slot ranks siblings among themselves too
    return local_welfare(tree, tree.subtree_sums(v), rank)


def pacing_welfare_bound(tree: RadixTree, values: npt.ArrayLike, bids: npt.ArrayLike) -> float:
    """(1/(n−1))·Σ_u L_u*(v)/κ_u, in welfare units: a lower bound on W(dfs-bid(b); v).

    Two requests under one stem, values 4 and 1; bidding half of the first value (α = ½ and 1)
    still serves it first, but κ = 2 halves the bound at the stem:

    >>> from auction.radix import build_radix_tree
    >>> from auction.request import Request
    >>> tree = build_radix_tree([Request("a", "u", [1, 2], 4.0), Request("b", "w", [1, 3], 1.0)])
    >>> values = [4.0, 1.0]
    >>> pacing_welfare_bound(tree, values, [2.0, 1.0]), pacing_welfare_bound(tree, values, values)
    (2.0, 4.0)
    """
    v, b = _checked(tree, values, bids)
    if tree.n <= 1:
        return 0.0
    L_star = optimal_local_welfare(tree, v)
    kappa = pacing_kappa(tree, v, b)
    kept = np.where(np.isinf(kappa), 0.0, L_star / np.where(np.isinf(kappa), 1.0, kappa))
    return float(kept.sum() / (tree.n - 1))


def _checked(
    tree: RadixTree, values: npt.ArrayLike, bids: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """Values and bids as arrays, one per request, each finite and in [0, MAX_BID]."""
    return (
        check_bid_array(values, tree.requests, what="values"),
        check_bid_array(bids, tree.requests, what="bids"),
    )
