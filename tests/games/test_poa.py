from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from games.assignment import optimal_cost, optimal_cost_hungarian
from games.poa import PoaEstimator, WindowRequest, poa_hat


def _brute_force(P: np.ndarray, base: np.ndarray, svc: np.ndarray) -> float:
    """Minimum over every assignment: a worker's slot costs sum to n·base + svc·n(n−1)/2."""
    n, W = P.shape
    best = math.inf
    for a in itertools.product(range(W), repeat=n):
        counts = np.bincount(a, minlength=W)
        cost = sum(P[r, w] for r, w in enumerate(a))
        cost += float(np.sum(counts * base + svc * counts * (counts - 1) / 2))
        best = min(best, cost)
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = draw(st.integers(min_value=0, max_value=6))
    W = draw(st.integers(min_value=1, max_value=3))
    cell = st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(0, 5, allow_nan=False))
    P = np.array(
        draw(st.lists(st.lists(cell, min_size=W, max_size=W), min_size=n, max_size=n)), dtype=float
    ).reshape(n, W)
    base = np.array(draw(st.lists(st.floats(0, 3), min_size=W, max_size=W)))
    svc = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5]), min_size=W, max_size=W)))
    return P, base, svc


@given(instances())
@settings(max_examples=200, deadline=None)
def test_slot_flow_equals_hungarian_equals_enumeration(instance) -> None:
    P, base, svc = instance
    expected = _brute_force(P, base, svc)
    assert optimal_cost(P, base, svc) == pytest.approx(expected, abs=1e-9)
    assert optimal_cost_hungarian(P, base, svc) == pytest.approx(expected, abs=1e-9)


def test_slot_flow_equals_hungarian_on_larger_windows_with_forbidden_pairs() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n, W = int(rng.integers(20, 60)), int(rng.integers(2, 6))
        P = rng.uniform(0, 0.2, (n, W))
        forbid = rng.random((n, W)) < 0.25
        forbid[np.arange(n), rng.integers(0, W, n)] = False
        P[forbid] = np.inf
        base, svc = rng.uniform(0.01, 0.1, W), rng.uniform(0.0, 0.02, W)
        assert optimal_cost(P, base, svc) == pytest.approx(optimal_cost_hungarian(P, base, svc))


def _window(assignments, latencies, uncached, span=1.0):
    n = len(assignments)
    return [
        WindowRequest(
            f"r{i}",
            w,
            routed_at=span * i / n,
            completed_at=span * i / n + lat,
            latency=lat,
            uncached=u,
        )
        for i, (w, lat, u) in enumerate(zip(assignments, latencies, uncached, strict=True))
    ]


def test_factors_multiply_and_routing_is_at_least_one() -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        n, workers = 12, [0, 1, 2]
        window = _window(
            rng.integers(0, 3, n).tolist(),
            rng.uniform(0.05, 2.0, n).tolist(),
            [{w: int(rng.integers(0, 512)) for w in workers} for _ in range(n)],
        )
        est = poa_hat(window, prefill_s_per_token=1e-4)
        assert est.poa_routing >= 1.0
        assert est.poa_hat == pytest.approx(est.poa_routing * est.poa_capacity)
        assert est.optimal_cost <= est.router_cost + 1e-9


def test_optimal_routing_has_no_routing_loss() -> None:
    """Each request goes where its prefix is cached and the load is even: nothing to recover."""
    n = 10
    chosen = [i % 2 for i in range(n)]
    uncached = [{w: (0 if w == c else 4096) for w in (0, 1)} for c in chosen]
    window = _window(chosen, [0.2] * n, uncached)
    est = poa_hat(window, prefill_s_per_token=1e-4)
    assert est.poa_routing == pytest.approx(1.0)
    assert est.optimal_cost == pytest.approx(est.router_cost)


def test_herding_onto_one_worker_is_a_routing_loss() -> None:
    window = _window([0] * 20, [0.1 + 0.05 * i for i in range(20)], [{0: 0, 1: 0}] * 20)
    est = poa_hat(window, 1e-4)
    assert est.poa_routing > 1.5  # the idle worker would have halved the queue
    assert est.curves[1] == est.curves[0]  # idle worker: the best curve seen


def test_edge_cases() -> None:
    empty = poa_hat([], 1e-4)
    assert (empty.n, empty.poa_hat, empty.poa_routing, empty.poa_capacity) == (0, 1.0, 1.0, 1.0)
    one_worker = poa_hat(_window([4] * 5, [0.1, 0.2, 0.3, 0.4, 0.5], [{4: 100}] * 5), 1e-4)
    assert one_worker.poa_routing == 1.0 and one_worker.workers == (4,)
    zeros = poa_hat(_window([0, 1, 0], [0.0, 0.0, 0.0], [{0: 0, 1: 0}] * 3), 1e-4)
    assert (zeros.poa_hat, zeros.poa_routing, zeros.poa_capacity) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="latency"):
        WindowRequest("x", 0, 0.0, 1.0, -1.0, {0: 0})
    with pytest.raises(ValueError, match="breakdown"):
        WindowRequest("x", 2, 0.0, 1.0, 1.0, {0: 0})


def test_windows_by_count_and_by_time() -> None:
    est = PoaEstimator(prefill_s_per_token=1e-4, max_requests=3, max_age_s=5.0)
    for i in range(6):
        est.add(WindowRequest(f"r{i}", 0, float(i), float(i) + 0.5, 0.5, {0: 0, 1: 0}))
    assert [r.request_id for r in est.window()] == ["r3", "r4", "r5"]
    assert [r.request_id for r in est.window(now=9.0)] == ["r4", "r5"]
    assert est.estimate(now=100.0).n == 0
    for bad in (dict(max_requests=0), dict(max_age_s=0.0), dict(prefill_s_per_token=-1.0)):
        with pytest.raises(ValueError):
            PoaEstimator(**{"prefill_s_per_token": 1e-4, **bad})
