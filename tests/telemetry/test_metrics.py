"""The Prometheus metrics: names on the registry, and PoA values below 1 flagged, never hidden."""

from __future__ import annotations

import logging
import math

import pytest
from prometheus_client import generate_latest

from telemetry import metrics

GAUGES = {
    "poa_hat": metrics.POA_HAT,
    "poa_routing": metrics.POA_ROUTING,
    "poa_capacity": metrics.POA_CAPACITY,
}


def impossible(factor: str) -> float:
    value = metrics.REGISTRY.get_sample_value("disagg_poa_impossible_total", {"factor": factor})
    assert value is not None, f"no disagg_poa_impossible_total series for {factor}"
    return value


def exported(name: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name)
    assert value is not None
    return value


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-per-factor warning as if nothing had been flagged yet (other tests
    in the session drive the simulator, which may already have set impossible values)."""
    monkeypatch.setattr(metrics, "_poa_warned", set())


def test_design_names_are_on_the_registry() -> None:
    text = generate_latest(metrics.REGISTRY).decode()
    for name in (
        "disagg_poa_hat",
        "disagg_poa_routing",
        "disagg_poa_capacity",
        "disagg_regime",
        "disagg_router_temperature",
        "disagg_router_overlap_weight",
        "disagg_policy_balance",
        "disagg_routing_cost",
        "disagg_ttft_p99_smoothed_seconds",
        "disagg_ttft_seconds",
        "disagg_itl_seconds",
        "disagg_auction_queue_depth",
        "disagg_auction_welfare",
        "disagg_auction_revenue_total",
    ):
        assert f"\n{name}" in text or text.startswith(name), name
    # The new counter is documented and exists for every factor before anything is flagged.
    assert "disagg_poa_impossible_total{factor}" in (metrics.__doc__ or "")
    for factor in metrics.POA_FACTORS:
        assert f'disagg_poa_impossible_total{{factor="{factor}"}}' in text


@pytest.mark.parametrize("factor", sorted(GAUGES))
def test_a_poa_below_one_is_counted_and_still_exported(factor: str) -> None:
    """Regression: the demo's spike reported poa_hat = 0.49 and nothing said it was impossible."""
    before = impossible(factor)
    GAUGES[factor].set(0.49)
    assert impossible(factor) == before + 1
    assert exported(f"disagg_{factor}") == 0.49  # not clamped
    GAUGES[factor].set(0.9)
    assert impossible(factor) == before + 2
    # The other factors' counts do not move.
    others = {f: impossible(f) for f in GAUGES if f != factor}
    GAUGES[factor].set(0.2)
    assert {f: impossible(f) for f in others} == others


@pytest.mark.parametrize(
    "value", [1.0, 1.0 - metrics.POA_TOLERANCE / 2, 1.5, 37.8, math.inf, math.nan]
)
def test_possible_values_are_not_flagged(value: float) -> None:
    before = {f: impossible(f) for f in GAUGES}
    for gauge in GAUGES.values():
        gauge.set(value)
    assert {f: impossible(f) for f in GAUGES} == before
    got = exported("disagg_poa_hat")
    assert got == value or (math.isnan(got) and math.isnan(value))


def test_the_warning_is_logged_once_per_factor(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="telemetry.metrics"):
        for _ in range(3):
            metrics.POA_HAT.set(0.49)
        metrics.POA_CAPACITY.set(0.5)
        metrics.POA_CAPACITY.set(0.7)
        metrics.POA_ROUTING.set(1.2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("poa_hat = 0.49 is below 1")
    assert warnings[1].startswith("poa_capacity = 0.5 is below 1")
    assert all("disagg_poa_impossible_total" in w for w in warnings)


def test_flag_impossible_poa_reports_what_it_flagged() -> None:
    before = impossible("poa_routing")
    assert metrics.flag_impossible_poa("poa_routing", 0.999) is True
    assert metrics.flag_impossible_poa("poa_routing", 1.0) is False
    assert metrics.flag_impossible_poa("poa_routing", math.nan) is False
    assert impossible("poa_routing") == before + 1
