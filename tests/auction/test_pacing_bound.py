from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auction.pacing_bound import (
    optimal_local_welfare,
    pacing_kappa,
    pacing_welfare_bound,
    subtree_pacing,
)
from auction.radix import build_radix_tree
from auction.request import MAX_BID, Request
from auction.schedulers import dfs_bid_order
from auction.welfare import welfare
from tests.auction.strategies import EPS, batches, welfare_tol

_SMALLEST_ALPHA = 1e-6
# The range auction/pacing_bound.py promises: values in [0, MAX_BID], positive ones (and the bids
# α·v made from them) normal floats. 1e-300·α stays above float64's smallest normal (2.2e-308)
# for every α ≥ 1e-6 drawn below, so no bid is subnormal.
_SMALLEST_VALUE = 1e-300
_value = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, MAX_BID]),  # ties, and the top of the range
    st.floats(min_value=_SMALLEST_VALUE, max_value=MAX_BID, allow_subnormal=False),
)
_alpha = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0]), st.floats(min_value=_SMALLEST_ALPHA, max_value=1.0)
)


def _realised(tree, values, bids) -> float:  # type: ignore[no-untyped-def]
    return welfare(dfs_bid_order(tree, bids), values)


def kappa_rtol(n: int) -> float:
    """κ = α(a)/α(b), each α(c) a ratio of two sums of at most n non-negative terms, each sum
    within (n − 1)·ε/2 of exact relative to itself: κ is within about 4·n·ε of its exact value."""
    return 4 * max(n, 1) * EPS


@given(batch=batches(min_size=1, max_size=12, max_users=4), data=st.data())
@settings(max_examples=200, deadline=None)
def test_realised_welfare_is_at_least_the_bound_per_user_pacing(
    batch: list[Request], data: st.DataObject
) -> None:
    tree = build_radix_tree(batch)
    values = np.array(data.draw(st.lists(_value, min_size=tree.n, max_size=tree.n)))
    alpha_of_user = np.array(
        data.draw(st.lists(_alpha, min_size=len(tree.user_names), max_size=len(tree.user_names)))
    )
    bids = alpha_of_user[tree.users] * values
    bound = pacing_welfare_bound(tree, values, bids)
    tol = welfare_tol(tree.n, values)
    assert _realised(tree, values, bids) >= bound - tol
    # κ ≥ 1, so the bound never exceeds the best DFS welfare under the values.
    assert bound <= _realised(tree, values, values) + tol


@given(batch=batches(min_size=1, max_size=12, max_users=4), data=st.data())
@settings(max_examples=150, deadline=None)
def test_realised_welfare_is_at_least_the_bound_per_request_pacing(
    batch: list[Request], data: st.DataObject
) -> None:
    tree = build_radix_tree(batch)
    values = np.array(data.draw(st.lists(_value, min_size=tree.n, max_size=tree.n)))
    alphas = np.array(data.draw(st.lists(_alpha, min_size=tree.n, max_size=tree.n)))
    bids = alphas * values
    bound = pacing_welfare_bound(tree, values, bids)
    assert _realised(tree, values, bids) >= bound - welfare_tol(tree.n, values)


@given(batch=batches(min_size=1, max_size=12, max_users=4), data=st.data())
@settings(max_examples=150, deadline=None)
def test_no_loss_when_every_alpha_is_equal(batch: list[Request], data: st.DataObject) -> None:
    tree = build_radix_tree(batch)
    values = np.array(data.draw(st.lists(_value, min_size=tree.n, max_size=tree.n)))
    alpha = data.draw(st.floats(min_value=0.01, max_value=1.0))
    bids = alpha * values
    best = _realised(tree, values, values)
    bound = pacing_welfare_bound(tree, values, bids)
    kappa = pacing_kappa(tree, values, bids)
    assert np.allclose(kappa, 1.0, rtol=kappa_rtol(tree.n), atol=0.0)
    tol = welfare_tol(tree.n, values)
    assert math.isclose(bound, best, rel_tol=0.0, abs_tol=tol)
    assert math.isclose(_realised(tree, values, bids), best, rel_tol=0.0, abs_tol=tol)


def test_a_common_alpha_gives_kappa_one_across_the_whole_value_range() -> None:
    # Regression (seeds 19, 21, 37 of the random profile): a small subtree beside a large one.
    # The subtree {[7, 1, 1], [7, 1, 2]} comes after [7, 0] in lexicographic order, so a prefix-
    # sum difference gives its sum as (1e9 + 2e-3) − 1e9, off by ~1e-8 relative; summing its own
    # two terms is exact to an ulp.
    batch = [
        Request("big", "u", [7, 0], 1.0),
        Request("small-1", "v", [7, 1, 1], 1.0),
        Request("small-2", "w", [7, 1, 2], 1.0),
    ]
    tree = build_radix_tree(batch)
    for values in ([MAX_BID, 1e-3, 1e-3], [1.0, 0.0, 2.220446049250313e-16], [1e9, 1e-300, 0.5]):
        for alpha in (0.5, 0.697, 0.01171875):
            v = np.array(values)
            kappa = pacing_kappa(tree, v, alpha * v)
            assert np.allclose(kappa, 1.0, rtol=kappa_rtol(tree.n), atol=0.0), (values, alpha)
            assert pacing_welfare_bound(tree, v, alpha * v) == pytest.approx(
                _realised(tree, v, v), rel=0.0, abs=welfare_tol(tree.n, v)
            )


def _fork(values: list[float]) -> tuple[object, np.ndarray]:
    """One stem with a leaf per value: every request a child of the same node."""
    batch = [Request(f"r{k}", f"u{k}", [7, 7, k + 1], 1.0, k) for k in range(len(values))]
    return build_radix_tree(batch), np.array(values)


def test_kappa_is_the_spread_of_value_weighted_pacing() -> None:
    tree, values = _fork([4.0, 2.0, 1.0])
    bids = np.array([1.0, 2.0, 0.5])  # α = ¼, 1, ½
    alpha = subtree_pacing(tree, values, bids)
    stem = int(tree.parent[tree.leaf_of[0]])
    assert pacing_kappa(tree, values, bids)[stem] == pytest.approx(4.0)
    assert alpha[tree.leaf_of].tolist() == [0.25, 1.0, 0.5]
    # The stem's children in value order 4, 2, 1, all of size 1: L* = 4 + 4 + 2 = 10.
    assert optimal_local_welfare(tree, values)[stem] == pytest.approx(10.0)
    assert pacing_welfare_bound(tree, values, bids) == pytest.approx(10.0 / 4 / 2)


def test_worthless_children_without_bids_are_left_out_of_kappa() -> None:
    tree, values = _fork([4.0, 2.0, 0.0])
    bids = np.array([4.0, 2.0, 0.0])
    stem = int(tree.parent[tree.leaf_of[0]])
    assert np.isnan(subtree_pacing(tree, values, bids)[tree.leaf_of[2]])
    assert pacing_kappa(tree, values, bids)[stem] == 1.0
    assert pacing_welfare_bound(tree, values, bids) == pytest.approx(_realised(tree, values, bids))


def test_a_worthless_child_that_bids_or_a_valued_child_that_does_not_voids_the_node() -> None:
    tree, values = _fork([4.0, 2.0, 0.0])
    stem = int(tree.parent[tree.leaf_of[0]])
    jumper = np.array([4.0, 2.0, 9.0])  # α = ∞ on the worthless leaf: it is served first
    assert pacing_kappa(tree, values, jumper)[stem] == math.inf
    assert _realised(tree, values, jumper) < _realised(tree, values, values)
    assert pacing_welfare_bound(tree, values, jumper) == 0.0
    silent = np.array([0.0, 2.0, 0.0])  # α = 0 on the most valuable leaf: it ties at key 0
    assert pacing_kappa(tree, values, silent)[stem] == math.inf
    assert _realised(tree, values, silent) >= pacing_welfare_bound(tree, values, silent) == 0.0


def test_an_only_child_has_kappa_one() -> None:
    tree = build_radix_tree([Request("a", "u", [1, 2, 3], 1.0)])
    assert np.all(pacing_kappa(tree, [3.0], [0.0]) == 1.0)
    assert pacing_welfare_bound(tree, [3.0], [0.0]) == 0.0  # n = 1: no order to value


@pytest.mark.parametrize(
    ("values", "bids", "message"),
    [
        ([1.0], [1.0, 1.0], "expected 2 values"),
        ([1.0, 1.0], [1.0], "expected 2 bids"),
        ([-1.0, 1.0], [1.0, 1.0], "values must be finite"),
        ([1.0, 1.0], [math.nan, 1.0], "bids must be finite"),
        ([1.0, 1.0], [1.0, math.inf], "bids must be finite"),
        ([1.0, 2 * MAX_BID], [1.0, 1.0], r"values must be finite and in \[0, MAX_BID.*'r1'"),
        ([1.0, 1.0], [1e308, 1.0], r"bids must be finite and in \[0, MAX_BID.*'r0'"),
    ],
)
def test_bad_input_is_rejected(values: list[float], bids: list[float], message: str) -> None:
    tree, _ = _fork([1.0, 1.0])
    with pytest.raises(ValueError, match=message):
        pacing_welfare_bound(tree, values, bids)  # type: ignore[arg-type]
