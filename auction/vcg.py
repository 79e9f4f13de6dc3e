"""VCG payments over the DFS orders of the radix tree, in O(M log ν) (docs/design.md §1).

Clarke pivot: with user i's bids set to zero (its requests stay in the batch),

    p_i = max_{σ∈D(T)} W_{−i}(σ) − W_{−i}(σ*),

where W_{−i} is the others' welfare and σ* the chosen (``dfs-bid``) schedule. D(T) is a product of
per-node sibling orders and W = (1/(n−1))·Σ_u L_u, so the maximum splits by node:

    p_i = (1/(n−1))·Σ_u [L_u(π_u^{−i}; F^{−i}) − L_u(π_u*; F^{−i})],

F^{−i} = F minus i's bids and π_u^{−i} the order by F^{−i}/s. Only nodes where a child holds a bid
of i contribute. There the touched children t (new key k'_t = F^{−i}(t)/s(t) ≤ k_t) move later
among the untouched ones, whose relative order and pairwise terms do not change; so Δ_u only needs
the pairs that involve a touched child:

    untouched a before touched t: F(a)·s(t),   touched t before untouched b: F^{−i}(t)·s(b),
    touched t before touched t':  F^{−i}(t)·s(t').

Where t lands among the untouched comes from a binary search on the sorted sibling keys; sums over
the untouched before it come from prefix sums of s and F over π_u* minus the touched ones before it.
Everything is done for all users at once on arrays of (user, child) entries: the paths from each
bidding request to the root, O(M) entries, each costing O(log ν).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from auction.radix import FloatArray, IntArray, RadixTree
from auction.request import check_bid_array
from auction.schedulers import average_bids, sibling_order
from auction.segments import exclusive_run_cumsum, run_start_of

LongArray = npt.NDArray[np.longdouble]


def vcg_payments(tree: RadixTree, bids: npt.ArrayLike) -> dict[str, float]:
    """VCG (Clarke pivot) payment of every user in the batch for the ``dfs-bid`` schedule.

    ``bids`` has one entry per request, each finite and in [0, ``MAX_BID``] (``ValueError``
    naming the request otherwise); within that range every payment is finite and ≥ 0.

    Two users share a prefix; alice bids 4 on request a, bob bids 1 on b and 1 on c, where b and c
    share a longer prefix. ``dfs-bid`` serves a, b, c (a's average 4 beats the {b, c} subtree's 1),
    so W = (4·1 + 1·½ + 1·0) = 4.5. Without alice's bid the best order puts {b, c} first for bob's
    welfare 1·1 + 1·½ = 1.5 instead of the 0.5 he gets, so alice pays 1.0. Removing bob's bids
    changes nothing for alice, so bob pays 0:

    >>> from auction.radix import build_radix_tree
    >>> from auction.request import Request
    >>> batch = [Request("a", "alice", [7, 1], 4.0), Request("b", "bob", [7, 2, 5], 1.0),
    ...          Request("c", "bob", [7, 2, 6], 1.0)]
    >>> vcg_payments(build_radix_tree(batch), [4.0, 1.0, 1.0])
    {'alice': 1.0, 'bob': 0.0}
    """
    # Bounded bids (MAX_BID, auction/request.py) keep every sum finite: no inf or nan price.
    b = check_bid_array(bids, tree.requests)
    payments = np.zeros(len(tree.user_names), dtype=np.float64)
    if tree.n > 1 and np.any(b > 0):
        np.add.at(payments, *_pivot_terms(tree, b))
        payments /= tree.n - 1
    payments = np.maximum(payments, 0.0)  # Δ_u ≥ 0 exactly; rounding must not pay anyone back
    return {name: float(p) for name, p in zip(tree.user_names, payments, strict=True)}


def _bid_paths(tree: RadixTree, b: FloatArray) -> tuple[IntArray, IntArray, FloatArray]:
    """Entries (user, child c, F_i(c)) for every non-root node c holding a bid of user i."""
    bidders = np.flatnonzero(b > 0)
    node, user, amount = tree.leaf_of[bidders], tree.users[bidders], b[bidders]
    nodes, users, amounts = [], [], []
    while node.size:  # climb one level per pass; the root is never an entry
        nodes.append(node)
        users.append(user)
        amounts.append(amount)
        up = tree.parent[node]
        keep = up > 0
        node, user, amount = up[keep], user[keep], amount[keep]
    all_nodes, all_users = np.concatenate(nodes), np.concatenate(users)
    pair = all_users * tree.num_nodes + all_nodes
    unique_pair, slot = np.unique(pair, return_inverse=True)
    F_i = np.bincount(slot, weights=np.concatenate(amounts)).astype(np.float64)
    user_of, child_of = np.divmod(unique_pair, tree.num_nodes)
    return user_of.astype(np.int64), child_of.astype(np.int64), F_i


def _pivot_terms(tree: RadixTree, b: FloatArray) -> tuple[IntArray, FloatArray]:
    """(user, (n−1)·Δ_u) for every group of children of one node u touched by one user."""
    F = tree.subtree_sums(b)
    s = tree.size.astype(np.float64)
    key = average_bids(tree, b)
    kids = sibling_order(tree, key)  # π_u* for every u; an index into ``kids`` is a "slot"
    slot_of = np.empty(tree.num_nodes, dtype=np.int64)
    slot_of[kids] = np.arange(kids.size)
    siblings = tree.parent[kids]
    segment_start = run_start_of(siblings)  # per slot: first slot of its parent's children
    kids_F = _prefix(F[kids])  # kids_F[q] = Σ F over slots < q
    kids_s = _prefix(s[kids])

    user, child, F_i = _bid_paths(tree, b)
    u = tree.parent[child]
    slot = slot_of[child]
    # One group per (user, u), touched children in π_u* order within it.
    by_group = np.lexsort((slot, u, user))
    user, child, F_i = user[by_group], child[by_group], F_i[by_group]
    u, slot = u[by_group], slot[by_group]
    group = user * tree.num_nodes + u
    group_start = run_start_of(group)
    start = segment_start[slot]
    s_t, F_t = s[child], F[child]
    F_new = np.maximum(F_t - F_i, 0.0)  # F^{−i}(t)
    k_new = F_new / s_t
    untouched_s = s[u] - np.bincount(group_start, weights=s_t, minlength=group.size)[group_start]
    entries_F, entries_s = _prefix(F_t), _prefix(s_t)

    def pairs_with_touched(untouched_F_before: FloatArray, untouched_s_before: FloatArray,
                           touched_order: IntArray) -> FloatArray:
        cross = untouched_F_before * s_t + F_new * (untouched_s - untouched_s_before)
        among = np.empty_like(F_new)
        among[touched_order] = s_t[touched_order] * exclusive_run_cumsum(
            F_new[touched_order], group[touched_order]
        )
        return cross + among

    here = np.arange(group.size)  # touched children before t in π_u*: the earlier group entries
    star = pairs_with_touched(
        _between(kids_F, slot, start) - _between(entries_F, here, group_start),
        _between(kids_s, slot, start) - _between(entries_s, here, group_start),
        here,
    )
    # Under π_u^{−i}, t goes after the q − start siblings whose key exceeds k'_t.
    q = _insertion_slots(tree, kids, key, u, k_new)
    code_span = kids.size + 1
    before_q = np.searchsorted(group * code_span + slot, group * code_span + q, side="left")
    best = pairs_with_touched(
        _between(kids_F, q, start) - _between(entries_F, before_q, group_start),
        _between(kids_s, q, start) - _between(entries_s, before_q, group_start),
        np.lexsort((-k_new, group)),
    )
    return user, best - star


def _prefix(values: FloatArray) -> LongArray:
    """out[q] = Σ values[:q], accumulated in extended precision: payments are small differences
    of large sums."""
    return np.concatenate(([0.0], np.cumsum(values, dtype=np.longdouble))).astype(np.longdouble)


def _between(prefix: LongArray, hi: IntArray, lo: IntArray) -> FloatArray:
    """Σ values[lo:hi] from a ``_prefix`` array."""
    return np.asarray(prefix[hi] - prefix[lo], dtype=np.float64)


def _insertion_slots(
    tree: RadixTree, kids: IntArray, key: FloatArray, u: IntArray, k_new: FloatArray
) -> IntArray:
    """Slot where a child of u with key k_new goes: after every sibling with a larger key.

    Keys become integer ranks, so one ``searchsorted`` over (parent, rank) codes serves all parents.
    """
    ranks = np.unique(np.concatenate((key[kids], k_new)), return_inverse=True)[1]
    top = int(ranks.max(initial=0)) + 1
    kid_rank, new_rank = ranks[: kids.size], ranks[kids.size :]
    sorted_code = tree.parent[kids] * (top + 1) + (top - kid_rank)
    query_code = u * (top + 1) + (top - new_rank)
    return np.searchsorted(sorted_code, query_code, side="left").astype(np.int64)
