"""The detector in virtual time: steps, spikes, ramps, noise and recovery."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.detector import DEFAULT_MAX_SAMPLES, Regime, SaturationDetector, Thresholds

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


def test_late_samples_in_the_window_count_and_stale_ones_are_dropped() -> None:
    d = SaturationDetector(TH, min_samples=3, window_s=5.0)
    for t in (3.0, 1.0, 2.0, 4.0):  # out of order: first tokens reported at completion
        d.observe(t, 1.0)
    assert d.window_p99(5.0) == pytest.approx(1.0)
    assert d.window_p99(7.5) is None  # only two samples left in (2.5, 7.5]
    d.observe(2.4, 9.0)  # before the latest window's start: can never count again
    d.observe(2.6, 1.0)  # late, but inside (2.5, 7.5]: counts
    assert (d.late_dropped, d.samples) == (1, 3)
    assert d.window_p99(7.5) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("t", "ttft", "message"),
    [
        (math.nan, 1.0, "t must be finite"),
        (math.inf, 1.0, "t must be finite"),
        (-math.inf, 1.0, "t must be finite"),
        ("3", 1.0, "t must be a real number"),
        (True, 1.0, "t must be a real number"),
        (1.0, math.nan, "ttft_s must be finite"),
        (1.0, math.inf, "ttft_s must be finite"),
        (1.0, -0.5, "ttft_s must be >= 0"),
        (1.0, None, "ttft_s must be a real number"),
    ],
)
def test_broken_samples_are_refused_naming_the_parameter(
    t: object, ttft: object, message: str
) -> None:
    d = SaturationDetector(TH)
    with pytest.raises(ValueError, match=message):
        d.observe(t, ttft)  # type: ignore[arg-type]
    assert d.samples == 0


def test_a_nan_timestamp_can_no_longer_block_eviction() -> None:
    # Regression: observe(nan, ttft) was stored at the front of the window, and NaN <= horizon is
    # never true, so no sample was ever evicted again and memory grew with every request.
    d = SaturationDetector(TH, min_samples=1, window_s=1.0)
    with pytest.raises(ValueError):
        d.observe(math.nan, 0.1)
    for t in range(1000):
        d.observe(t + 0.5, 0.1)
        d.tick(t + 1.0)
        assert d.samples <= 1
    assert d.tick(2000.0) == Regime.BELOW and d.samples == 0


def test_memory_is_bounded_by_max_samples() -> None:
    # Without ticks nothing ages out of the window; the cap still holds, dropping the oldest.
    d = SaturationDetector(TH, min_samples=5, max_samples=100)
    for k in range(10_000):
        d.observe(k * 1e-3, 0.1 if k < 9_950 else 5.0)
    assert (d.samples, d.overflow_dropped) == (100, 9_900)
    assert d.window_p99(10.0) == pytest.approx(5.0)  # the newest 100 samples: 50 at 5 s
    assert SaturationDetector(TH).max_samples == DEFAULT_MAX_SAMPLES


def test_the_clock_never_goes_back_and_a_refused_call_changes_nothing() -> None:
    d = SaturationDetector(TH, dwell=1, min_samples=1)
    d.observe(9.5, 9.0)
    assert d.tick(10.0) == Regime.SATURATED
    before = (d.regime, d.smoothed_p99, d.switches, d.samples)
    for call in (
        lambda: d.tick(9.0),
        lambda: d.tick(math.nan),
        lambda: d.tick(math.inf),
        lambda: d.window_p99(5.0),
        lambda: d.escalate(9.0, 2),
        lambda: d.escalate(11.0, -1),
        lambda: d.escalate(11.0, 1.5),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match=r"now|hold_ticks"):
            call()
    assert (d.regime, d.smoothed_p99, d.switches, d.samples) == before
    d.tick(10.0)  # the same instant again is fine


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"window_s": math.nan}, "window_s must be finite"),
        ({"window_s": math.inf}, "window_s must be finite"),
        ({"window_s": 0.0}, "window_s must be > 0"),
        ({"min_samples": 0}, "min_samples must be an integer >= 1"),
        ({"min_samples": 2.5}, "min_samples must be an integer"),
        ({"beta": math.nan}, "beta must be finite"),
        ({"beta": 0.0}, r"beta must lie in \(0, 1\]"),
        ({"hysteresis": 1.0}, r"hysteresis must lie in \[0, 1\)"),
        ({"hysteresis": math.nan}, "hysteresis must be finite"),
        ({"dwell": 0}, "dwell must be an integer >= 1"),
        ({"dwell": True}, "dwell must be an integer"),
        ({"max_samples": 10}, "max_samples must be an integer >= 20"),
    ],
)
def test_bad_detector_settings_name_the_parameter(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SaturationDetector(TH, **settings)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Thresholds(math.nan, 1.0), "theta1 must be finite"),
        (lambda: Thresholds(0.5, math.inf), "theta2 must be finite"),
        (lambda: Thresholds("0.5", 1.0), "theta1 must be a real number"),
        (lambda: Thresholds.calibrated(math.nan), "baseline_p99_s must be finite"),
        (lambda: Thresholds.calibrated(-1.0), "baseline_p99_s must be > 0"),
        (lambda: Thresholds.calibrated(0.2, k1=math.nan), "k1 must be finite"),
        (lambda: Thresholds.calibrated(0.2, k1=5.0, k2=2.0), "0 < k1 < k2"),
        (lambda: Thresholds.calibrated(1e300, k1=1.0, k2=1e10), "overflows"),
        (lambda: TH.level(math.nan), "s must be finite"),
    ],
)
def test_bad_thresholds_name_the_parameter(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-2.0, 3.0, allow_subnormal=False),  # sample time relative to the clock
            st.floats(0.0, 10.0, allow_subnormal=False),  # TTFT
            st.floats(0.0, 1.5, allow_subnormal=False),  # how far the next tick moves the clock
        ),
        max_size=300,
    ),
    st.integers(5, 60),
)
def test_the_window_matches_a_model_and_stays_bounded(
    steps: list[tuple[float, float, float]], max_samples: int
) -> None:
    window = 2.0
    d = SaturationDetector(TH, window_s=window, min_samples=1, max_samples=max_samples)
    kept: list[tuple[float, float]] = []  # the model: every sample the detector should hold
    now = 0.0
    assert d.window_p99(now) is None  # starts the clock, so the model's first horizon applies
    for offset, ttft, advance in steps:
        t = now + offset
        d.observe(t, ttft)
        if t > now - window:
            kept.append((t, ttft))
            kept.sort(key=lambda sample: sample[0])
            if len(kept) > max_samples:
                del kept[0]
        assert d.samples == len(kept) <= max_samples
        now += advance
        kept = [(ts, v) for ts, v in kept if ts > now - window]
        in_window = [v for ts, v in kept if ts <= now]
        expected = float(np.percentile(in_window, 99)) if in_window else None
        assert d.window_p99(now) == (pytest.approx(expected) if in_window else None)
