"""The knee of a closed-loop sweep and the thresholds read at it (controller/knee.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.knee import THETA_RATIO, knee

SWEEP = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def _bounds(r0: float, x_max: float) -> list[float]:
    """Throughput on the asymptotic bounds: min(C/R₀, X_max)."""
    return [min(c / r0, x_max) for c in SWEEP]


@settings(max_examples=100, deadline=None)
@given(r0=st.floats(0.1, 10.0), x_max=st.floats(1.0, 100.0))
def test_the_knee_is_where_the_asymptotes_meet(r0: float, x_max: float) -> None:
    """On the bounds themselves N* = X_max·R₀ exactly, wherever the sweep reaches it."""
    n_star = x_max * r0
    ttft = [0.05 * (1 + c / n_star) ** 2 for c in SWEEP]  # any rising curve
    # The first point must lie before the knee and the last past it.
    if not 1 * (1 + 1e-9) < n_star < SWEEP[-1] * (1 - 1e-9):
        with pytest.raises(ValueError, match="does not reach the knee"):
            knee(SWEEP, _bounds(r0, x_max), ttft)
        return
    k = knee(SWEEP, _bounds(r0, x_max), ttft)
    assert k.concurrency == pytest.approx(n_star)
    assert (k.unloaded_request_s, k.max_throughput_rps) == pytest.approx((r0, x_max))
    assert k.thresholds.theta2 == pytest.approx(THETA_RATIO * k.thresholds.theta1)
    # θ2 lies on the sweep's TTFT curve between the points around N*.
    below = max(c for c in SWEEP if c <= n_star)
    above = min(c for c in SWEEP if c >= n_star)
    low, high = 0.05 * (1 + below / n_star) ** 2, 0.05 * (1 + above / n_star) ** 2
    assert low - 1e-12 <= k.thresholds.theta2 <= high + 1e-12


def test_thresholds_are_read_off_the_ttft_curve_in_log_log() -> None:
    """X_max 50 req/s, R₀ 2 s: N* = 100, between C = 64 and 128; the TTFT P99 doubles from
    0.2 s to 0.4 s there, so θ2 = 0.2·2^(log(100/64)/log 2)."""
    ttft = {64: 0.2, 128: 0.4}
    k = knee(
        SWEEP, _bounds(2.0, 50.0), [ttft.get(c, 0.1 if c < 64 else 1.0) for c in SWEEP]
    )
    assert k.concurrency == pytest.approx(100.0)
    assert k.thresholds.theta2 == pytest.approx(0.2 * 2 ** math.log2(100 / 64))
    assert k.thresholds.theta1 == pytest.approx(k.thresholds.theta2 / 3)


def test_points_in_any_order_and_bad_sweeps() -> None:
    x, ttft = _bounds(2.0, 50.0), [0.1 * c for c in SWEEP]
    assert knee(SWEEP[::-1], x[::-1], ttft[::-1]) == knee(SWEEP, x, ttft)
    with pytest.raises(ValueError, match="once"):
        knee([1, 1, 128], [0.5, 0.5, 50.0], [0.1, 0.1, 1.0])
    with pytest.raises(ValueError, match="two points"):
        knee([1], [0.5], [0.1])
    with pytest.raises(ValueError, match="one value per point"):
        knee([1, 2], [0.5, 1.0], [0.1, 0.2, 0.3])
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="throughput_rps"):
            knee([1, 128], [bad, 50.0], [0.1, 1.0])
