"""The controller actor's config shape (``controller:`` in the service's config file), a
StrictModel whose errors name the field (docs/design.md §4): the detector's thresholds (wall
seconds, or multiples of a calm baseline), its window and smoothing, the policy table, and the
re-split lever's section (``resplit``, :mod:`cluster.ray.controller_pools`)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from cluster.models import StrictModel
from cluster.ray.controller_pools import ResplitSection
from controller import detector
from controller.detector import Thresholds
from controller.policy import PolicyTable, RegimePolicy
from router.cost import MAX_OMEGA

__all__ = ["DEFAULT_THETA_S", "Calibration", "ControllerSettings", "PolicySettings"]

_TABLE = PolicyTable()
# Thresholds when the settings give none: 5x and 15x (docs/design.md §4) the calm TTFT P99 of the
# default service (cluster/config.py: b200-llama70b-fp8-tp4, 1P/5D, speedup 0.25), which
# calm_baseline_p99 puts at 0.072 virtual s = 0.29 wall s. Another profile or speedup should
# give its own: ``calibrate: {baseline_s: calm_baseline_p99(...) / speedup}``.
DEFAULT_THETA_S = (1.5, 4.5)


class PolicyRow(StrictModel):
    tau: float = Field(ge=0.0)
    omega: float = Field(ge=0.0, le=MAX_OMEGA)


class PolicySettings(StrictModel):
    """The regime → (τ, ω) table; defaults are controller/policy.py's ``PolicyTable()``."""

    below: PolicyRow = PolicyRow(tau=_TABLE.below.tau, omega=_TABLE.below.omega)
    transition: PolicyRow = PolicyRow(tau=_TABLE.transition.tau, omega=_TABLE.transition.omega)
    saturated: PolicyRow = PolicyRow(tau=_TABLE.saturated.tau, omega=_TABLE.saturated.omega)

    def table(self) -> PolicyTable:
        rows = {name: getattr(self, name) for name in ("below", "transition", "saturated")}
        return PolicyTable(**{n: RegimePolicy(r.tau, r.omega) for n, r in rows.items()})


class Calibration(StrictModel):
    """θ1 = below_x · baseline, θ2 = saturated_x · baseline (docs/design.md §4)."""

    baseline_s: float = Field(gt=0.0)
    below_x: float = Field(detector.CALM_MULTIPLES[0], gt=0.0)
    saturated_x: float = Field(detector.CALM_MULTIPLES[1], gt=0.0)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.below_x < self.saturated_x:
            raise ValueError("calibrate needs below_x < saturated_x")
        return self


class ControllerSettings(StrictModel):
    tick_s: float = Field(1.0, ge=0.1, le=60.0)
    window_s: float = Field(detector.WINDOW_S, gt=0.0, le=3600.0)
    min_samples: int = Field(detector.MIN_SAMPLES, ge=1, le=100_000)
    beta: float = Field(detector.BETA, gt=0.0, le=1.0)
    theta1_s: float | None = Field(None, gt=0.0)
    theta2_s: float | None = Field(None, gt=0.0)
    calibrate: Calibration | None = None
    hysteresis: float = Field(detector.HYSTERESIS, ge=0.0, lt=1.0)
    dwell: int = Field(detector.DWELL, ge=1, le=1000)
    policy: PolicySettings = PolicySettings()
    # "table": each regime applies its row of ``policy`` (the study's way); "evidence": between
    # cache affinity and that row, as far as the PoA window says routing costs
    # (controller/evidence.py).
    routing: Literal["table", "evidence"] = "table"
    call_timeout_s: float = Field(2.0, gt=0.0, le=60.0)  # each call to the router/auction/PoA
    resplit: ResplitSection = ResplitSection()

    @model_validator(mode="after")
    def _one_threshold_source(self) -> Self:
        seconds = (self.theta1_s, self.theta2_s)
        if self.calibrate is not None:
            if seconds != (None, None):
                raise ValueError("give theta1_s/theta2_s or calibrate, not both")
        elif seconds == (None, None):
            pass  # DEFAULT_THETA_S
        elif None in seconds:
            raise ValueError("give both theta1_s and theta2_s (seconds), or calibrate")
        elif not seconds[0] < seconds[1]:  # type: ignore[operator]
            raise ValueError(f"theta1_s must be < theta2_s, got {seconds[0]} and {seconds[1]}")
        return self

    def thresholds(self) -> Thresholds:
        c = self.calibrate
        if c is not None:
            return Thresholds.calibrated(c.baseline_s, c.below_x, c.saturated_x)
        if self.theta1_s is None or self.theta2_s is None:
            return Thresholds(*DEFAULT_THETA_S)
        return Thresholds(self.theta1_s, self.theta2_s)
