from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auction.pacing import DEFAULT_ETA_SCALE, PacingBidder, capped_alpha, default_eta, settle
from auction.radix import build_radix_tree
from auction.request import Request
from auction.schedulers import dfs_bid_order
from auction.vcg import vcg_payments
from auction.welfare import priorities
from tests.auction.strategies import batches, welfare_tol


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 0.0, "T": 10}, "gamma"),
        ({"gamma": -1.0, "T": 10}, "gamma"),
        ({"gamma": math.nan, "T": 10}, "gamma"),
        ({"gamma": 1.0, "T": 0}, "T must be"),
        ({"gamma": 1.0, "T": True}, "T must be"),
        ({"gamma": 1.0, "T": 2.5}, "T must be"),
        ({"gamma": 1.0, "T": 10, "mu_max": -1.0}, "mu_max"),
        ({"gamma": 1.0, "T": 10, "mu0": 5.0, "mu_max": 1.0}, "mu0"),
        ({"gamma": 1.0, "T": 10, "eta": -0.1}, "eta"),
        ({"gamma": 1.0, "T": 10, "eta_scale": math.inf}, "eta_scale"),
    ],
)
def test_bad_parameters_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PacingBidder(**kwargs)  # type: ignore[arg-type]


def test_budget_alpha_and_default_step() -> None:
    bidder = PacingBidder(gamma=2.0, T=100)
    assert bidder.budget == 200.0
    assert bidder.alpha == 1.0 and bidder.mu == 0.0
    assert bidder.eta == pytest.approx(DEFAULT_ETA_SCALE / (2.0 * 10.0))  # η = scale/(γ√T)
    # η ∝ 1/√T: four times the horizon, half the step.
    assert PacingBidder(gamma=2.0, T=400).eta == pytest.approx(bidder.eta / 2)
    assert default_eta(2.0, 100, eta_scale=3.0) == pytest.approx(3.0 / 20.0)
    assert PacingBidder(gamma=2.0, T=100, eta=0.3).eta == 0.3


def test_dual_update_follows_the_rule_and_clips() -> None:
    gamma, eta, mu_max = 1.0, 0.5, 2.0
    bidder = PacingBidder(gamma, T=1000, eta=eta, mu_max=mu_max)
    mu = 0.0
    for p in [3.0, 0.0, 0.0, 0.0, 10.0, 10.0, 0.2]:
        bidder.bids([1.0])
        step = bidder.pay(p)
        expected = min(max(mu + eta * (p - gamma), 0.0), mu_max)
        assert step.mu_before == mu and step.mu_after == pytest.approx(expected)
        assert bidder.alpha == pytest.approx(1.0 / (1.0 + expected))
        mu = expected
    assert bidder.t == 7
    assert bidder.spent == pytest.approx(3.0 + 10.0 + 10.0 + 0.2)


def test_overspending_lowers_alpha_and_underspending_raises_it() -> None:
    bidder = PacingBidder(1.0, T=100, mu0=1.0, mu_max=10.0)
    before = bidder.alpha
    bidder.pay(5.0)
    assert bidder.alpha < before
    before = bidder.alpha
    bidder.pay(0.0)
    assert bidder.alpha > before


def test_bids_are_capped_by_the_remaining_budget() -> None:
    bidder = PacingBidder(gamma=1.0, T=3)  # B = 3
    assert bidder.bids([1.0, 1.0]).tolist() == [1.0, 1.0]
    bidder.pay(2.5)
    capped = bidder.bids([1.0, 3.0])
    assert capped.sum() == pytest.approx(0.5)
    assert capped[1] / capped[0] == pytest.approx(3.0)  # scaled, not truncated: the ranking stays
    bidder.pay(0.5)
    assert bidder.remaining == 0.0
    assert bidder.bids([5.0, 7.0]).tolist() == [0.0, 0.0]


def test_payment_above_the_remaining_budget_is_an_error_not_an_overdraft() -> None:
    bidder = PacingBidder(gamma=1.0, T=2)
    with pytest.raises(ValueError, match="exceeds the remaining budget"):
        bidder.pay(2.5)
    with pytest.raises(ValueError, match=">= 0"):
        bidder.pay(-1.0)
    bidder.pay(2.0 + 1e-12)  # rounding of a capped VCG price: settled at the cap
    assert bidder.spent == 2.0 and bidder.remaining == 0.0


def test_capped_alpha_and_settle() -> None:
    assert capped_alpha(0.8, 10.0, 100.0) == 0.8
    assert capped_alpha(0.8, 10.0, 4.0) == pytest.approx(0.4)
    assert capped_alpha(0.8, 10.0, 0.0) == 0.0
    assert capped_alpha(0.8, 0.0, 0.0) == 0.8  # nothing to bid on: nothing to cap
    assert settle(1.0, 2.0, 2.0) == 1.0
    with pytest.raises(ValueError):
        settle(math.nan, 2.0, 2.0)


def test_fixed_alpha_bidder_never_moves() -> None:
    bidder = PacingBidder.fixed(0.25, gamma=1.0, T=10)
    for p in [0.0, 3.0, 0.5]:
        bidder.pay(p)
        assert bidder.alpha == pytest.approx(0.25)
    with pytest.raises(ValueError):
        PacingBidder.fixed(0.0, gamma=1.0, T=10)


def test_bidder_is_deterministic_given_its_payments() -> None:
    a, b = PacingBidder(0.7, T=50), PacingBidder(0.7, T=50)
    rng = np.random.default_rng(3)
    for _ in range(30):
        values = rng.pareto(1.5, size=4) + 1
        assert np.array_equal(a.bids(values), b.bids(values))
        p = float(min(rng.uniform(0, 2), a.remaining))
        assert a.pay(p) == b.pay(p)
    assert repr(a) == repr(b)


@given(batch=batches(min_size=1, max_size=12, max_users=4))
@settings(max_examples=150, deadline=None)
def test_vcg_payment_never_exceeds_the_users_total_bid(batch: list[Request]) -> None:
    """The lemma behind the cap: p_i ≤ V_i(σ*) ≤ Σ_{r∈R_i} b_r."""
    tree = build_radix_tree(batch)
    bids = np.array([r.bid for r in batch])
    payments = vcg_payments(tree, bids)
    x = priorities(dfs_bid_order(tree, bids)) if tree.n > 1 else np.zeros(tree.n)
    for i, user in enumerate(tree.user_names):
        mine = tree.users == i
        reported_value = float(bids[mine] @ x[mine])
        tolerance = welfare_tol(tree.n, bids)
        assert payments[user] <= reported_value + tolerance
        assert reported_value <= float(bids[mine].sum()) + tolerance


@given(batch=batches(min_size=2, max_size=12, max_users=3), data=st.data())
@settings(max_examples=60, deadline=None)
def test_pacing_user_never_pays_more_than_its_remaining_budget(
    batch: list[Request], data: st.DataObject
) -> None:
    tree = build_radix_tree(batch)
    user = tree.user_names[0]
    mine = np.flatnonzero(tree.users == 0)
    T = data.draw(st.integers(min_value=1, max_value=12))
    gamma = data.draw(st.floats(min_value=0.01, max_value=5.0))
    bidder = PacingBidder(gamma, T)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    for _ in range(T + 3):  # a few batches past the horizon: the budget still holds
        values = 1.0 + rng.pareto(1.5, size=tree.n)
        bids = values.copy()
        bids[mine] = bidder.bids(values[mine])
        assert bids[mine].sum() <= bidder.remaining * (1 + 1e-12)
        price = vcg_payments(tree, bids)[user]
        remaining = bidder.remaining
        assert price <= remaining + 1e-9 * max(1.0, bidder.budget)
        step = bidder.pay(price)
        assert step.payment <= remaining
    assert bidder.spent <= bidder.budget * (1 + 1e-12)
