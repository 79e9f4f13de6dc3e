"""The saturation detector: smoothed TTFT P99 → regime, with hysteresis and dwell (docs/design.md §4).

Every tick (default 1 s) the detector takes the P99 of the TTFT samples in the trailing window
(default 10 s, at least ``min_samples`` = 20) and smooths it,

    s ← β·p99 + (1 − β)·s        (β = 0.3; the first estimate starts s),

then maps s to a regime: below if s < θ1, transition if θ1 ≤ s < θ2, saturated if s ≥ θ2. Moving
up needs s past θ; moving down needs s below (1 − h)·θ (h = 0.2). Either way the new regime must
hold for ``dwell`` consecutive ticks (default 3) before the detector switches, so noise around a
threshold or a spike shorter than the dwell does not flap the router.

A tick with too few samples carries no evidence of saturation: s decays as if the P99 were 0
(an idle system is not saturated), but such ticks never count toward a dwell upwards.

θ1, θ2 are seconds, or multiples of a calm baseline P99 (``Thresholds.calibrated``). The detector
is a plain object fed (time, TTFT) samples and ticks, so tests run it in virtual time.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Regime(IntEnum):
    BELOW = 0
    TRANSITION = 1
    SATURATED = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Thresholds:
    """θ1 < θ2 in seconds of smoothed TTFT P99."""

    theta1: float
    theta2: float

    def __post_init__(self) -> None:
        if not (0 < self.theta1 < self.theta2) or not math.isfinite(self.theta2):
            raise ValueError(f"thresholds need 0 < theta1 < theta2, got {self}")

    @classmethod
    def calibrated(cls, baseline_p99_s: float, k1: float = 2.0, k2: float = 5.0) -> Thresholds:
        """θ1 = k1·baseline, θ2 = k2·baseline, from a measured calm P99."""
        if baseline_p99_s <= 0:
            raise ValueError(f"baseline P99 must be > 0, got {baseline_p99_s}")
        return cls(k1 * baseline_p99_s, k2 * baseline_p99_s)

    def level(self, s: float, scale: float = 1.0) -> Regime:
        if s >= scale * self.theta2:
            return Regime.SATURATED
        if s >= scale * self.theta1:
            return Regime.TRANSITION
        return Regime.BELOW


class SaturationDetector:
    def __init__(
        self,
        thresholds: Thresholds,
        *,
        window_s: float = 10.0,
        min_samples: int = 20,
        beta: float = 0.3,
        hysteresis: float = 0.2,
        dwell: int = 3,
    ) -> None:
        if window_s <= 0 or min_samples < 1 or not 0 < beta <= 1 or not 0 <= hysteresis < 1:
            raise ValueError("need window_s > 0, min_samples >= 1, 0 < beta <= 1, 0 <= h < 1")
        if dwell < 1:
            raise ValueError(f"dwell must be >= 1, got {dwell}")
        self.thresholds = thresholds
        self.window_s = window_s
        self.min_samples = min_samples
        self.beta = beta
        self.hysteresis = hysteresis
        self.dwell = dwell
        self.regime = Regime.BELOW
        self.smoothed_p99: float | None = None
        self.last_p99: float | None = None
        self.last_switch_at: float | None = None
        self.switches = 0
        self._times: deque[float] = deque()
        self._ttfts: deque[float] = deque()
        self._pending: Regime | None = None
        self._pending_ticks = 0
        self._hold = 0  # ticks during which an escalation may not be undone

    def observe(self, t: float, ttft_s: float) -> None:
        """One request's time to first token, completed at time t (samples may come late)."""
        if not math.isfinite(ttft_s) or ttft_s < 0:
            return  # a broken measurement carries no information
        if self._times and t < self._times[-1]:
            i = bisect.bisect_right(self._times, t)
            self._times.insert(i, t)
            self._ttfts.insert(i, ttft_s)
        else:
            self._times.append(t)
            self._ttfts.append(ttft_s)

    def window_p99(self, now: float) -> float | None:
        """P99 of the samples in (now − window_s, now], or None with too few of them."""
        horizon = now - self.window_s
        while self._times and self._times[0] <= horizon:
            self._times.popleft()
            self._ttfts.popleft()
        end = bisect.bisect_right(self._times, now)
        if end < self.min_samples:
            return None
        return float(np.percentile(list(self._ttfts)[:end], 99))

    def escalate(self, now: float, hold_ticks: int) -> Regime:
        """Move up one regime now (a leading signal) and hold it for ``hold_ticks`` ticks."""
        if self.regime < Regime.SATURATED:
            self._switch(Regime(self.regime + 1), now)
            self._hold = hold_ticks
        return self.regime

    def tick(self, now: float) -> Regime:
        """Update s and the regime at time ``now``."""
        holding = self._hold > 0
        self._hold = max(0, self._hold - 1)
        p99 = self.window_p99(now)
        self.last_p99 = p99
        evidence = p99 is not None
        sample = p99 if p99 is not None else 0.0
        s = (
            sample
            if self.smoothed_p99 is None
            else (self.beta * sample + (1 - self.beta) * self.smoothed_p99)
        )
        if self.smoothed_p99 is None and not evidence:
            return self.regime  # nothing measured yet: nothing to smooth
        self.smoothed_p99 = s
        target = self._target(s)
        stay = target == self.regime or (target > self.regime and not evidence)
        if stay or (holding and target < self.regime):
            self._pending, self._pending_ticks = None, 0
            return self.regime
        if target != self._pending:
            self._pending, self._pending_ticks = target, 0
        self._pending_ticks += 1
        if self._pending_ticks >= self.dwell:
            self._switch(target, now)
        return self.regime

    def _switch(self, regime: Regime, now: float) -> None:
        self.regime = regime
        self.last_switch_at = now
        self.switches += 1
        self._pending, self._pending_ticks = None, 0

    def _target(self, s: float) -> Regime:
        up = self.thresholds.level(s)
        if up > self.regime:
            return up
        down = self.thresholds.level(s, scale=1.0 - self.hysteresis)
        return down if down < self.regime else self.regime
