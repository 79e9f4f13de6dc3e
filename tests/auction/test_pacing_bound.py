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
from auction.request import Request
from auction.schedulers import dfs_bid_order
from auction.welfare import welfare
from tests.auction.strategies import batches

_value = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0]),
    # Nothing near underflow: α·v must not round to a zero bid (an α of 0, not of α).
    st.floats(min_value=1e-100, max_value=50.0),
)
_alpha = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(min_value=1e-6, max_value=1.0))


def _realised(tree, values, bids) -> float:  # type: ignore[no-untyped-def]
    return welfare(dfs_bid_order(tree, bids), values)


def _scale(values: np.ndarray) -> float:
    return max(1.0, float(np.sum(values)))


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
    assert _realised(tree, values, bids) >= bound - 1e-9 * _scale(values)
    # κ ≥ 1, so the bound never exceeds the best DFS welfare under the values.
    assert bound <= _realised(tree, values, values) + 1e-9 * _scale(values)


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
    assert _realised(tree, values, bids) >= bound - 1e-9 * _scale(values)


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
    assert np.allclose(kappa, 1.0, rtol=1e-12)
    assert math.isclose(bound, best, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(_realised(tree, values, bids), best, rel_tol=1e-9, abs_tol=1e-12)


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
    ],
)
def test_bad_input_is_rejected(values: list[float], bids: list[float], message: str) -> None:
    tree, _ = _fork([1.0, 1.0])
    with pytest.raises(ValueError, match=message):
        pacing_welfare_bound(tree, values, bids)  # type: ignore[arg-type]
