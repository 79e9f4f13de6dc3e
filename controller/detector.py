"""The saturation detector: smoothed TTFT P99 → regime, hysteresis and dwell (docs/design.md §4).

Every tick (default 1 s) the detector takes the P99 of the TTFT samples in the trailing window
(default 10 s, at least ``min_samples`` = 20) and smooths it,

    s ← β·p99 + (1 − β)·s        (β = 0.3; the first estimate starts s),

then maps s to a regime: below if s < θ1, transition if θ1 ≤ s < θ2, saturated if s ≥ θ2. Moving
up needs s past θ; moving down needs s below (1 − h)·θ (h = 0.2). Either way the new regime must
hold for ``dwell`` consecutive ticks (default 3) before the detector switches, so noise around a
threshold or a spike shorter than the dwell does not flap the router.

A tick with too few samples carries no evidence of saturation: s decays as if the P99 were 0
(an idle system is not saturated), but such ticks never count toward a dwell upwards.

When the caller knows the backlog has drained (``relax``, driven by ``controller.drain``), the
samples of requests that arrived before the drain are dropped and the regime moves down at once:
they measured a queue that no longer exists, and waiting for the window, the smoothing and the
dwell to forget them held a calm cluster ``saturated`` for ~20 s.

θ1, θ2 are seconds, or multiples of a calm baseline P99 (``Thresholds.calibrated``). The detector
is a plain object fed (time, TTFT) samples and ticks, so tests run it in virtual time.

Inputs, and what happens to bad ones (every refusal is a ``ValueError`` naming the parameter and
the value):

- A sample's time t and every ``now`` must be finite real numbers, and a TTFT finite and ≥ 0. A
  NaN time used to be stored and then block eviction for good (NaN ≤ horizon is never true), so
  the window grew without bound.
- The clock (the ``now`` of ``tick``, ``window_p99`` and ``escalate``) never goes back: a ``now``
  before the latest one is refused, since the samples it would need were already evicted.
- Samples may arrive late and out of order: a TTFT is known at the first token but is usually
  reported at completion, so in the simulator about 40% of samples come after a later one. A
  late sample still inside the trailing window of the latest tick is inserted in time order; one
  at or before that window's start can never count again, so it is dropped and counted in
  ``late_dropped`` rather than kept (or raised: lateness is normal, not a caller's mistake).
- Memory is bounded: at most ``max_samples`` (default ``DEFAULT_MAX_SAMPLES`` = 100 000) samples
  are kept; past that the oldest go first (they leave the window first anyway), counted in
  ``overflow_dropped``. 100 000 is a 10 s window at 10 000 requests/s, beyond one router's rate,
  and a P99 over that many samples still rests on 1 000 tail samples.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import numpy as np

DEFAULT_MAX_SAMPLES: Final = 100_000
"""Default cap on the samples a detector keeps (module docstring, "Memory is bounded")."""

# The detector's defaults (docs/design.md §4), stated once: the service's ``controller:`` section
# (cluster/ray/controller_settings.py) takes its defaults from here.
WINDOW_S: Final = 10.0  # the P99 window, s
MIN_SAMPLES: Final = 20  # fewer in the window: no P99 this tick
BETA: Final = 0.3  # the smoothing weight of the newest P99
HYSTERESIS: Final = 0.2  # moving down needs s below (1 − h)·θ
DWELL: Final = 3  # consecutive ticks a switch needs
CALM_MULTIPLES: Final = (5.0, 15.0)
"""(k1, k2) of ``Thresholds.calibrated``: θ1 = 5× the calm P99 (a queue has clearly formed: a
request waits several calm prefill times), θ2 = 15× (the queue grows faster than it drains)."""


def _finite(name: str, value: object) -> float:
    """``value`` as a float, or ``ValueError`` naming ``name`` unless it is a finite real."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return x


def _count(name: str, value: object, minimum: int) -> int:
    """``value`` as an int, or ``ValueError`` naming ``name`` unless it is an int ≥ ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


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
        theta1, theta2 = _finite("theta1", self.theta1), _finite("theta2", self.theta2)
        if not 0 < theta1 < theta2:
            raise ValueError(f"thresholds need 0 < theta1 < theta2, got {self}")

    @classmethod
    def calibrated(
        cls, baseline_p99_s: float, k1: float = CALM_MULTIPLES[0], k2: float = CALM_MULTIPLES[1]
    ) -> Thresholds:
        """θ1 = k1·baseline, θ2 = k2·baseline, from a measured calm P99."""
        baseline = _finite("baseline_p99_s", baseline_p99_s)
        if baseline <= 0:
            raise ValueError(f"baseline_p99_s must be > 0, got {baseline_p99_s!r}")
        f1, f2 = _finite("k1", k1), _finite("k2", k2)
        if not 0 < f1 < f2:
            raise ValueError(f"calibration needs 0 < k1 < k2, got k1={k1!r}, k2={k2!r}")
        theta1, theta2 = f1 * baseline, f2 * baseline
        if not math.isfinite(theta2):  # two finite factors can still overflow
            raise ValueError(f"k2·baseline_p99_s overflows: k2={k2!r}, baseline={baseline!r}")
        return cls(theta1, theta2)

    def level(self, s: float, scale: float = 1.0) -> Regime:
        """The regime of a smoothed P99 ``s`` against θ1, θ2 scaled by ``scale``."""
        s = _finite("s", s)
        if s >= scale * self.theta2:
            return Regime.SATURATED
        if s >= scale * self.theta1:
            return Regime.TRANSITION
        return Regime.BELOW


class SaturationDetector:
    """Smoothed TTFT P99 → regime (module docstring); a plain object driven by its caller."""

    def __init__(
        self,
        thresholds: Thresholds,
        *,
        window_s: float = WINDOW_S,
        min_samples: int = MIN_SAMPLES,
        beta: float = BETA,
        hysteresis: float = HYSTERESIS,
        dwell: int = DWELL,
        max_samples: int = DEFAULT_MAX_SAMPLES,
    ) -> None:
        if not isinstance(thresholds, Thresholds):
            raise ValueError(f"thresholds must be a Thresholds, got {thresholds!r}")
        window = _finite("window_s", window_s)
        if window <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        smoothing, h = _finite("beta", beta), _finite("hysteresis", hysteresis)
        if not 0 < smoothing <= 1:
            raise ValueError(f"beta must lie in (0, 1], got {beta!r}")
        if not 0 <= h < 1:
            raise ValueError(f"hysteresis must lie in [0, 1), got {hysteresis!r}")
        self.thresholds = thresholds
        self.window_s = window
        self.min_samples = _count("min_samples", min_samples, 1)
        self.beta = smoothing
        self.hysteresis = h
        self.dwell = _count("dwell", dwell, 1)
        self.max_samples = _count("max_samples", max_samples, self.min_samples)
        self.regime = Regime.BELOW
        self.smoothed_p99: float | None = None
        self.last_p99: float | None = None
        self.last_switch_at: float | None = None
        self.switches = 0
        self.late_dropped = 0  # samples at or before the latest tick's window: never countable
        self.overflow_dropped = 0  # oldest samples dropped to stay within max_samples
        self._times: deque[float] = deque()
        self._ttfts: deque[float] = deque()
        self._clock: float | None = None  # the latest now seen; time never goes back
        self._pending: Regime | None = None
        self._pending_ticks = 0
        self._hold = 0  # ticks during which an escalation may not be undone
        self._since = -math.inf  # the latest drain: requests that arrived before it met the queue
        self.drain_dropped = 0  # samples of such requests, dropped (``relax``)

    def observe(self, t: float, ttft_s: float) -> None:
        """One request's time to first token, at time t (its first token; samples may come late).

        ``ValueError`` unless t is finite and ``ttft_s`` finite and ≥ 0. A sample at or before
        the start of the latest tick's window is dropped (``late_dropped``)."""
        t = _finite("t", t)
        ttft = _finite("ttft_s", ttft_s)
        if ttft < 0:
            raise ValueError(f"ttft_s must be >= 0, got {ttft_s!r}")
        if self._clock is not None and t <= self._clock - self.window_s:
            self.late_dropped += 1
            return
        if t - ttft < self._since:
            self.drain_dropped += 1
            return
        if self._times and t < self._times[-1]:
            i = bisect.bisect_right(self._times, t)
            self._times.insert(i, t)
            self._ttfts.insert(i, ttft)
        else:
            self._times.append(t)
            self._ttfts.append(ttft)
        if len(self._times) > self.max_samples:
            self._times.popleft()
            self._ttfts.popleft()
            self.overflow_dropped += 1

    @property
    def samples(self) -> int:
        """Samples held now (at most ``max_samples``)."""
        return len(self._times)

    def _advance(self, now: float) -> float:
        """Move the clock to ``now``: finite, and never before the latest ``now``."""
        now = _finite("now", now)
        if self._clock is not None and now < self._clock:
            raise ValueError(f"now must not go back in time: got {now!r} after {self._clock!r}")
        self._clock = now
        return now

    def window_p99(self, now: float) -> float | None:
        """P99 of the samples in (now − window_s, now], or None with too few of them."""
        now = self._advance(now)
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
        hold_ticks = _count("hold_ticks", hold_ticks, 0)
        now = self._advance(now)
        if self.regime < Regime.SATURATED:
            self._switch(Regime(self.regime + 1), now)
            self._hold = hold_ticks
        return self.regime

    def relax(self, now: float, since: float) -> Regime:
        """The backlog drained at ``since`` (a leading signal down, the mirror of ``escalate``).

        A sample whose request arrived before ``since`` (t − TTFT < since) met a queue that is
        gone, so it no longer says what a request arriving now meets: those samples are dropped,
        and so are such samples that come later (``drain_dropped``). s restarts from the P99 of
        what is left (0 with fewer than ``min_samples``: an empty queue is not saturated) and
        the regime moves down to that level (with the hysteresis) at once, without a dwell."""
        now = self._advance(now)
        since = _finite("since", since)
        if since > now:
            raise ValueError(f"since must not be after now: got {since!r} > {now!r}")
        self._since = max(self._since, since)
        kept = [
            (t, x) for t, x in zip(self._times, self._ttfts, strict=True) if t - x >= self._since
        ]
        self.drain_dropped += len(self._times) - len(kept)
        self._times = deque(t for t, _ in kept)
        self._ttfts = deque(x for _, x in kept)
        p99 = self.window_p99(now)
        self.last_p99 = p99
        self.smoothed_p99 = 0.0 if p99 is None else p99
        self._hold = 0
        level = self.thresholds.level(self.smoothed_p99, scale=1.0 - self.hysteresis)
        if level < self.regime:
            self._switch(level, now)
        self._pending, self._pending_ticks = None, 0
        return self.regime

    def tick(self, now: float) -> Regime:
        """Update s and the regime at time ``now``."""
        now = self._advance(now)  # before any state changes: a refused tick changes nothing
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
