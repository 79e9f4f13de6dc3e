"""The cost formula and the tau-softmax, by hand and by their properties."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import (
    lowest_cost_index,
    prefill_blocks,
    routing_costs,
    sample_index,
    softmax_probabilities,
    uncached_tokens,
)
from router.cost import MAX_OMEGA, check_tau_omega


def test_cost_by_hand() -> None:
    # 100-token prompt, B = 16, worker holds 3 blocks: u = 100 - 48 = 52 tokens uncached.
    assert uncached_tokens(100, 3, 16) == 52
    # 12 prefill tokens already running: (12 + 52) / 16 = 4 prefill blocks.
    assert prefill_blocks(12, 52, 16) == 4.0
    # omega = 0.5, 7 active decode blocks: 0.5 * 4 + 7 = 9.
    assert routing_costs(100, [3, 0], [12, 0], [7, 1], 0.5, 16) == [9.0, 0.5 * 100 / 16 + 1]


@settings(max_examples=60)
@given(
    st.integers(1, 5000),
    st.lists(
        st.tuples(st.integers(0, 300), st.integers(0, 10**5), st.integers(0, 10**4)),
        min_size=1,
        max_size=16,
    ),
    st.floats(0, 10),
    st.sampled_from([1, 16, 64]),
)
def test_fused_costs_equal_the_formulas(
    n: int, rows: list[tuple[int, int, int]], omega: float, block: int
) -> None:
    overlaps = [min(o, n // block) for o, _, _ in rows]
    active = [a for _, a, _ in rows]
    decode = [d for _, _, d in rows]
    expected = [
        omega * prefill_blocks(a, uncached_tokens(n, o, block), block) + d
        for o, a, d in zip(overlaps, active, decode, strict=True)
    ]
    assert routing_costs(n, overlaps, active, decode, omega, block) == expected


def test_softmax_by_hand() -> None:
    # Costs 10, 12, 14 normalise to 0, 0.5, 1; with tau = 1 the weights are e^0, e^-0.5, e^-1.
    weights = [1.0, math.exp(-0.5), math.exp(-1.0)]
    total = sum(weights)
    assert softmax_probabilities([10, 12, 14], 1.0) == pytest.approx([w / total for w in weights])
    assert softmax_probabilities([3, 3, 3], 0.5) == [1 / 3] * 3


@settings(max_examples=60)
@given(
    st.lists(st.integers(0, 10**4), min_size=2, max_size=16),
    st.floats(1e-2, 1e3),
    st.integers(-(10**4), 10**4),
    st.sampled_from([0.25, 2.0, 1000.0]),
)
def test_softmax_ignores_shift_and_scale(
    costs: list[int], tau: float, shift: int, scale: float
) -> None:
    # Min-max normalisation: a common shift or positive scale of the costs changes nothing.
    base = softmax_probabilities(costs, tau)
    moved = softmax_probabilities([scale * c + shift for c in costs], tau)
    assert moved == pytest.approx(base, abs=1e-6)
    assert sum(base) == pytest.approx(1.0)
    lowest = min(range(len(costs)), key=costs.__getitem__)
    assert base[lowest] == pytest.approx(max(base))


def test_tau_to_infinity_tends_to_uniform() -> None:
    costs = [1.0, 5.0, 9.0, 40.0]
    gaps = [
        max(abs(p - 0.25) for p in softmax_probabilities(costs, tau)) for tau in (1, 10, 1e3, 1e6)
    ]
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] < 1e-6


def test_tau_to_zero_tends_to_argmin() -> None:
    probabilities = softmax_probabilities([4.0, 1.0, 9.0], 1e-4)
    assert probabilities[1] == pytest.approx(1.0)
    # The other two underflow to 0 and can never be drawn.
    assert [sample_index(probabilities, u) for u in (0.0, 0.5, 1 - 1e-16)] == [1, 1, 1]


def test_sample_index_walks_the_cumulative_sum() -> None:
    probabilities = [0.2, 0.0, 0.5, 0.3]
    assert [sample_index(probabilities, u) for u in (0.0, 0.1999, 0.2, 0.69, 0.7, 0.9999)] == [
        0,
        0,
        2,
        2,
        3,
        3,
    ]
    assert sample_index([0.5, 0.5 - 1e-12, 0.0], 0.9999999999999) == 1  # rounding slack


def test_lowest_cost_index_breaks_ties_by_key() -> None:
    assert lowest_cost_index([3.0, 1.0, 2.0], lambda i: (0, i)) == 1
    sizes = [5, 9, 2, 2]
    assert lowest_cost_index([1.0, 1.0, 1.0, 1.0], lambda i: (sizes[i], i)) == 2


@pytest.mark.parametrize(
    "tau, omega", [(-1, 1), (1, -0.1), (math.inf, 1), (math.nan, 1), (1, True), ("1", 1)]
)
def test_bad_tau_or_omega(tau: object, omega: object) -> None:
    with pytest.raises(ValueError):
        check_tau_omega(tau, omega)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        softmax_probabilities([1.0, 2.0], 0.0)


def test_a_tiny_tau_gives_the_argmin_not_nan() -> None:
    # (hi − lo)·tau = 1e-310 made the scale 1/1e-310 = inf, and (lo − lo)·inf = NaN.
    assert softmax_probabilities([1.0, 2.0], 1e-310) == [1.0, 0.0]
    assert softmax_probabilities([3.0, 1.0, 3.0], 5e-324) == [0.0, 1.0, 0.0]


@settings(max_examples=200)
@given(
    st.lists(st.floats(-1e300, 1e300, allow_nan=False), min_size=1, max_size=16),
    st.floats(min_value=0.0, max_value=1e300, exclude_min=True),  # subnormal taus included
)
def test_softmax_is_a_distribution_for_any_finite_costs_and_tau(
    costs: list[float], tau: float
) -> None:
    probabilities = softmax_probabilities(costs, tau)
    assert all(0.0 <= p <= 1.0 for p in probabilities)
    assert math.fsum(probabilities) == pytest.approx(1.0)
    cheapest = min(range(len(costs)), key=costs.__getitem__)
    assert probabilities[cheapest] == max(probabilities)


@pytest.mark.parametrize(
    ("costs", "tau", "message"),
    [
        ([1.0, math.nan], 1.0, "costs must be finite"),
        ([1.0, math.inf], 1.0, "costs must be finite"),
        ([1.0, 10**400], 1.0, "costs must be finite"),
        (["a", 1.0], 1.0, "costs must be finite numbers"),
        ([], 1.0, "at least one cost"),
        ([-1e308, 1e308], 1.0, "costs span more than float64"),
        ([1.0, 2.0], math.nan, "tau must be finite"),
        ([1.0, 2.0], [1], "tau must be a number"),
    ],
)
def test_softmax_refuses_what_it_cannot_normalise(costs: list[Any], tau: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        softmax_probabilities(costs, tau)


@pytest.mark.parametrize("u", [math.nan, -0.1, 1.0, math.inf])
def test_sample_index_refuses_a_draw_outside_the_unit_interval(u: float) -> None:
    with pytest.raises(ValueError, match="u must be a uniform draw"):
        sample_index([0.5, 0.5], u)


def test_omega_is_bounded_by_max_omega() -> None:
    check_tau_omega(0.0, MAX_OMEGA)
    with pytest.raises(ValueError, match="omega must be <= MAX_OMEGA"):
        check_tau_omega(0.0, MAX_OMEGA * 1.5)
    # At the bound, any realistic load still prices every worker with a finite cost.
    costs = routing_costs(10**6, [0, 10], [10**9, 0], [10**6, 0], MAX_OMEGA, 16)
    assert all(math.isfinite(c) for c in costs)
    assert all(math.isfinite(p) for p in softmax_probabilities(costs, 0.5))
