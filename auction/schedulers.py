"""Schedulers: each turns a radix tree and bids into an order of service (docs/design.md §1).

- ``dfs-bid``: DFS that visits children in decreasing average bid F(c)/s(c) (Smith's rule). An
  exchange of adjacent siblings a, b changes Σ_u L_u by F(a)s(b) − F(b)s(a), so this order is
  welfare-optimal over the DFS orders D(T).
- ``dfs-uniform``: the same DFS with all bids equal: bid-blind, longest-prefix-match.
- ``dfs-weight``: SGLang's DFS-weight: children by decreasing subtree size s(c) (bid-blind).
- ``bid-sort``: all requests by decreasing bid, ignoring the tree (the unconstrained optimum).
- ``no-sort``: arrival order.

Ties: ``dfs-bid``, ``bid-sort`` and ``no-sort`` give them to the earliest arrival (then the
earlier position in the batch). The bid-blind baselines ``dfs-uniform`` and ``dfs-weight`` break
sibling ties in a random order drawn from the ``seed`` they are given: earliest-arrival ties made
``dfs-uniform`` serve the cheap cached requests first (shortest-job-first in disguise, 507 of 512
on a star, docs/design.md §8), which is not what a bid-blind engine does. Every order is a
function of (tree, bids, seed). Orders are arrays of batch indices, first served first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from auction.radix import FloatArray, IntArray, RadixTree
from auction.segments import exclusive_run_cumsum


class Scheduler(ABC):
    """One policy for ordering a batch; ``order`` returns batch indices, first served first."""

    name: ClassVar[str]
    seeded: ClassVar[bool] = False  # True: sibling ties follow a random order drawn from ``seed``

    @abstractmethod
    def order(self, tree: RadixTree, bids: npt.ArrayLike, *, seed: int = 0) -> IntArray:
        """The order of service; ``seed`` matters only to the ``seeded`` schedulers."""


def average_bids(tree: RadixTree, bids: npt.ArrayLike) -> FloatArray:
    """F(c)/s(c) for every node: the key Smith's rule sorts siblings by."""
    return tree.subtree_sums(bids) / np.maximum(tree.size, 1)


def sibling_order(tree: RadixTree, key: FloatArray, tiebreak: IntArray | None = None) -> IntArray:
    """Non-root nodes grouped by parent, each group by decreasing ``key``, ties by increasing
    ``tiebreak`` (default ``first_rank``: the child holding the earliest arrival first)."""
    kids = np.arange(1, tree.num_nodes, dtype=np.int64)
    second = tree.first_rank if tiebreak is None else tiebreak
    return kids[np.lexsort((second[kids], -key[kids], tree.parent[kids]))]


def neutral_tiebreak(tree: RadixTree, seed: int) -> IntArray:
    """A uniformly random rank per node, from ``seed``: among tied siblings every order is
    equally likely, whatever their arrivals or token ids."""
    return np.random.default_rng(seed).permutation(tree.num_nodes).astype(np.int64)


def dfs_order(tree: RadixTree, key: FloatArray, tiebreak: IntArray | None = None) -> IntArray:
    """The DFS order that serves the children of every node in ``sibling_order(tree, key,
    tiebreak)``.

    A request's position is the sum, over the edges of its root path, of the sizes of the siblings
    served before that edge's child. Pre-order keeps each subtree contiguous, so adding a child's
    offset to its whole subtree is a range update: a difference array and one cumulative sum.
    """
    kids = sibling_order(tree, key, tiebreak)
    before = exclusive_run_cumsum(tree.size[kids].astype(np.float64), tree.parent[kids])
    offset = before.astype(np.int64)
    diff = np.bincount(kids, weights=offset, minlength=tree.num_nodes + 1)
    diff -= np.bincount(tree.subtree_end[kids], weights=offset, minlength=tree.num_nodes + 1)
    first_position = np.cumsum(diff[: tree.num_nodes]).astype(np.int64)
    order = np.empty(tree.n, dtype=np.int64)
    order[first_position[tree.leaf_of]] = np.arange(tree.n, dtype=np.int64)
    return order


def arrival_order(tree: RadixTree) -> IntArray:
    """Batch indices by (arrival, batch position)."""
    arrivals = np.asarray([r.arrival for r in tree.requests], dtype=np.int64)
    return np.lexsort((np.arange(tree.n), arrivals)).astype(np.int64)


class DfsBid(Scheduler):
    name = "dfs-bid"

    def order(self, tree: RadixTree, bids: npt.ArrayLike, *, seed: int = 0) -> IntArray:
        return dfs_order(tree, average_bids(tree, bids))


class DfsUniform(Scheduler):
    """Every sibling ties: a seeded random DFS order (each subtree still contiguous)."""

    name = "dfs-uniform"
    seeded = True

    def order(self, tree: RadixTree, bids: npt.ArrayLike, *, seed: int = 0) -> IntArray:
        equal = np.zeros(tree.num_nodes, dtype=np.float64)
        return dfs_order(tree, equal, neutral_tiebreak(tree, seed))


class DfsWeight(Scheduler):
    """SGLang's DFS-weight: larger subtrees first (more requests reuse the prefix sooner)."""

    name = "dfs-weight"
    seeded = True

    def order(self, tree: RadixTree, bids: npt.ArrayLike, *, seed: int = 0) -> IntArray:
        weight = tree.size.astype(np.float64)
        return dfs_order(tree, weight, neutral_tiebreak(tree, seed))


class BidSort(Scheduler):
    name = "bid-sort"

    def order(self, tree: RadixTree, bids: npt.ArrayLike, *, seed: int = 0) -> IntArray:
        b = np.asarray(bids, dtype=np.float64)
        by_arrival = arrival_order(tree)
        return by_arrival[np.argsort(-b[by_arrival], kind="stable")]


class NoSort(Scheduler):
    name = "no-sort"

    def order(self, tree: RadixTree, bids: npt.ArrayLike, *, seed: int = 0) -> IntArray:
        return arrival_order(tree)


SCHEDULERS: dict[str, Scheduler] = {
    s.name: s for s in (DfsBid(), DfsUniform(), DfsWeight(), BidSort(), NoSort())
}


def get_scheduler(name: str) -> Scheduler:
    try:
        return SCHEDULERS[name]
    except KeyError:
        known = ", ".join(sorted(SCHEDULERS))
        raise ValueError(f"unknown scheduler {name!r}; known: {known}") from None


def dfs_bid_order(tree: RadixTree, bids: npt.ArrayLike) -> IntArray:
    """The welfare-optimal DFS order (``dfs-bid``)."""
    return dfs_order(tree, average_bids(tree, bids))
