"""The radix tree T of a batch's prompts (docs/design.md §1).

A compressed trie: every edge carries a non-empty run of tokens, except the zero-length edge to
a request whose prompt ends at an internal node (or duplicates another prompt). Every request is a
leaf, so a subtree is a set of requests, and a DFS order keeps each subtree contiguous.

The tree is stored as flat arrays over its N nodes numbered in pre-order (a parent before its
children), which lets the schedulers and VCG payments work on whole arrays:

    parent[v]        parent node, -1 for the root (node 0)
    depth[v]         tokens from the root to the end of v's edge
    leaf_lo, leaf_hi the requests below v are lex_order[leaf_lo[v]:leaf_hi[v]] (lexicographic order)
    request[v]       batch index of the request at leaf v, -1 for an internal node
    subtree_end[v]   nodes v .. subtree_end[v]-1 are v's subtree (pre-order)
    first_rank[v]    smallest arrival rank below v (earliest arrival; ties by batch position)

s(c) = leaf_hi[c] - leaf_lo[c] is the number of requests in subtree c, and the subtree bid sum
F(c) = Σ_{r below c} b_r is a difference of prefix sums over ``lex_order`` (``subtree_sums``).

Build: prompts are sorted as big-endian byte strings (byte order = token order), adjacent prompts
give their longest common prefix with one vectorised comparison, and a stack over the sorted prompts
builds the compressed trie (as a suffix tree is built from a suffix array and its LCP array). Python
does O(n) work; token work is vectorised: O(M) for the LCPs and the byte images, and the sort's
comparisons are ``memcmp`` calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from auction.request import Request, TokenIds, check_batch

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class RadixTree:
    """Radix tree of a batch's prompts; see the module docstring for the meaning of each array."""

    requests: tuple[Request, ...]
    parent: IntArray
    depth: IntArray
    leaf_lo: IntArray
    leaf_hi: IntArray
    request: IntArray
    subtree_end: IntArray
    first_rank: IntArray
    lex_order: IntArray
    leaf_of: IntArray  # leaf_of[r] = node of request r
    users: IntArray  # users[r] = index into user_names
    user_names: tuple[str, ...]

    @property
    def n(self) -> int:
        """Number of requests in the batch."""
        return len(self.requests)

    @property
    def num_nodes(self) -> int:
        return int(self.parent.shape[0])

    @property
    def total_tokens(self) -> int:
        """M: total prompt tokens over all requests."""
        return sum(len(r) for r in self.requests)

    @property
    def tree_tokens(self) -> int:
        """Tokens stored in the tree (each shared prefix once)."""
        return int((self.depth[1:] - self.depth[self.parent[1:]]).sum())

    @cached_property
    def size(self) -> IntArray:
        """s(c): number of requests in each node's subtree."""
        return self.leaf_hi - self.leaf_lo

    @cached_property
    def children_ptr(self) -> IntArray:
        """CSR offsets: children of u are ``children[children_ptr[u]:children_ptr[u+1]]``."""
        counts = np.bincount(self.parent[1:], minlength=self.num_nodes)
        return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)

    @cached_property
    def children(self) -> IntArray:
        """Children of every node, grouped by parent, each group in lexicographic order."""
        return (np.argsort(self.parent[1:], kind="stable") + 1).astype(np.int64)

    def children_of(self, u: int) -> IntArray:
        return self.children[self.children_ptr[u] : self.children_ptr[u + 1]]

    def edge_tokens(self, v: int) -> TokenIds:
        """The tokens on the edge into node v (empty for the root and zero-length leaves)."""
        if v == 0:
            return np.empty(0, dtype=np.uint32)
        source = self.requests[int(self.lex_order[self.leaf_lo[v]])].token_array
        return source[self.depth[self.parent[v]] : self.depth[v]]

    def subtree_sums(self, per_request: npt.ArrayLike) -> FloatArray:
        """Σ of a per-request quantity (batch order) over each node's subtree: F(c) for bids."""
        values = np.asarray(per_request, dtype=np.float64)
        # Extended precision: F(c) of a small subtree is a difference of two large prefix sums.
        prefix = np.concatenate(([0.0], np.cumsum(values[self.lex_order], dtype=np.longdouble)))
        sums = np.asarray(prefix[self.leaf_hi] - prefix[self.leaf_lo], dtype=np.float64)
        leaves = self.leaf_of
        sums[leaves] = values  # a leaf's own value, exactly
        return sums


def build_radix_tree(requests: Iterable[Request]) -> RadixTree:
    """Build the radix tree of a batch; raises ``ValueError`` on duplicate request ids.

    Node 0 is the root. Two prompts ``[1, 2, 3]`` and ``[1, 2, 4]`` share the edge ``[1, 2]``:

    >>> from auction.request import Request
    >>> t = build_radix_tree([Request("a", "u", [1, 2, 3], 1.0), Request("b", "u", [1, 2, 4], 2.0)])
    >>> t.num_nodes, [int(x) for x in t.edge_tokens(1)], t.size.tolist()
    (4, [1, 2], [2, 2, 1, 1])
    """
    batch = check_batch(requests)
    arrays = [r.token_array for r in batch]
    images = [a.astype(">u4").tobytes() for a in arrays]  # memcmp order == token order
    lex = sorted(range(len(batch)), key=images.__getitem__)
    lcp = _adjacent_lcp([arrays[r] for r in lex])
    nodes = _stack_build([len(arrays[r]) for r in lex], lcp)
    return _finish(batch, np.asarray(lex, dtype=np.int64), nodes)


def lcp_length(a: TokenIds, b: TokenIds) -> int:
    """Length of the longest common prefix of two token arrays (one vectorised comparison)."""
    m = min(a.shape[0], b.shape[0])
    mismatch = np.flatnonzero(a[:m] != b[:m])
    return int(mismatch[0]) if mismatch.size else m


def _adjacent_lcp(sorted_arrays: Sequence[TokenIds]) -> list[int]:
    """lcp[k] = longest common prefix of prompts k-1 and k in sorted order (lcp[0] = 0)."""
    return [0] + [lcp_length(a, b) for a, b in itertools.pairwise(sorted_arrays)]


@dataclass
class _Nodes:
    parent: list[int]
    depth: list[int]
    lo: list[int]
    hi: list[int]
    request: list[int]  # lexicographic position of the request at a leaf, -1 if internal

    def add(self, parent: int, depth: int, lo: int, hi: int, request: int) -> int:
        self.parent.append(parent)
        self.depth.append(depth)
        self.lo.append(lo)
        self.hi.append(hi)
        self.request.append(request)
        return len(self.parent) - 1


def _stack_build(lengths: Sequence[int], lcp: Sequence[int]) -> _Nodes:
    """Compressed trie from sorted prompt lengths and adjacent LCPs, O(n).

    The stack holds the rightmost root-to-leaf path. A prompt first pops the nodes deeper than its
    LCP with the previous prompt, splits the edge it branches off (if it branches mid-edge), and
    hangs its own leaf there. A leaf that gains a child becomes internal and its request moves to a
    zero-length leaf, which keeps every request a leaf.
    """
    n = len(lengths)
    nodes = _Nodes(parent=[-1], depth=[0], lo=[0], hi=[n], request=[-1])
    stack = [0]
    for k in range(n):
        shared = lcp[k]
        last = -1
        while nodes.depth[stack[-1]] > shared:
            last = stack.pop()
            nodes.hi[last] = k
        top = stack[-1]
        if nodes.depth[top] < shared:
            split = nodes.add(top, shared, nodes.lo[last], -1, -1)
            nodes.parent[last] = split
            stack.append(split)
            top = split
        if nodes.request[top] >= 0:
            nodes.add(top, nodes.depth[top], nodes.lo[top], nodes.lo[top] + 1, nodes.request[top])
            nodes.request[top] = -1
        if lengths[k] > shared:
            stack.append(nodes.add(top, lengths[k], k, -1, k))
        else:  # a duplicate prompt: a zero-length leaf beside its twin
            nodes.add(top, shared, k, k + 1, k)
    for v in stack[1:]:
        nodes.hi[v] = n
    return nodes


def _finish(batch: tuple[Request, ...], lex: IntArray, nodes: _Nodes) -> RadixTree:
    n = len(batch)
    depth = np.asarray(nodes.depth, dtype=np.int64)
    lo = np.asarray(nodes.lo, dtype=np.int64)
    hi = np.asarray(nodes.hi, dtype=np.int64)
    lex_pos = np.asarray(nodes.request, dtype=np.int64)
    is_leaf = (lex_pos >= 0).astype(np.int64)
    # Pre-order: by first leaf, then ancestors (shallower, internal) before descendants.
    pre = np.lexsort((is_leaf, depth, lo))
    rank_of = np.empty_like(pre)
    rank_of[pre] = np.arange(pre.shape[0])
    old_parent = np.asarray(nodes.parent, dtype=np.int64)[pre]
    parent = np.where(old_parent >= 0, rank_of[np.maximum(old_parent, 0)], -1)
    lo, hi, depth, lex_pos = lo[pre], hi[pre], depth[pre], lex_pos[pre]
    request = np.full(lex_pos.shape[0], -1, dtype=np.int64)
    request[lex_pos >= 0] = lex[lex_pos[lex_pos >= 0]]

    leaf_of = np.empty(n, dtype=np.int64)
    leaves = np.flatnonzero(request >= 0)
    leaf_of[request[leaves]] = leaves
    # Pre-order lists subtrees contiguously and sorts nodes by leaf_lo: v's subtree ends at the
    # first node whose leaves start at or after leaf_hi[v].
    subtree_end = np.searchsorted(lo, hi, side="left").astype(np.int64)
    subtree_end = np.maximum(subtree_end, np.arange(lo.shape[0]) + 1)

    arrival_rank = np.empty(n, dtype=np.int64)
    arrivals = np.asarray([r.arrival for r in batch], dtype=np.int64)
    arrival_rank[np.lexsort((np.arange(n), arrivals))] = np.arange(n)
    first_rank = _range_min(arrival_rank[lex], lo, hi)

    user_names = tuple(dict.fromkeys(r.user for r in batch))
    user_index = {name: i for i, name in enumerate(user_names)}
    users = np.asarray([user_index[r.user] for r in batch], dtype=np.int64)
    return RadixTree(
        requests=batch,
        parent=parent.astype(np.int64),
        depth=depth,
        leaf_lo=lo,
        leaf_hi=hi,
        request=request.astype(np.int64),
        subtree_end=subtree_end,
        first_rank=first_rank,
        lex_order=lex,
        leaf_of=leaf_of,
        users=users,
        user_names=user_names,
    )


def _range_min(values: IntArray, lo: IntArray, hi: IntArray) -> IntArray:
    """min(values[lo:hi]) for every range (sparse table; empty ranges give a large sentinel)."""
    big = np.iinfo(np.int64).max
    if values.shape[0] == 0:
        return np.full(lo.shape[0], big, dtype=np.int64)
    table = [values]
    width = 1
    while 2 * width <= values.shape[0]:
        prev = table[-1]
        table.append(np.minimum(prev[:-width], prev[width:]))
        width *= 2
    length = np.maximum(hi - lo, 1)
    level = np.floor(np.log2(length)).astype(np.int64)
    out = np.empty(lo.shape[0], dtype=np.int64)
    for j, row in enumerate(table):
        at = np.flatnonzero(level == j)
        if at.size:
            out[at] = np.minimum(row[lo[at]], row[hi[at] - (1 << j)])
    out[hi <= lo] = big
    return out
