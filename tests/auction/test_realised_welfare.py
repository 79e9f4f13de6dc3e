"""Realised welfare (docs/design.md §8): the welfare formula on the TTFT ranking."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auction import (
    SCHEDULERS,
    Request,
    average_ranks,
    build_radix_tree,
    realised_welfare,
    realised_welfare_pct_above_half,
    welfare,
    welfare_pct_above_half,
)
from tests.auction.strategies import batches, welfare_tol


@given(batches(min_size=1, max_size=14), st.integers(0, 2**32 - 1))
@settings(max_examples=150, deadline=None)
def test_equals_the_planned_welfare_when_ttft_follows_the_plan(
    batch: list[Request], seed: int
) -> None:
    tree = build_radix_tree(batch)
    bids = np.array([r.bid for r in batch])
    rng = np.random.default_rng(seed)
    for name, scheduler in SCHEDULERS.items():
        order = scheduler.order(tree, bids, seed=seed)
        # Any strictly increasing times along the order: served k-th, answered at t_k.
        times = np.cumsum(rng.uniform(0.001, 5.0, size=tree.n))
        ttft = np.empty(tree.n)
        ttft[order] = times
        planned = welfare(order, bids)
        assert math.isclose(
            realised_welfare(bids, ttft), planned, abs_tol=welfare_tol(tree.n, bids)
        ), name


@given(
    st.lists(st.floats(0.0, 100.0), min_size=2, max_size=30),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=150, deadline=None)
def test_invariant_to_a_monotone_transform_of_ttft(bids: list[float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Few distinct values, so ties are common and must survive the transform too.
    ttft = rng.integers(0, 6, size=len(bids)).astype(np.float64) * 0.25
    base = realised_welfare(bids, ttft)
    for transform in (lambda t: 3.0 * t + 7.0, np.exp, lambda t: np.log1p(t) ** 3, np.sqrt):
        assert realised_welfare(bids, transform(ttft)) == pytest.approx(base, rel=1e-12, abs=1e-9)


def test_ties_share_the_average_rank() -> None:
    assert average_ranks([2.0, 1.0, 2.0, 2.0, 0.5]).tolist() == [3.0, 1.0, 3.0, 3.0, 0.0]
    # All answered at once: every x_r = ½, so W = ½Σb exactly (0% above a random order).
    bids = [5.0, 1.0, 2.0, 0.0]
    assert realised_welfare(bids, [1.0] * 4) == pytest.approx(4.0)
    assert realised_welfare_pct_above_half(bids, [1.0] * 4) == pytest.approx(0.0)
    # Requests 1 and 2 tie for the last two places: x = ½·(1/3 + 0) each.
    got = realised_welfare([6.0, 3.0, 3.0, 0.0], [0.1, 0.9, 0.9, 0.2])
    assert got == pytest.approx(6.0 * 1 + 3.0 * (1 / 6) * 2 + 0.0 * (2 / 3))


@given(st.lists(st.floats(0.0, 100.0), min_size=2, max_size=30), st.integers(0, 2**32 - 1))
@settings(max_examples=100, deadline=None)
def test_a_tie_is_the_mean_over_its_orders(bids: list[float], seed: int) -> None:
    """A tie between two requests counts as the average of serving either first."""
    rng = np.random.default_rng(seed)
    n = len(bids)
    ttft = rng.permutation(n).astype(np.float64)
    a, b = rng.choice(n, size=2, replace=False)
    tied = ttft.copy()
    tied[b] = tied[a]
    first, second = ttft.copy(), ttft.copy()
    first[b] = tied[a] + 0.5  # b just after a
    second[b] = tied[a] - 0.5  # b just before a
    mean = 0.5 * (realised_welfare(bids, first) + realised_welfare(bids, second))
    assert realised_welfare(bids, tied) == pytest.approx(mean, rel=1e-12, abs=1e-9)


def test_pct_matches_the_planned_report() -> None:
    bids = [3.0, 1.0, 2.0]
    assert realised_welfare_pct_above_half(bids, [0.1, 0.9, 0.5]) == pytest.approx(
        welfare_pct_above_half(welfare([0, 2, 1], bids), bids)
    )


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="one TTFT per bid"):
        realised_welfare([1.0, 2.0], [0.1])
    with pytest.raises(ValueError, match="finite"):
        realised_welfare([1.0, 2.0], [0.1, float("nan")])
    with pytest.raises(ValueError):
        realised_welfare([-1.0, 2.0], [0.1, 0.2])
    assert realised_welfare([4.0], [0.3]) == 0.0
