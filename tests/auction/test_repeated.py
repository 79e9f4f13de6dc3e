from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auction.pacing import alpha_of
from auction.radix import RadixTree, build_radix_tree
from auction.regret import (
    autobidder_regret,
    best_fixed_alpha,
    counterfactual_utilities,
    loglog_slope,
    priorities_matrix,
)
from auction.repeated import Batch, RepeatedResult, simulate, stationary_source
from auction.request import Request
from auction.schedulers import dfs_bid_order
from auction.welfare import priorities, welfare
from cluster.sim.workloads import make_workload, pareto_values
from tests.auction.strategies import batches

USERS = [f"user{i}" for i in range(5)]


@pytest.fixture(scope="module")
def trees() -> list[RadixTree]:
    return [
        build_radix_tree(make_workload(name, 24, users=len(USERS), seed=s).requests)
        for s, name in enumerate(["trees-short", "mixshare-50"])
    ]


def _run(trees: list[RadixTree], T: int = 60, seed: int = 1, **kw: float) -> RepeatedResult:
    source = stationary_source(trees, pareto_values)
    return simulate(source, T, {"user0": 0.6, "user1": 0.4}, users=USERS, seed=seed, **kw)


def test_simulation_records_are_consistent(trees: list[RadixTree]) -> None:
    r = _run(trees)
    T, U = r.T, len(r.users)
    assert r.users[:2] == ("user0", "user1") and set(r.users) == set(USERS)
    assert r.payments.shape == r.value_won.shape == (T, U)
    assert r.alpha.shape == r.alpha_capped.shape == r.mu.shape == (T, 2)
    assert len(r.batches) == len(r.bids) == T
    assert np.all(r.alpha_capped <= r.alpha + 1e-15)
    assert np.allclose(r.alpha, 1.0 / (1.0 + r.mu))
    for t, batch in enumerate(r.batches):
        order = dfs_bid_order(batch.tree, r.bids[t])
        assert r.welfare[t] == pytest.approx(welfare(order, batch.values))
        # Welfare under the true values is the users' true values won, summed.
        assert r.value_won[t].sum() == pytest.approx(r.welfare[t])
        truthful = [i for i, name in enumerate(batch.tree.user_names) if name not in r.pacing]
        for i in truthful:
            mine = batch.tree.users == i
            assert np.array_equal(r.bids[t][mine], batch.values[mine])
    # VCG is individually rational for truthful users: utility ≥ 0 in every batch.
    truthful_cols = [r.users.index(u) for u in USERS if u not in r.pacing]
    assert np.all(r.utilities[:, truthful_cols] >= -1e-9)


def test_pacing_users_stay_within_budget_every_batch(trees: list[RadixTree]) -> None:
    r = _run(trees, T=80)
    for j, user in enumerate(r.pacing):
        spent = np.cumsum(r.payments[:, r.users.index(user)])
        assert spent[-1] <= r.budgets[j] * (1 + 1e-12)
        before = np.concatenate(([0.0], spent[:-1]))
        assert np.all(r.payments[:, r.users.index(user)] <= r.budgets[j] - before + 1e-9)
        assert r.spend(user) == pytest.approx(spent[-1])
    # The budgets bind: the pacers shade their bids (α < 1) at some point.
    assert r.alpha.min() < 1.0


def test_simulation_is_deterministic_given_the_seed(trees: list[RadixTree]) -> None:
    a, b, c = _run(trees, seed=4), _run(trees, seed=4), _run(trees, seed=5)
    assert np.array_equal(a.payments, b.payments) and np.array_equal(a.alpha, b.alpha)
    assert not np.array_equal(a.payments, c.payments)


def test_bad_input_is_rejected(trees: list[RadixTree]) -> None:
    source = stationary_source(trees, pareto_values)
    with pytest.raises(ValueError, match="T must be"):
        simulate(source, 0, {"user0": 1.0})
    with pytest.raises(ValueError, match="gamma"):
        simulate(source, 10, {"user0": -1.0})
    with pytest.raises(ValueError, match="at least one tree"):
        stationary_source([], pareto_values)
    with pytest.raises(ValueError, match="values"):
        Batch(trees[0], np.ones(3))
    with pytest.raises(ValueError, match="not a pacing user"):
        autobidder_regret(_run(trees, T=5), "user4")


@given(batch=batches(min_size=0, max_size=12, max_users=3), data=st.data())
@settings(max_examples=150, deadline=None)
def test_priorities_matrix_equals_dfs_bid_row_by_row(
    batch: list[Request], data: st.DataObject
) -> None:
    tree = build_radix_tree(batch)
    rows = data.draw(st.integers(min_value=1, max_value=4))
    bid = st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(min_value=0.0, max_value=9.0))
    matrix = np.array(
        [data.draw(st.lists(bid, min_size=tree.n, max_size=tree.n)) for _ in range(rows)]
    ).reshape(rows, tree.n)
    x = priorities_matrix(tree, matrix)
    for k in range(rows):
        expected = priorities(dfs_bid_order(tree, matrix[k])) if tree.n > 1 else np.ones(tree.n)
        assert np.array_equal(x[k], expected)


def test_replaying_the_autobidders_own_alphas_reproduces_its_utility(
    trees: list[RadixTree],
) -> None:
    r = _run(trees, T=70)
    for j, user in enumerate(r.pacing):
        utility, spend = counterfactual_utilities(r, user, r.alpha[:, j][None, :])
        assert math.isclose(utility[0], r.total_utility(user), rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(spend[0], r.spend(user), rel_tol=1e-9, abs_tol=1e-9)


def test_fixed_alpha_counterfactual_equals_a_fixed_alpha_run(trees: list[RadixTree]) -> None:
    """Against truthful competitors, the replay of a fixed α is the run of a bidder with η = 0."""
    alpha = 0.45
    source = stationary_source(trees, pareto_values)
    fixed = simulate(source, 60, {"user2": 0.5}, users=USERS, seed=9, eta_scale=0.0,
                     mu0=1 / alpha - 1, mu_max=100.0)
    assert np.allclose(fixed.alpha, alpha)
    auto = simulate(source, 60, {"user2": 0.5}, users=USERS, seed=9)
    utility, spend = counterfactual_utilities(auto, "user2", [alpha, 1.0])
    assert math.isclose(utility[0], fixed.total_utility("user2"), rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(spend[0], fixed.spend("user2"), rel_tol=1e-9, abs_tol=1e-9)
    assert spend.max() <= auto.budgets[0] * (1 + 1e-12)


def test_best_fixed_alpha_dominates_every_candidate(trees: list[RadixTree]) -> None:
    r = _run(trees, T=50)
    best_alpha, best_u = best_fixed_alpha(r, "user0", grid=8, refine=1)
    grid = np.geomspace(alpha_of(100.0), 1.0, 8)
    utility, _ = counterfactual_utilities(r, "user0", grid)
    assert best_u >= utility.max() - 1e-9
    assert alpha_of(100.0) <= best_alpha <= 1.0
    g = autobidder_regret(r, "user0", grid=8, refine=1)
    assert g.regret == pytest.approx(g.best_utility - r.total_utility("user0"))
    assert g.best_utility >= best_u - 1e-9  # the regret also tries the autobidder's mean α
    assert g.budget == pytest.approx(0.6 * 50)


def test_loglog_slope() -> None:
    assert loglog_slope([100, 400, 1600, 6400], [5.0, 10.0, 20.0, 40.0]) == pytest.approx(0.5)
    assert loglog_slope([100, 400], [5.0, -1.0]) is None  # the autobidder won at T = 400
    assert loglog_slope([100], [5.0]) is None
    with pytest.raises(ValueError):
        loglog_slope([100, 400], [1.0])
