"""``bench.adaptive --reduced``, run for real (what ``make test`` runs of the benchmark): the JSON
is strict and complete, every adaptive run reaches ``saturated``, and the re-split arm moves a
worker through resplit_start → drained → warm. Whether the targets are met is the benchmark's
verdict, printed in the JSON, not this test's: the suite checks the measurement is sound."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import adaptive
from tests.bench.reports import bench_report


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return bench_report(adaptive.main, ["--reduced", "--quiet"])


def test_the_summary_has_every_reduced_case_with_finite_ratios(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "adaptive" and report["reduced"] is True
    assert set(report["summary"]) == set(adaptive.REDUCED_CASES)
    for name, row in report["summary"].items():
        for key in adaptive.RATIO_KEYS:
            value = row["over_static"][key]
            assert value is not None and math.isfinite(value) and value > 0, (name, key)


def test_every_phase_of_every_arm_is_reported(report: dict[str, Any]) -> None:
    names = [p.name for p in adaptive.REDUCED_PHASES]
    for entry in report["cases"].values():
        for arm in entry["arms"]:
            rows = entry[arm]["phases"]
            assert [r["phase"] for r in rows] == names
            hold = rows[names.index("saturated")]
            assert hold["completed"] > 0 and hold["poa_hat"] >= 1.0


def test_every_adaptive_run_reaches_saturated(report: dict[str, Any]) -> None:
    assert report["targets"]["saturated_regime_detected"]["met"], report["targets"]


def test_the_resplit_arm_moves_a_worker_to_prefill(report: dict[str, Any]) -> None:
    arm = report["cases"]["resplit-1P/5D"]["resplit"]
    (decisions,) = arm["resplits"]
    assert decisions and decisions[0]["to"] == "prefill" and decisions[0]["from"] == "1P/5D"
    (steps,) = arm["pool_steps"]
    actions = [s[1] for s in steps[:3]]
    assert actions == ["resplit_start", "drained", "warm"]
    assert steps[2][3] == "2P/4D"
    assert report["summary"]["resplit-1P/5D"]["resplits"] >= 1
    # Static and routing-only arms never touch the pools.
    static = report["cases"]["resplit-1P/5D"]["static"]
    assert static["resplits"] == [[]] and static["pool_steps"] == [[]]


def test_the_hold_before_the_new_prefill_worker_serves_is_accounted(
    report: dict[str, Any],
) -> None:
    """The requests the move cannot help: those of the hold that arrived before the added
    prefill worker served (its ``warm`` step), none of them after it."""
    arm = report["cases"]["resplit-1P/5D"]["resplit"]
    ((*_, warm),) = [[s for s in steps if s[1] == "warm"][:1] for steps in arm["pool_steps"]]
    (before,) = arm["before_new_prefill"]
    hold_start = sum(p.phase.duration for p in adaptive.REDUCED_PHASES[:2])
    hold_s = adaptive.REDUCED_PHASES[2].phase.duration
    served = min(max(warm[0] - hold_start, 0.0), hold_s)  # a hold that ends first: all of it
    assert before["serving_at_hold_s"] == pytest.approx(served, abs=0.1)
    assert 0.0 <= before["share_of_hold"] <= 1.0
    summary = report["summary"]["resplit-1P/5D"]["before_new_prefill"]
    assert summary["share_of_hold"] == before["share_of_hold"]
    if before["serving_at_hold_s"] > 0:
        assert before["share_of_hold"] > 0 and before["ttft_p99_s"] > 0
    assert report["cases"]["resplit-1P/5D"]["static"]["before_new_prefill"] == [None]
