"""The adaptive controller: detector + policy table → the router's (τ, ω), live (docs/design.md §4).

Each tick the detector updates the regime; on a switch the controller bumps the policy version
and calls ``set_policy(tau, omega, version)`` on its target (a ``router.Router``, or an actor that
forwards to one), so a policy change reaches routing without restarting anything and every
decision carries the version that made it. Regime changes are reported as ``RegimeChange``
records (the bus turns them into ``disagg.<ns>.regime`` events) and in the Prometheus gauges.

Optional signals ride on the ticks:

- a leading indicator (off by default): queue depth or poa_hat rising faster than a set rate
  escalates one regime at once and holds it a few ticks, before TTFT P99 has caught up;
- a drain (``controller.drain``): when a backlog that lasted has emptied, ``drained`` drops the
  TTFT samples of requests that met it and steps the regime down at once;
- capacity advice: saturated, with poa_capacity ≥ ``dominance``·poa_routing for ``sustain``
  ticks, means routing cannot help; the controller asks its advisor (Game 1) for a P/D re-split
  and reports it (advice only, for backends whose pools it cannot resize);
- the second lever (``controller.resplit.Resplitter``, optional): the same signals, with the
  measured arrival rate, actually re-split the pools one TP group at a time;
- routing by measured effect (``controller.evidence.EvidencePolicy``, optional): the policy a
  regime applies lies between cache affinity and the table's row, moved there only while the
  PoA window says the assignment costs (``poa_routing``); each move is a push with cause
  ``evidence``. Without it the table's row applies, as the study had it.

If the controller stops, its target keeps the last policy it was given.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from controller.detector import Regime, SaturationDetector
from controller.drain import Drain
from controller.evidence import EvidencePolicy
from controller.policy import PolicyTable, RegimePolicy
from controller.resplit import Resplitter
from controller.traffic import Traffic
from router import Policy
from telemetry import metrics


class PolicyTarget(Protocol):
    def set_policy(self, policy: Policy) -> None: ...


@dataclass(frozen=True)
class RegimeChange:
    t: float
    regime: Regime
    tau: float
    omega: float
    ttft_p99_smoothed_s: float
    version: int
    cause: str = "ttft"  # "ttft", "leading", "drain" or "evidence"


@dataclass(frozen=True)
class CapacityAdvice:
    t: float
    poa_routing: float
    poa_capacity: float
    recommendation: Any  # the advisor's record, e.g. a Game-1 split


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    return _number(value) and math.isfinite(value)  # type: ignore[arg-type]


class LeadingIndicator:
    """Fires when queue depth or poa_hat grows faster than ``*_rise_per_s`` over ``horizon``
    ticks (each rate None: that signal is off)."""

    def __init__(
        self,
        queue_rise_per_s: float | None = None,
        poa_rise_per_s: float | None = None,
        horizon: int = 3,
    ) -> None:
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
        rates = (("queue_rise_per_s", queue_rise_per_s), ("poa_rise_per_s", poa_rise_per_s))
        for name, rate in rates:
            if rate is not None and not _finite(rate):
                raise ValueError(f"{name} must be a finite number or None, got {rate!r}")
        self.queue_rise_per_s = queue_rise_per_s
        self.poa_rise_per_s = poa_rise_per_s
        self._queue: deque[tuple[float, float]] = deque(maxlen=horizon + 1)
        self._poa: deque[tuple[float, float]] = deque(maxlen=horizon + 1)

    def update(self, now: float, queue_depth: float | None, poa_hat: float | None) -> bool:
        fired = False
        for series, value, limit in (
            (self._queue, queue_depth, self.queue_rise_per_s),
            (self._poa, poa_hat, self.poa_rise_per_s),
        ):
            if value is None or limit is None:
                continue
            series.append((now, value))
            if len(series) == series.maxlen:
                (t0, v0), (t1, v1) = series[0], series[-1]
                if t1 > t0 and (v1 - v0) / (t1 - t0) > limit:
                    fired = True
        return fired


class Controller:
    def __init__(
        self,
        detector: SaturationDetector,
        table: PolicyTable,
        target: PolicyTarget,
        *,
        on_change: Callable[[RegimeChange], None] | None = None,
        leading: LeadingIndicator | None = None,
        hold_ticks: int = 6,
        advisor: Callable[[], Any] | None = None,
        on_advice: Callable[[CapacityAdvice], None] | None = None,
        dominance: float = 2.0,
        sustain: int = 10,
        resplitter: Resplitter | None = None,
        evidence: EvidencePolicy | None = None,
    ) -> None:
        for name, count in (("hold_ticks", hold_ticks), ("sustain", sustain)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {count!r}")
        if not _finite(dominance) or dominance < 1:
            raise ValueError(f"dominance must be a finite number >= 1, got {dominance!r}")
        self.detector = detector
        self.table = table
        self.target = target
        self.on_change = on_change
        self.leading = leading
        self.hold_ticks = hold_ticks
        self.advisor = advisor
        self.on_advice = on_advice
        self.dominance = dominance
        self.sustain = sustain
        self.resplitter = resplitter
        self.evidence = evidence
        self.version = 0
        self.changes: list[RegimeChange] = []
        self.advice: list[CapacityAdvice] = []
        self._capacity_ticks = 0

    @property
    def regime(self) -> Regime:
        return self.detector.regime

    def start(self, now: float) -> RegimeChange:
        """Push the current regime's policy (version 1): the target starts from a known state."""
        return self._apply(now, "ttft")

    def observe(self, t: float, ttft_s: float) -> None:
        self.detector.observe(t, ttft_s)
        metrics.TTFT.observe(ttft_s)

    def tick(
        self,
        now: float,
        queue_depth: float | None = None,
        poa_hat: float | None = None,
        poa_routing: float | None = None,
        poa_capacity: float | None = None,
        arrival_rate: float | None = None,
        backlog_since: float | None = None,
        traffic: Traffic | None = None,
    ) -> Regime:
        """One control tick; ``arrival_rate`` (req/s, measured), ``backlog_since`` (when the
        backlog under way began, ``controller.drain``) and ``traffic`` (the window's traffic,
        ``controller.traffic``; its λ stands for ``arrival_rate`` when that is not given) feed
        the re-split lever."""
        if arrival_rate is None and traffic is not None:
            arrival_rate = traffic.arrival_rate
        signals = (
            ("queue_depth", queue_depth),
            ("poa_hat", poa_hat),
            ("poa_routing", poa_routing),
            ("poa_capacity", poa_capacity),
            ("arrival_rate", arrival_rate),
        )
        for name, value in signals:
            # inf is a legitimate reading (an optimum of zero cost); NaN would silently fail
            # every comparison below and keep the leading indicator and the advice from firing.
            if value is not None and (not _number(value) or math.isnan(value)):
                raise ValueError(f"{name} must be a number or None, got {value!r}")
        before = self.detector.regime
        after = self.detector.tick(now)
        fired = self.leading is not None and self.leading.update(now, queue_depth, poa_hat)
        cause = None
        if fired and after == before:
            after = self.detector.escalate(now, self.hold_ticks)
            cause = "leading" if after != before else None
        elif after != before:
            cause = "ttft"
        if self.evidence is not None:
            self.evidence.update(after, poa_routing)
            metrics.POLICY_BALANCE.set(self.evidence.balance)
            if cause is None and self.evidence.due():
                cause = "evidence"
        if cause is not None:
            self._apply(now, cause)
        if self.detector.smoothed_p99 is not None:
            metrics.TTFT_P99_SMOOTHED.set(self.detector.smoothed_p99)
        self._advise(now, poa_routing, poa_capacity)
        if self.resplitter is not None and arrival_rate is not None:
            self.resplitter.tick(
                now, self.detector.regime, arrival_rate, poa_routing, poa_capacity, backlog_since,
                traffic,
            )  # fmt: skip
        return self.detector.regime

    def drained(self, drain: Drain) -> Regime:
        """The backlog ended (``controller.drain``): the detector forgets what the queue's
        requests measured and steps down at once (``SaturationDetector.relax``)."""
        before = self.detector.regime
        after = self.detector.relax(drain.t, drain.since)
        metrics.BACKLOG_DRAINS.inc()
        self._capacity_ticks = 0  # the capacity loss the advice counted was the queue's
        if after != before:
            self._apply(drain.t, "drain")
        return after

    def applied(self) -> RegimePolicy:
        """The policy the current regime applies: its row, or the evidence's blend."""
        regime = self.detector.regime
        return self.table[regime] if self.evidence is None else self.evidence.policy(regime)

    def _apply(self, now: float, cause: str) -> RegimeChange:
        regime = self.detector.regime
        policy = self.applied()
        if self.evidence is not None:
            self.evidence.pushed()
        self.version += 1
        self.target.set_policy(Policy(policy.tau, policy.omega, self.version, regime.label))
        change = RegimeChange(
            now,
            regime,
            policy.tau,
            policy.omega,
            self.detector.smoothed_p99 or 0.0,
            self.version,
            cause,
        )
        self.changes.append(change)
        metrics.REGIME.set(int(regime))
        metrics.ROUTER_TEMPERATURE.set(policy.tau)
        metrics.ROUTER_OVERLAP_WEIGHT.set(policy.omega)
        if self.on_change is not None:
            self.on_change(change)
        return change

    def _advise(self, now: float, poa_routing: float | None, poa_capacity: float | None) -> None:
        capacity_bound = (
            self.detector.regime == Regime.SATURATED
            and poa_routing is not None
            and poa_capacity is not None
            and poa_capacity >= self.dominance * poa_routing
        )
        self._capacity_ticks = self._capacity_ticks + 1 if capacity_bound else 0
        if self._capacity_ticks == self.sustain and self.advisor is not None:
            assert poa_routing is not None and poa_capacity is not None
            advice = CapacityAdvice(now, poa_routing, poa_capacity, self.advisor())
            self.advice.append(advice)
            metrics.CAPACITY_ADVICE.inc()
            if self.on_advice is not None:
                self.on_advice(advice)
