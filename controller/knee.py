"""Where a deployment's throughput bends: the knee of a closed-loop sweep, and thresholds there
(docs/design.md §4, "Thresholds per deployment").

Operational analysis (Denning and Buzen's asymptotic bounds): C clients in a closed loop get
X(C) ≤ min(C/R₀, X_max) requests/s, R₀ being one request's time with nobody else about, so
X(C₀)/C₀ = 1/R₀ at the sweep's smallest C₀. The two asymptotes meet at

    N* = X_max·R₀ = X_max·C₀ / X(C₀),

the concurrency below which the deployment is latency-bound and above which it is throughput-
bound: a client past N* adds only queueing. The detector's thresholds are then read off the same
sweep's TTFT P99 (interpolated linearly in log C and log TTFT):

    θ2 = TTFT P99 at N*        what the deployment shows when its clients just fill it
    θ1 = θ2 / 3                the ratio of the calm calibration (5× and 15× the calm P99)

Unlike multiples of the calm P99, this puts the knee where the deployment's own throughput
bends: a model whose prefill queue grows early (340B: its TTFT P99 is 15× the calm one at half
its throughput ceiling) is not called saturated there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.detector import Thresholds

__all__ = ["Knee", "knee"]

THETA_RATIO = 3.0  # θ2 / θ1, as Thresholds.calibrated's default multiples 15 / 5


@dataclass(frozen=True)
class Knee:
    """N* and the thresholds at it."""

    concurrency: float  # N*
    max_throughput_rps: float  # X_max
    unloaded_request_s: float  # R₀
    thresholds: Thresholds


def _positive(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(f"{name} needs at least two points")
    if not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise ValueError(f"{name} must be finite and > 0 at every point, got {values!r}")
    return array


def knee(
    concurrency: Sequence[float], throughput_rps: Sequence[float], ttft_p99_s: Sequence[float]
) -> Knee:
    """N* and θ1, θ2 from a closed-loop sweep (module docstring); the points in any order, each C
    once. ``ValueError`` when the sweep does not reach N* (nothing to read θ2 from)."""
    c = _positive("concurrency", concurrency)
    x = _positive("throughput_rps", throughput_rps)
    p99 = _positive("ttft_p99_s", ttft_p99_s)
    if not c.size == x.size == p99.size:
        raise ValueError("concurrency, throughput_rps and ttft_p99_s need one value per point")
    order = np.argsort(c)
    c, x, p99 = c[order], x[order], p99[order]
    if np.any(np.diff(c) == 0):
        raise ValueError("each concurrency may appear once")
    unloaded = float(c[0] / x[0])
    x_max = float(x.max())
    n_star = x_max * unloaded
    # R₀ is seen only before N* and the ceiling only past it: a sweep that starts on the
    # ceiling, or still rises at its last point, puts N* on its first or last point and has not
    # shown where the throughput bends.
    if not c[0] * (1 + 1e-9) < n_star < c[-1] * (1 - 1e-9):  # rounding aside
        raise ValueError(
            f"the sweep ({c[0]:g} to {c[-1]:g} clients) does not reach the knee N* = {n_star:.1f}"
        )
    theta2 = float(np.exp(np.interp(math.log(n_star), np.log(c), np.log(p99))))
    return Knee(n_star, x_max, unloaded, Thresholds(theta2 / THETA_RATIO, theta2))
