from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from auction import Request, build_radix_tree
from tests.auction.strategies import batches


def _check_structure(batch: list[Request]) -> None:
    tree = build_radix_tree(batch)
    assert tree.n == len(batch)
    # Every request is exactly one leaf, and the root-to-leaf path spells its prompt.
    assert sorted(tree.request[tree.request >= 0].tolist()) == list(range(len(batch)))
    for r, req in enumerate(batch):
        v = int(tree.leaf_of[r])
        pieces = []
        while v != 0:
            pieces.append(tree.edge_tokens(v))
            v = int(tree.parent[v])
        spelled = np.concatenate(pieces[::-1]) if pieces else np.empty(0, dtype=np.uint32)
        assert spelled.tolist() == req.token_array.tolist()
    for v in range(1, tree.num_nodes):
        p = int(tree.parent[v])
        assert p < v  # pre-order
        if tree.request[v] < 0:
            # Internal nodes branch (or hold a zero-length leaf), and edges are non-empty.
            assert len(tree.children_of(v)) >= 2
            assert tree.depth[v] > tree.depth[p]
        assert tree.leaf_lo[p] <= tree.leaf_lo[v] < tree.leaf_hi[v] <= tree.leaf_hi[p]
        # The subtree is contiguous in pre-order.
        inside = [w for w in range(tree.num_nodes) if _is_ancestor(tree, v, w)]
        assert inside == list(range(v, int(tree.subtree_end[v])))
    # Siblings start with different tokens (a compressed trie), zero-length leaves aside.
    for u in range(tree.num_nodes):
        firsts = [int(tree.edge_tokens(int(c))[0]) for c in tree.children_of(u)
                  if len(tree.edge_tokens(int(c)))]
        assert len(firsts) == len(set(firsts))


def _is_ancestor(tree, a: int, w: int) -> bool:
    while w != -1:
        if w == a:
            return True
        w = int(tree.parent[w])
    return False


@given(batches(max_size=10))
@settings(max_examples=150, deadline=None)
def test_tree_spells_every_prompt(batch: list[Request]) -> None:
    _check_structure(batch)


def test_prefix_and_duplicate_prompts_become_zero_length_leaves() -> None:
    batch = [
        Request("short", "u", [1, 2], 1.0),
        Request("long", "u", [1, 2, 3], 1.0),
        Request("twin1", "u", [4, 5], 1.0),
        Request("twin2", "u", [4, 5], 1.0),
    ]
    tree = build_radix_tree(batch)
    _check_structure(batch)
    short, twin1, twin2 = (int(tree.leaf_of[i]) for i in (0, 2, 3))
    assert len(tree.edge_tokens(short)) == 0
    assert len(tree.edge_tokens(twin1)) == 0 and len(tree.edge_tokens(twin2)) == 0
    assert tree.parent[twin1] == tree.parent[twin2]
    assert tree.total_tokens == 9 and tree.tree_tokens == 5


def test_subtree_sums_and_sizes() -> None:
    batch = [Request("a", "u", [1, 2, 3], 1.0), Request("b", "u", [1, 2, 4], 2.0),
             Request("c", "v", [5], 4.0)]
    tree = build_radix_tree(batch)
    F = tree.subtree_sums([1.0, 2.0, 4.0])
    assert F[0] == 7.0 and tree.size[0] == 3
    shared = int(tree.parent[tree.leaf_of[0]])
    assert F[shared] == 3.0 and tree.size[shared] == 2


def test_empty_and_single_batches() -> None:
    empty = build_radix_tree([])
    assert empty.n == 0 and empty.num_nodes == 1
    one = build_radix_tree([Request("a", "u", [1], 0.5)])
    assert one.n == 1 and one.num_nodes == 2
