from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auction import (
    MAX_BID,
    Request,
    build_radix_tree,
    dfs_bid_order,
    vcg_payments,
    vcg_payments_naive,
)
from auction.welfare import user_values
from tests.auction.strategies import batches, chain, star, welfare_tol


def _assert_same_payments(batch: list[Request]) -> None:
    tree = build_radix_tree(batch)
    bids = np.array([r.bid for r in batch])
    fast = vcg_payments(tree, bids)
    naive = vcg_payments_naive(tree, bids)
    assert fast.keys() == naive.keys()
    scale = max(1.0, float(bids.sum()))
    for user in fast:
        assert math.isclose(fast[user], naive[user], rel_tol=1e-9, abs_tol=1e-12 * scale), (
            user, fast[user], naive[user])


@given(batches(max_size=14, max_users=5))
@settings(max_examples=300, deadline=None)
def test_fast_vcg_equals_naive_on_random_trees(batch: list[Request]) -> None:
    _assert_same_payments(batch)


@pytest.mark.parametrize("shape", [chain, star])
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_fast_vcg_equals_naive_on_chains_and_stars(shape, data) -> None:
    n = data.draw(st.integers(min_value=2, max_value=12))
    bids = data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 7.0]), min_size=n, max_size=n))
    users = data.draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
    _assert_same_payments(shape(n, bids, users))


def test_user_spanning_many_branches_of_a_deep_tree() -> None:
    rng = np.random.default_rng(7)
    batch = []
    for k in range(200):
        depth = int(rng.integers(1, 12))
        tokens = rng.integers(0, 3, size=depth).tolist()
        user = "whale" if k % 3 == 0 else f"u{k % 11}"
        batch.append(Request(f"r{k}", user, tokens, float(rng.pareto(1.5) + 1), int(k)))
    _assert_same_payments(batch)


@given(batches(min_size=0, max_size=12))
@settings(max_examples=150, deadline=None)
def test_payments_nonnegative_and_individually_rational(batch: list[Request]) -> None:
    tree = build_radix_tree(batch)
    bids = np.array([r.bid for r in batch])
    payments = vcg_payments(tree, bids)
    order = dfs_bid_order(tree, bids)
    x = _priorities(order, len(batch))
    for i, name in enumerate(tree.user_names):
        assert payments[name] >= 0.0
        value = float(np.sum(bids[tree.users == i] * x[tree.users == i]))
        assert value - payments[name] >= -welfare_tol(tree.n, bids)


def _priorities(order: np.ndarray, n: int) -> np.ndarray:
    x = np.ones(n)
    if n > 1:
        x[order] = (n - 1 - np.arange(n)) / (n - 1)
    return x


def test_degenerate_batches_pay_nothing() -> None:
    assert vcg_payments(build_radix_tree([]), np.zeros(0)) == {}
    one = build_radix_tree([Request("a", "u", [1, 2], 5.0)])
    assert vcg_payments(one, [5.0]) == {"u": 0.0}


def test_wrong_number_of_bids_is_refused() -> None:
    tree = build_radix_tree([Request("a", "u", [1], 1.0)])
    with pytest.raises(ValueError, match="expected 1 bids"):
        vcg_payments(tree, [1.0, 2.0])


# -- payments at the top of the bid range ----------------------------------------------------------

_top_bid = st.sampled_from([0.0, MAX_BID, MAX_BID * (1 - 2**-52), MAX_BID / 3])


@st.composite
def _batches_at_the_maximum(draw: st.DrawFn) -> list[Request]:
    """A random batch (tree, users, arrivals) whose bids are all 0 or near MAX_BID."""
    batch = draw(batches(min_size=1, max_size=12, max_users=4))
    return [Request(r.id, r.user, r.tokens, draw(_top_bid), r.arrival) for r in batch]


@given(_batches_at_the_maximum())
@settings(max_examples=150, deadline=None)
def test_payments_stay_finite_and_exact_at_the_maximum_bids(batch: list[Request]) -> None:
    tree = build_radix_tree(batch)
    bids = np.array([r.bid for r in batch])
    payments = vcg_payments(tree, bids)
    naive = vcg_payments_naive(tree, bids)
    x = _priorities(dfs_bid_order(tree, bids), len(batch))
    tol = welfare_tol(tree.n, bids)
    for i, name in enumerate(tree.user_names):
        assert math.isfinite(payments[name]) and payments[name] >= 0.0
        assert payments[name] == pytest.approx(naive[name], rel=0.0, abs=tol)
        value = float(np.sum(bids[tree.users == i] * x[tree.users == i]))
        assert payments[name] <= value + tol  # individually rational, up to rounding


@pytest.mark.parametrize("shape", ["random", "star", "chain"])
def test_payments_stay_finite_for_a_65536_request_batch_at_max_bid(shape: str) -> None:
    # The batch size MAX_BID's bound is argued for (auction/request.py): every sum stays below
    # n²·MAX_BID ≈ 4.3e18, so no payment or welfare figure overflows or turns NaN.
    n = 2**16
    rng = np.random.default_rng(11)
    if shape == "random":
        prompts = [rng.integers(0, 4, size=int(rng.integers(1, 12))) for _ in range(n)]
    elif shape == "star":
        prompts = [np.array([9, 9, k], dtype=np.int64) for k in range(n)]
    else:  # 1024 agent trajectories of 64 steps each: a deep tree (one chain of n has M ≈ n²/2)
        prompts = [np.arange((k % 64) + 1) + 10**6 * (k // 64) for k in range(n)]
    batch = [Request(f"r{k}", f"u{k % 5}", prompts[k], MAX_BID, k) for k in range(n)]
    tree = build_radix_tree(batch)
    bids = np.full(n, MAX_BID)
    payments = vcg_payments(tree, bids)
    values = user_values(dfs_bid_order(tree, bids), bids, tree.users)
    assert np.all(np.isfinite(values))
    for i, name in enumerate(tree.user_names):
        assert math.isfinite(payments[name]) and payments[name] >= 0.0
        own = float(bids[tree.users == i].sum())
        assert payments[name] <= values[i] * (1 + 1e-9) <= own * (1 + 1e-9)
