"""The poa experiment's regimes at the deployment's own knee (experiment/knee_labels.py)."""

from __future__ import annotations

import pytest

from disaggctl.experiment.knee_labels import describe_thresholds, knee_thresholds


def _point(c: int, x: float, p99: float, regime: str, calm: str) -> dict[str, object]:
    return {
        "config": "d", "concurrency": c, "throughput_rps": x, "ttft_p99_s": p99,
        "regime": regime, "calm_regime": calm,
    }  # fmt: skip


def test_the_knee_and_what_each_labeling_calls_saturated() -> None:
    """R₀ = 2 s, X_max = 50 req/s: N* = 100. The calm multiples call C = 64 saturated at 64% of
    the ceiling; the knee's thresholds wait for C = 128."""
    points = [
        _point(1, 0.5, 0.1, "below", "below"),
        _point(64, 32.0, 0.3, "below", "saturated"),
        _point(128, 50.0, 0.9, "saturated", "saturated"),
    ]
    th = knee_thresholds(points)
    assert th["knee_clients"] == pytest.approx(100.0)
    assert th["theta2_s"] == pytest.approx(3 * th["theta1_s"])  # type: ignore[operator]
    text = describe_thresholds({"thresholds": {"d": th}, "points": points})
    assert text == (
        "d: N* = 100 clients; at the knee: saturated from C = 128 (100% of the throughput "
        "ceiling), the calm multiples: saturated from C = 64 (64% of the throughput ceiling)."
    )


def test_a_sweep_that_misses_the_knee_says_so() -> None:
    points = [_point(1, 0.5, 0.1, "below", "below"), _point(8, 4.0, 0.1, "below", "below")]
    th = knee_thresholds(points)
    assert th == {"knee_clients": None, "theta1_s": None, "theta2_s": None}
    text = describe_thresholds({"thresholds": {"d": th}, "points": points})
    assert text.startswith("d: the sweep misses N*; at the knee: never saturated")
