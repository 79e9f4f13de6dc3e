"""The detector in virtual time: steps, spikes, ramps, noise and recovery."""

from __future__ import annotations

import numpy as np
import pytest

from controller.detector import Regime, SaturationDetector, Thresholds

TH = Thresholds(theta1=0.5, theta2=2.0)


def drive(
    detector: SaturationDetector, level, seconds: int, rate: int = 40, seed: int = 0, start: int = 0
):
    """Feed ``rate`` TTFT samples per second around level(t), tick every second; regimes."""
    rng = np.random.default_rng(seed)
    regimes = []
    for t in range(start, start + seconds):
        for k in range(rate):
            detector.observe(t + k / rate, max(0.0, level(t) * rng.uniform(0.8, 1.0)))
        regimes.append(detector.tick(t + 1.0))
    return regimes


def test_a_step_into_saturation_switches_once_after_the_dwell() -> None:
    d = SaturationDetector(TH, dwell=3)
    drive(d, lambda t: 0.1, 30)
    assert d.regime == Regime.BELOW
    regimes = drive(d, lambda t: 8.0, 20, start=30)
    first_sat = regimes.index(Regime.SATURATED)
    assert first_sat >= 2  # the dwell: at least three ticks with s past the threshold
    assert d.switches == 1 and d.regime == Regime.SATURATED  # straight up, no stop between
    assert all(r == Regime.SATURATED for r in regimes[first_sat:])


def test_a_spike_shorter_than_the_dwell_does_not_switch() -> None:
    # A 1 s window and no smoothing: the spike is visible for exactly its two ticks.
    d = SaturationDetector(TH, dwell=3, window_s=1.0, beta=1.0)
    drive(d, lambda t: 0.1, 20)
    drive(d, lambda t: 8.0, 2, start=20)  # two ticks of saturation
    drive(d, lambda t: 0.1, 20, start=22)
    assert d.switches == 0 and d.regime == Regime.BELOW


def test_a_ramp_passes_through_transition() -> None:
    d = SaturationDetector(TH, dwell=3)
    regimes = drive(d, lambda t: 0.1 + 0.05 * t, 100)  # 0.1 s → 5 s over 100 s
    seen = list(dict.fromkeys(regimes))
    assert seen == [Regime.BELOW, Regime.TRANSITION, Regime.SATURATED]


def test_noise_around_a_threshold_does_not_flap() -> None:
    d = SaturationDetector(TH, dwell=3)
    rng = np.random.default_rng(7)
    wobble = {t: 0.5 * (1 + rng.uniform(-0.15, 0.15)) for t in range(400)}
    drive(d, lambda t: wobble[t] / 0.9, 400, seed=3)  # P99 hovers right at θ1
    assert d.switches <= 1


def test_recovery_returns_below_through_the_hysteresis() -> None:
    d = SaturationDetector(TH, dwell=3)
    drive(d, lambda t: 8.0, 30)
    assert d.regime == Regime.SATURATED
    drive(d, lambda t: 1.7, 30, start=30)  # below θ2 but inside the band: stays
    assert d.regime == Regime.SATURATED
    drive(d, lambda t: 0.1, 60, start=60)
    assert d.regime == Regime.BELOW and d.last_switch_at is not None


def test_idle_decays_and_too_few_samples_never_escalate() -> None:
    d = SaturationDetector(TH, dwell=3, min_samples=20)
    drive(d, lambda t: 8.0, 30)
    for t in range(30, 90):  # traffic stops
        d.tick(float(t))
    assert d.regime == Regime.BELOW
    d2 = SaturationDetector(TH, dwell=1, min_samples=20)
    drive(d2, lambda t: 9.0, 20, rate=5)  # 50 samples per 10 s window: enough
    assert d2.regime == Regime.SATURATED
    d3 = SaturationDetector(TH, dwell=1, min_samples=20, window_s=2.0)
    drive(d3, lambda t: 9.0, 20, rate=5)  # 10 samples per window: never evidence
    assert d3.regime == Regime.BELOW


def test_calibrated_thresholds_and_bad_settings() -> None:
    th = Thresholds.calibrated(0.2, k1=2, k2=5)
    assert (th.theta1, th.theta2) == pytest.approx((0.4, 1.0))
    for bad in (
        lambda: Thresholds(2.0, 1.0),
        lambda: Thresholds.calibrated(0.0),
        lambda: SaturationDetector(TH, dwell=0),
        lambda: SaturationDetector(TH, beta=0),
    ):
        with pytest.raises(ValueError):
            bad()


def test_late_and_broken_samples() -> None:
    d = SaturationDetector(TH, min_samples=3, window_s=5.0)
    for t in (3.0, 1.0, 2.0, 4.0):
        d.observe(t, 1.0)
    d.observe(2.5, float("nan"))
    d.observe(2.6, -1.0)
    assert d.window_p99(5.0) == pytest.approx(1.0)
    assert d.window_p99(7.5) is None  # only two samples left in (2.5, 7.5]
