"""Priority, welfare and its local decomposition over the radix tree (docs/design.md §1).

With n requests served in positions pos_r ∈ {1..n}, the fractional priority of r is
x_r = (n − pos_r)/(n − 1): 1 for the first served, 0 for the last. A user's value is
V_i = Σ_{r∈R_i} b_r·x_r and the welfare of a schedule σ is W(σ) = Σ_i V_i. A uniformly random
order has expected welfare ½·Σ_r b_r, so welfare is reported as the percentage above that.

Local decomposition: for a node u whose children are served in the order π_u,
L_u(π_u; G) = Σ_{a before b} G(c_a)·s(c_b). Every request after r contributes one to n − pos_r,
and it lies in a later sibling of the child holding r at exactly one common ancestor, so
Σ_r b_r·(n − pos_r) = Σ_u L_u(π_u; F) and W = (1/(n−1))·Σ_u L_u.

Realised welfare (docs/design.md §8): the order a schedule plans is not the order in which the
engine answers. Ranking the requests by their measured time to first token (equal times share the
average of the ranks they span) gives pos_r, and the same formula W = Σ_r b_r·x_r applied to
that ranking is the welfare the requests actually received. When the times follow the planned
order exactly it equals W(σ); only the order of the times matters, never their scale.

Bids (and true values, in the same units) must be finite and in [0, ``MAX_BID``]
(auction/request.py), and an order must be a permutation of the batch's indices; anything else
raises ``ValueError``, where a bid of 1e308 used to give W = ``inf`` or ``nan`` (∞·0).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from auction.radix import FloatArray, IntArray, RadixTree
from auction.request import check_bid_array
from auction.segments import exclusive_run_cumsum


def positions(order: npt.ArrayLike) -> IntArray:
    """pos[r] (0-based) of each request index r in ``order``, a permutation of 0..n−1."""
    served = np.asarray(order)
    if served.ndim != 1 or (served.size and served.dtype.kind not in "iu"):
        raise ValueError(f"order must be a flat sequence of request indices, got {order!r}")
    served = served.astype(np.int64, copy=False)  # [] comes in as float64
    n = served.shape[0]
    pos = np.full(n, -1, dtype=np.int64)
    if n and (int(served.min()) < 0 or int(served.max()) >= n):
        raise ValueError(f"order must be a permutation of 0..{n - 1}, got {order!r}")
    pos[served] = np.arange(n)
    if n and int(pos.min()) < 0:  # an index served twice leaves another never served
        raise ValueError(f"order must be a permutation of 0..{n - 1}, got {order!r}")
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
    b = check_bid_array(bids)
    x = priorities(order)
    if x.shape != b.shape:
        raise ValueError(f"order serves {x.shape[0]} requests, bids has {b.shape[0]}")
    if b.shape[0] <= 1:
        return 0.0
    return float(np.dot(b, x))


def user_values(order: npt.ArrayLike, bids: npt.ArrayLike, users: IntArray) -> FloatArray:
    """V_i = Σ_{r∈R_i} b_r·x_r for every user index i (0 for all when n ≤ 1)."""
    b = check_bid_array(bids)
    if b.shape[0] <= 1:
        return np.zeros(int(users.max(initial=-1)) + 1, dtype=np.float64)
    x = priorities(order)
    if x.shape != b.shape or users.shape != b.shape:
        raise ValueError(
            f"order, bids and users must have one entry per request, got {x.shape[0]}, "
            f"{b.shape[0]} and {users.shape[0]}"
        )
    return np.bincount(users, weights=b * x).astype(np.float64)


def welfare_pct_above_half(welfare_value: float, bids: npt.ArrayLike) -> float:
    """100·(W − ½Σb)/(½Σb): how far a schedule beats a random order (0 when Σb = 0).

    >>> round(welfare_pct_above_half(4.0, [3.0, 1.0, 2.0]), 6)
    33.333333
    """
    if not math.isfinite(welfare_value):
        raise ValueError(f"welfare_value must be finite, got {welfare_value!r}")
    half = 0.5 * float(np.sum(check_bid_array(bids)))
    if half <= 0.0:
        return 0.0
    return 100.0 * (welfare_value - half) / half


def average_ranks(values: npt.ArrayLike) -> FloatArray:
    """0-based rank of each value in increasing order; equal values share the mean of their ranks.

    >>> average_ranks([0.3, 0.1, 0.3, 0.2]).tolist()
    [2.5, 0.0, 2.5, 1.0]
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"expected a flat sequence of times, got shape {v.shape}")
    by_value = np.argsort(v, kind="stable")
    sorted_v = v[by_value]
    # A run of equal values spans sorted slots [lo, hi); each member gets (lo + hi − 1)/2.
    starts = np.flatnonzero(np.concatenate(([True], sorted_v[1:] != sorted_v[:-1])))
    ends = np.concatenate((starts[1:], [v.shape[0]]))
    mean_rank = np.repeat((starts + ends - 1) / 2.0, ends - starts)
    ranks = np.empty(v.shape[0], dtype=np.float64)
    ranks[by_value] = mean_rank
    return ranks


def realised_welfare(bids: npt.ArrayLike, ttft_s: npt.ArrayLike) -> float:
    """W = Σ_r b_r·x_r with pos_r the (average) rank of r's time to first token.

    ``ttft_s[r]`` is request r's measured TTFT (any unit: only the order counts). Equal times
    share the average rank, so two requests answered together split the priority between them.

    >>> realised_welfare([3.0, 1.0, 2.0], [0.1, 0.9, 0.5])  # the order 0, 2, 1
    4.0
    >>> realised_welfare([3.0, 1.0, 2.0], [0.1, 0.5, 0.5])  # 1 and 2 tie: x = ¼ each
    3.75
    """
    b = check_bid_array(bids)
    t = np.asarray(ttft_s, dtype=np.float64)
    if t.shape != b.shape:
        raise ValueError(f"expected one TTFT per bid ({b.shape[0]}), got shape {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError("every TTFT must be finite: a request without a first token has no rank")
    n = b.shape[0]
    if n <= 1:
        return 0.0
    x = (n - 1 - average_ranks(t)) / (n - 1)
    return float(np.dot(b, x))


def realised_welfare_pct_above_half(bids: npt.ArrayLike, ttft_s: npt.ArrayLike) -> float:
    """``realised_welfare`` as the percentage above ½Σb, as the planned figure is reported.

    >>> round(realised_welfare_pct_above_half([3.0, 1.0, 2.0], [0.1, 0.9, 0.5]), 6)
    33.333333
    """
    return welfare_pct_above_half(realised_welfare(bids, ttft_s), bids)


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
