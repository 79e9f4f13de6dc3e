"""Priority, welfare and its local decomposition over the radix tree (docs/design.md §1).

With n requests served in positions pos_r ∈ {1..n}, the fractional priority of r is
x_r = (n − pos_r)/(n − 1): 1 for the first served, 0 for the last. A user's value is
V_i = Σ_{r∈R_i} b_r·x_r and the welfare of a schedule σ is W(σ) = Σ_i V_i. A uniformly random
order has expected welfare ½·Σ_r b_r, so welfare is reported as the percentage above that.

Local decomposition: for a node u whose children are served in the order π_u,
L_u(π_u; G) = Σ_{a before b} G(c_a)·s(c_b). Every request after r contributes one to n − pos_r,
and it lies in a later sibling of the child holding r at exactly one common ancestor, so
Σ_r b_r·(n − pos_r) = Σ_u L_u(π_u; F) and W = (1/(n−1))·Σ_u L_u.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from auction.radix import FloatArray, IntArray, RadixTree
from auction.segments import exclusive_run_cumsum


def positions(order: npt.ArrayLike) -> IntArray:
    """pos[r] (0-based) of each request index r in ``order``."""
    served = np.asarray(order, dtype=np.int64)
    pos = np.empty(served.shape[0], dtype=np.int64)
    pos[served] = np.arange(served.shape[0])
    return pos


def priorities(order: npt.ArrayLike) -> FloatArray:
    """x_r = (n − pos_r)/(n − 1) per request index (1-based pos); all ones when n = 1."""
    pos = positions(order)
    n = pos.shape[0]
    if n <= 1:
        return np.ones(n, dtype=np.float64)
    x: FloatArray = (n - 1 - pos) / (n - 1)
    return x


def welfare(order: npt.ArrayLike, bids: npt.ArrayLike) -> float:
    """W(σ) = Σ_r b_r·x_r for the schedule ``order`` (request indices, first served first).

    Three requests with bids 3, 1, 2 served in the order 0, 2, 1 get x = 1, 0, ½:

    >>> welfare([0, 2, 1], [3.0, 1.0, 2.0])
    4.0

    A batch of one (or none) has no order to value: its welfare is 0.

    >>> welfare([0], [5.0])
    0.0
    """
    b = np.asarray(bids, dtype=np.float64)
    if b.shape[0] <= 1:
        return 0.0
    return float(np.dot(b, priorities(order)))


def user_values(order: npt.ArrayLike, bids: npt.ArrayLike, users: IntArray) -> FloatArray:
    """V_i = Σ_{r∈R_i} b_r·x_r for every user index i (0 for all when n ≤ 1)."""
    b = np.asarray(bids, dtype=np.float64)
    if b.shape[0] <= 1:
        return np.zeros(int(users.max(initial=-1)) + 1, dtype=np.float64)
    return np.bincount(users, weights=b * priorities(order)).astype(np.float64)


def welfare_pct_above_half(welfare_value: float, bids: npt.ArrayLike) -> float:
    """100·(W − ½Σb)/(½Σb): how far a schedule beats a random order (0 when Σb = 0).

    >>> round(welfare_pct_above_half(4.0, [3.0, 1.0, 2.0]), 6)
    33.333333
    """
    half = 0.5 * float(np.sum(np.asarray(bids, dtype=np.float64)))
    if half <= 0.0:
        return 0.0
    return 100.0 * (welfare_value - half) / half


def local_welfare(tree: RadixTree, G: FloatArray, sibling_rank: IntArray) -> FloatArray:
    """L_u(π_u; G) for every node u, with π_u given by ``sibling_rank`` (lower is served first).

    ``G`` is a per-node quantity such as F(c); ``sibling_rank[c]`` ranks c among its siblings.
    Summing the result and dividing by n − 1 gives the welfare of the DFS order the ranks define.
    """
    kids = np.arange(1, tree.num_nodes)
    if kids.size == 0:
        return np.zeros(tree.num_nodes, dtype=np.float64)
    by_rank = kids[np.lexsort((sibling_rank[kids], tree.parent[kids]))]
    parents = tree.parent[by_rank]
    g_before = exclusive_run_cumsum(G[by_rank], parents)
    pair_terms = g_before * tree.size[by_rank]
    return np.bincount(parents, weights=pair_terms, minlength=tree.num_nodes).astype(np.float64)

