"""``bench.priority --reduced``, run for real (what ``make test`` runs of the benchmark): the JSON
is strict and complete, per user and arm, and the two arms served the same load. Whether the
targets are met is the benchmark's verdict, printed in the JSON, not this test's."""

from __future__ import annotations

from typing import Any

import pytest

from bench import priority
from tests.bench.reports import bench_report


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return bench_report(priority.main, ["--reduced", "--quiet"])


def test_every_target_is_judged_on_the_reduced_deployment(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "priority" and report["reduced"] is True
    assert set(report["targets"]) == {
        "1P/5D ttft_p50_over_anonymous",
        "1P/5D ttft_p99_over_anonymous",
        "1P/5D throughput_over_fcfs",
        "1P/5D payment_per_request_non_decreasing_in_bid",
    }
    mean = report["deployments"][0]["mean"]
    for key in ("ttft_p50_over_anonymous", "ttft_p99_over_anonymous", "throughput_over_fcfs"):
        assert mean[key] is not None and mean[key] > 0


def test_each_arm_reports_every_user(report: dict[str, Any]) -> None:
    (run,) = report["deployments"][0]["runs"]
    for arm in ("fcfs", "priority"):
        users = run[arm]["users"]
        assert set(users) == {"anonymous", *priority.USERS}
        assert all(u["requests"] > 0 and u["ttft_p50_s"] is not None for u in users.values())
        assert users["anonymous"]["mean_bid"] == 0.0 and users["gold"]["mean_bid"] > 0
    # FCFS charges nothing; the engines saw the same arrival process in both arms.
    assert all(u["payment_per_request"] == 0 for u in run["fcfs"]["users"].values())
    fcfs, prio = run["fcfs"]["throughput_rps"], run["priority"]["throughput_rps"]
    assert fcfs > 0 and prio > 0


def test_the_judgement_names_a_higher_bidder_who_pays_less() -> None:
    users = {
        "anonymous": {"payment_per_request": 0.0},
        "gold": {"payment_per_request": 0.1},
        "silver": {"payment_per_request": 0.2},
        "bronze": {"payment_per_request": 0.01},
    }
    assert priority.payment_exceptions(users) == [
        {"lower_bidder": "silver", "pays": 0.2, "higher_bidder": "gold", "pays_only": 0.1}
    ]


def test_saturation_is_twice_the_population_full_prefill_batches_serve() -> None:
    # 70B: a full batch is 64 requests of 64 new tokens after the 64-token template,
    # T = 0.004 + 64 (64 · 2e-5 + 0.0204) = 1.3915 s (the attention term adds 0.2 ms); E = 1.5 T
    # + 255 · 8.5 ms. Twice X · E per prefill worker, twice that with two.
    t = 0.004 + 64 * (64 * 2e-5 + 0.0204)
    one = 2 * (64 / t) * (1.5 * t + 255 * 0.0085)
    assert abs(priority.saturation_concurrency("1P/5D") - one) < 1.0
    assert abs(priority.saturation_concurrency("2P/4D") - 2 * one) < 1.5
    assert priority.saturation_concurrency("2P/4D") > 384  # where 2P/4D had no queue to reorder
