"""Plain reference implementations: slow, obvious, and independent of the array code.

Tests hold the fast paths to these: ``vcg_payments`` to ``vcg_payments_naive`` (recompute the
optimum once per user), ``dfs-bid`` to the brute-force maximum over ``all_dfs_orders``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from auction.radix import RadixTree
from auction.schedulers import dfs_bid_order
from auction.welfare import welfare


def subtree_bid_sums_naive(tree: RadixTree, bids: npt.ArrayLike) -> list[float]:
    """F(c) by accumulating leaves into their parents, children before parents."""
    b = np.asarray(bids, dtype=np.float64)
    F = [0.0] * tree.num_nodes
    for v in range(tree.num_nodes - 1, -1, -1):  # reverse pre-order: children first
        if tree.request[v] >= 0:
            F[v] = float(b[tree.request[v]])
        if v > 0:
            F[int(tree.parent[v])] += F[v]
    return F


def dfs_bid_order_naive(tree: RadixTree, bids: npt.ArrayLike) -> list[int]:
    """Smith's-rule DFS by an explicit stack: children by decreasing F/s, ties earliest arrival."""
    F = subtree_bid_sums_naive(tree, bids)
    order: list[int] = []
    stack = [0]
    while stack:
        v = stack.pop()
        if tree.request[v] >= 0:
            order.append(int(tree.request[v]))
        kids = sorted(
            (int(c) for c in tree.children_of(v)),
            key=lambda c: (-F[c] / int(tree.size[c]), int(tree.first_rank[c])),
        )
        stack.extend(reversed(kids))
    return order


def vcg_payments_naive(
    tree: RadixTree, bids: npt.ArrayLike, order: npt.ArrayLike | None = None
) -> dict[str, float]:
    """p_i = max_σ W_{−i}(σ) − W_{−i}(σ*), recomputing the optimum without each user's bids.

    ``order`` is σ*, the chosen schedule (default: ``dfs-bid``); payments depend on it when ties
    leave several welfare-optimal schedules.
    """
    b = np.asarray(bids, dtype=np.float64)
    chosen = dfs_bid_order(tree, b) if order is None else np.asarray(order, dtype=np.int64)
    payments: dict[str, float] = {}
    for i, name in enumerate(tree.user_names):
        others = np.where(tree.users == i, 0.0, b)
        best = dfs_bid_order_naive(tree, others)
        payments[name] = welfare(best, others) - welfare(chosen, others)
    return payments


def all_dfs_orders(tree: RadixTree, v: int = 0) -> Iterator[list[int]]:
    """Every DFS order of v's subtree (exponential: for n ≤ 7 or so)."""
    if tree.request[v] >= 0:
        yield [int(tree.request[v])]
        return
    kids = [int(c) for c in tree.children_of(v)]
    for perm in itertools.permutations(kids):
        for parts in itertools.product(*(list(all_dfs_orders(tree, c)) for c in perm)):
            yield [r for part in parts for r in part]
