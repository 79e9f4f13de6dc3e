"""Mean ± 1 standard error and the number formats of the reports (disaggctl/experiment/stats.py)."""

from __future__ import annotations

import math

import pytest

from disaggctl.experiment.stats import fmt, fmt_mean_se, mean_se, routing_share, summarise


def test_mean_and_standard_error_by_hand() -> None:
    # 2, 4, 9: mean 5; deviations -3, -1, 4; sample variance (9 + 1 + 16) / 2 = 13; se √(13/3)
    mean, se = mean_se([2, 4, 9])
    assert mean == 5.0
    assert se == pytest.approx(math.sqrt(13 / 3))


def test_identical_trials_have_zero_error() -> None:
    assert mean_se([1.5, 1.5, 1.5]) == (1.5, 0.0)


def test_unmeasured_trials_are_left_out_and_one_value_has_no_error() -> None:
    assert mean_se([None, 3.0, float("nan")]) == (3.0, None)
    assert mean_se([None, float("inf")]) == (None, None)
    assert mean_se([]) == (None, None)


def test_summarise_keeps_one_mean_and_error_per_key() -> None:
    trials = [{"a": 1.0, "b": 10.0}, {"a": 3.0, "b": None}]
    row = summarise(trials, ("a", "b"))
    assert row["trials"] == 2
    assert row["a"] == 2.0 and row["a_se"] == pytest.approx(1.0)
    assert row["b"] == 10.0 and row["b_se"] is None


def test_formats() -> None:
    assert fmt(0.012345) == "0.0123"
    assert fmt(48.0) == "48.0"
    assert fmt(None) == "–"
    assert fmt_mean_se(5.0, math.sqrt(13 / 3)) == "5.00 ± 2.1"
    assert fmt_mean_se(2.0, None) == "2.00"
    assert fmt_mean_se(None, 1.0) == "–"


def test_the_routing_share_splits_the_spread_of_log_poa_hat() -> None:
    """log poa_hat = log poa_routing + log poa_capacity, so the two shares sum to 1; a factor
    that does not move carries none of the spread."""
    cells = [
        {"poa_hat": r * c, "poa_routing": r, "poa_capacity": c}
        for r, c in ((1.0, 2.0), (2.0, 2.0), (4.0, 2.0))
    ]
    assert routing_share(cells) == pytest.approx(1.0)
    mixed = [{"poa_hat": r * c, "poa_routing": r} for r, c in ((1.0, 1.0), (2.0, 2.0))]
    assert routing_share(mixed) == pytest.approx(0.5)
    assert routing_share([{"poa_hat": 3.0, "poa_routing": 1.5}] * 2) is None
