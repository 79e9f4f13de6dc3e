"""VCG over D(T): no user gains by misreporting, and truthful utility is never negative."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from auction import Request, build_radix_tree, dfs_bid_order, vcg_payments
from auction.request import MAX_BID
from auction.welfare import priorities
from tests.auction.strategies import batches, welfare_tol


def _utility(tree, true_values: np.ndarray, reported: np.ndarray, user: int) -> float:
    order = dfs_bid_order(tree, reported)
    x = priorities(order)
    mine = tree.users == user
    value = float(np.sum(true_values[mine] * x[mine])) if tree.n > 1 else 0.0
    return value - vcg_payments(tree, reported)[tree.user_names[user]]


def _misreports(values: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    out = [np.zeros_like(values), values[::-1].copy(), rng.permutation(values)]
    out += [values * f for f in (0.0, 0.3, 0.9, 1.1, 2.0, 10.0)]
    out += [rng.uniform(0, 2 * max(1.0, values.max()), size=values.shape) for _ in range(3)]
    return [np.minimum(lie, MAX_BID) for lie in out]  # a bid above MAX_BID is refused, not a lie


@given(batches(min_size=2, max_size=9, max_users=3), st.integers(min_value=0, max_value=2**16))
@settings(max_examples=120, deadline=None)
def test_no_misreport_beats_the_truth(batch: list[Request], seed: int) -> None:
    tree = build_radix_tree(batch)
    values = np.array([r.bid for r in batch])
    rng = np.random.default_rng(seed)
    for user in range(len(tree.user_names)):
        mine = tree.users == user
        truthful = _utility(tree, values, values, user)
        assert truthful >= -welfare_tol(tree.n, values)  # individual rationality
        for lie in _misreports(values[mine], rng):
            reported = values.copy()
            reported[mine] = lie
            tol = welfare_tol(tree.n, np.maximum(values, reported))
            assert _utility(tree, values, reported, user) <= truthful + tol
