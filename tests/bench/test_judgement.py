"""Each benchmark's ``judge(report)`` on synthetic reports: the verdict is tested without running
a single measurement, and ``emit`` turns a miss into exit status 1."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bench import adaptive, auction, autobidder, common, layout, lease, poa, replay, router, sim

BENCHES = (adaptive, auction, autobidder, layout, lease, poa, router, sim)

# -- common ----------------------------------------------------------------------------------


def test_limits_treat_nan_and_missing_as_a_miss() -> None:
    assert common.at_most(2.0, 2.0)["met"]
    assert not common.at_most(2.01, 2.0)["met"]
    assert common.at_least(20_000, 20_000)["met"]
    for bad in (None, math.nan):
        assert not common.at_most(bad, 2.0)["met"]
        assert not common.at_least(bad, 2.0)["met"]


def test_verdict_needs_every_target_and_at_least_one() -> None:
    good, bad = common.at_most(1.0, 2.0), common.at_most(3.0, 2.0)
    assert common.verdict({"a": good, "b": good})["met"]
    assert not common.verdict({"a": good, "b": bad})["met"]
    assert not common.verdict({})["met"]  # judging nothing is not a pass


def test_emit_puts_met_on_top_and_exits_1_on_a_miss(capsys: pytest.CaptureFixture[str]) -> None:
    judged = common.verdict({"speed": common.at_least(10.0, 50.0)})
    assert common.emit("demo", judged, {"results": [1, 2]}, quiet=False) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert list(report)[:3] == ["benchmark", "met", "targets"]
    assert report["met"] is False and report["results"] == [1, 2]
    assert "target missed: speed" in err


def test_emit_quiet_says_nothing_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    judged = common.verdict({"speed": common.at_least(10.0, 50.0)})
    assert common.emit("demo", judged, {}, quiet=True) == 1
    assert capsys.readouterr().err == ""


def test_emit_met_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    judged = common.verdict({"speed": common.at_least(60.0, 50.0)})
    assert common.emit("demo", judged, {}, quiet=False) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["met"] is True and err == ""


def test_emit_writes_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    """NaN (a phase with no samples) must come out as null, not as the invalid token NaN."""
    judged = common.verdict({"ratio": common.at_most(math.nan, 1.05)})
    rows = [{"poa_hat": math.inf}, (1.0, math.nan)]
    assert common.emit("demo", judged, {"rows": rows}, quiet=True) == 1
    report = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)
    assert report["targets"]["ratio"]["measured"] is None
    assert report["rows"] == [{"poa_hat": None}, [1.0, None]]


@pytest.mark.parametrize("bench", BENCHES, ids=lambda m: m.__name__)
def test_every_bench_has_judge_and_the_output_flags(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert callable(bench.judge)
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--quiet" in text and "--progress" in text and "--no-progress" in text


# -- router ----------------------------------------------------------------------------------


def _router_case(workers: int, tokens: int, ratio: float, rate: int = 100_000) -> dict[str, Any]:
    variant = {"decide_over_hash": ratio, "decisions_per_s": rate}
    return {
        "workers": workers,
        "prompt_tokens": tokens,
        "argmin": dict(variant),
        "softmax": dict(variant),
        "override": dict(variant),
    }


def _router_report(ratio_128: float = 1.5, rate: int = 100_000) -> dict[str, Any]:
    cases = [_router_case(w, n, 1.2, rate) for n in (128, 4096) for w in (2, 5, 16)]
    cases[2]["softmax"]["decide_over_hash"] = ratio_128  # 16 workers, 128 tokens
    return {"cases": cases}


def test_router_all_targets_met() -> None:
    judged = router.judge(_router_report())
    assert judged["met"] is True
    assert set(judged["targets"]) == {
        "decide_over_hash_128_tokens",
        "decide_over_hash_4096_tokens",
        "decisions_per_s_128_tokens_5_workers",
    }


def test_router_128_token_ratio_over_2x_is_a_miss() -> None:
    judged = router.judge(_router_report(ratio_128=4.676))
    assert judged["met"] is False
    miss = judged["targets"]["decide_over_hash_128_tokens"]
    assert miss == {
        "target": "<= 2",
        "measured": 4.676,
        "met": False,
        "worst_workers": 16,
        "worst_variant": "softmax",
    }
    assert judged["targets"]["decide_over_hash_4096_tokens"]["met"] is True


def test_router_slow_decisions_miss_the_rate_target() -> None:
    judged = router.judge(_router_report(rate=12_000))
    assert judged["met"] is False
    assert judged["targets"]["decisions_per_s_128_tokens_5_workers"]["measured"] == 12_000


def test_router_missing_rate_case_is_a_miss() -> None:
    report = _router_report()
    report["cases"] = [c for c in report["cases"] if c["workers"] != 5]
    assert not router.judge(report)["targets"]["decisions_per_s_128_tokens_5_workers"]["met"]


# -- auction ---------------------------------------------------------------------------------


def _auction_row(name: str, speedup: float, over_build: float) -> dict[str, Any]:
    return {
        "workload": name,
        "fast_vs_naive_speedup": speedup,
        "order_plus_payments_over_build": over_build,
    }


def test_auction_judges_the_worst_workload() -> None:
    rows = [_auction_row("chains", 400.0, 0.4), _auction_row("trees-long", 150.0, 0.9)]
    assert auction.judge({"results": rows})["met"] is True
    rows.append(_auction_row("mixshare-90", 60.0, 1.3))
    judged = auction.judge({"results": rows})
    assert judged["met"] is False
    speed = judged["targets"]["fast_vs_naive_speedup"]
    assert (speed["measured"], speed["worst_workload"]) == (60.0, "mixshare-90")
    assert judged["targets"]["order_plus_payments_over_build"]["measured"] == 1.3


def test_auction_without_rows_is_a_miss() -> None:
    assert auction.judge({"results": []})["met"] is False


# -- sim -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("speed", "met"), [(61.2, True), (50.0, True), (31.0, False)])
def test_sim_speed_at_c128(speed: float, met: bool) -> None:
    rows = [
        {"concurrency": 16, "sim_seconds_per_wall_second": 500.0},
        {"concurrency": 128, "sim_seconds_per_wall_second": speed},
    ]
    assert sim.judge({"results": rows})["met"] is met


def test_sim_missing_target_point_is_a_miss() -> None:
    rows = [{"concurrency": 16, "sim_seconds_per_wall_second": 500.0}]
    assert sim.judge({"results": rows})["met"] is False


# -- poa -------------------------------------------------------------------------------------


def _poa_rows(estimate_ms: float = 40.0, agrees: bool = True) -> list[dict[str, Any]]:
    return [
        {"window": 256, "workers": 5, "estimate_ms": 5.0, "agrees_with_hungarian": agrees},
        {"window": 1024, "workers": 5, "estimate_ms": estimate_ms},
    ]


def test_poa_met() -> None:
    judged = poa.judge({"results": _poa_rows()})
    assert judged["met"] is True
    assert judged["targets"]["agrees_with_hungarian"]["cases_checked"] == 1


def test_poa_slow_window_is_a_miss() -> None:
    judged = poa.judge({"results": _poa_rows(estimate_ms=140.0)})
    assert judged["met"] is False
    assert judged["targets"]["estimate_ms_1024_window_5_workers"]["measured"] == 140.0


def test_poa_disagreement_with_hungarian_is_a_miss() -> None:
    judged = poa.judge({"results": _poa_rows(agrees=False)})
    assert judged["met"] is False
    assert judged["targets"]["agrees_with_hungarian"]["disagreeing_cases"] == [[256, 5]]


def test_poa_nothing_checked_against_hungarian_is_a_miss() -> None:
    rows = [{"window": 1024, "workers": 5, "estimate_ms": 40.0}]
    assert poa.judge({"results": rows})["targets"]["agrees_with_hungarian"]["met"] is False


# -- adaptive --------------------------------------------------------------------------------


def _adaptive_report(
    stale: dict[str, float | None] | None = None,
    resplit_ttft: float | None = 0.4,
    saturated: bool = True,
) -> dict[str, Any]:
    label = "saturated" if saturated else "transition"
    switches = {"regime_switches": [[[40.0, "transition"], [70.0, label]]]}
    stale_ratios = {"poa_hat": 0.7, "ttft_p99_s": 0.75, "throughput_rps": 0.9, **(stale or {})}
    return {
        "cases": {
            "fresh-1P/5D": {"arms": ["static", "adaptive"], "adaptive": switches},
            "stale-2P/4D": {"arms": ["static", "adaptive"], "adaptive": switches},
            "resplit-1P/5D": {
                "arms": ["static", "adaptive", "resplit"],
                "adaptive": switches,
                "resplit": switches,
            },
        },
        "summary": {
            # fresh cases are reported, not judged: even a bad ratio is no miss
            "fresh-1P/5D": {"over_static": {"poa_hat": 3.0, "ttft_p99_s": 3.0}},
            "stale-2P/4D": {"over_static": stale_ratios},
            "resplit-1P/5D": {"over_static": {"ttft_p99_s": resplit_ttft}},
        },
    }


def test_adaptive_targets_met() -> None:
    judged = adaptive.judge(_adaptive_report())
    assert judged["met"] is True
    assert set(judged["targets"]) == {
        "saturated_regime_detected",
        "stale-2P/4D:poa_hat",
        "stale-2P/4D:ttft_p99_s",
        "stale-2P/4D:throughput_rps",
        "resplit-1P/5D:ttft_p99_s",
    }


@pytest.mark.parametrize(
    ("stale", "resplit_ttft", "missed"),
    [
        ({"poa_hat": 0.81}, 0.4, "stale-2P/4D:poa_hat"),
        ({"ttft_p99_s": 1.0}, 0.4, "stale-2P/4D:ttft_p99_s"),
        ({"throughput_rps": 0.84}, 0.4, "stale-2P/4D:throughput_rps"),
        ({}, 0.51, "resplit-1P/5D:ttft_p99_s"),
        ({"ttft_p99_s": None}, 0.4, "stale-2P/4D:ttft_p99_s"),  # a ratio not formed is a miss
    ],
)
def test_adaptive_each_target_can_miss(
    stale: dict[str, float | None], resplit_ttft: float, missed: str
) -> None:
    judged = adaptive.judge(_adaptive_report(stale, resplit_ttft))
    assert judged["met"] is False
    assert [k for k, t in judged["targets"].items() if not t["met"]] == [missed]


def test_adaptive_never_saturated_is_a_miss() -> None:
    judged = adaptive.judge(_adaptive_report(saturated=False))
    assert judged["met"] is False
    assert "fresh-1P/5D:adaptive" in judged["targets"]["saturated_regime_detected"]["missed"]


def test_adaptive_summary_is_the_compared_arm_over_static() -> None:
    hold = {"phase": "saturated", "poa_hat": 4.0, "ttft_p99_s": 2.0, "itl_p99_s": 0.01}
    static = {"phases": [{**hold, "throughput_rps": 40.0}]}
    better = {"phases": [{**hold, "ttft_p99_s": 0.5, "throughput_rps": 44.0}], "resplits": [[1]]}
    cases = {"c": {"compare": "resplit", "static": static, "resplit": better}}
    row = adaptive.summarize_cases(cases)["c"]
    assert row["arm"] == "resplit" and row["resplits"] == 1
    assert row["over_static"] == {
        "poa_hat": 1.0,
        "ttft_p99_s": 0.25,
        "itl_p99_s": 1.0,
        "throughput_rps": 1.1,
    }


# -- autobidder ------------------------------------------------------------------------------


def _regret_rows(regrets: list[float]) -> dict[str, Any]:
    horizons = [100, 400, 1600, 6400][: len(regrets)]
    return {"regret": [{"T": T, "regret_mean": g} for T, g in zip(horizons, regrets, strict=True)]}


def test_autobidder_sqrt_t_regret_meets_the_slope() -> None:
    judged = autobidder.judge(_regret_rows([10.0, 20.0, 40.0, 80.0]))
    target = judged["targets"]["loglog_slope"]
    assert judged["met"] is True and target["measured"] == pytest.approx(0.5)


def test_autobidder_linear_regret_misses_the_slope() -> None:
    judged = autobidder.judge(_regret_rows([10.0, 40.0, 160.0, 640.0]))
    assert judged["met"] is False
    assert judged["targets"]["loglog_slope"]["measured"] == pytest.approx(1.0)


def test_autobidder_slope_over_positive_regret_when_it_wins_somewhere() -> None:
    judged = autobidder.judge(_regret_rows([-1.0, 20.0, 40.0, 80.0]))
    target = judged["targets"]["loglog_slope"]
    assert judged["met"] is True
    assert target["fitted_over"] == [400, 1600, 6400]
    assert target["autobidder_beats_best_fixed_alpha_at_T"] == [100]


def test_autobidder_winning_everywhere_has_no_slope_and_meets() -> None:
    judged = autobidder.judge(_regret_rows([-1.0, -2.0, 3.0, -0.5]))
    target = judged["targets"]["loglog_slope"]
    assert judged["met"] is True and target["measured"] is None


def test_autobidder_one_horizon_is_no_evidence() -> None:
    assert autobidder.judge(_regret_rows([5.0]))["met"] is False


# -- ingress ---------------------------------------------------------------------------------


def _ingress_stats(e2e_p50_ms: float | None, rps: float) -> dict[str, Any]:
    return {"requests": 100, "errors": {}, "rps": rps, "ttft_p50_ms": 50.0,
            "ttft_p99_ms": 80.0, "e2e_p50_ms": e2e_p50_ms, "e2e_p99_ms": 900.0,
            "chunks_mean": 16.0}  # fmt: skip


def _ingress_report(full_p50: float | None = 770.0, full_rps: float = 39.0,
                    clients: tuple[int, ...] = (1, 32, 256)) -> dict[str, Any]:  # fmt: skip
    from bench import ingress

    points = []
    for c in clients:
        bare, full = _ingress_stats(700.0, 42.0), _ingress_stats(full_p50, full_rps)
        points.append({"clients": c, "bare": bare, "full": full, **ingress.compare(bare, full)})
    return {"points": points}


def test_ingress_met_at_32_clients() -> None:
    from bench import ingress

    judged = ingress.judge(_ingress_report())
    assert judged["met"] is True
    p50 = judged["targets"]["p50_e2e_full_over_bare_at_32"]
    assert p50["measured"] == pytest.approx(770 / 700, abs=1e-4)
    assert (p50["full_ms"], p50["bare_ms"]) == (770.0, 700.0)
    rps = judged["targets"]["throughput_full_over_bare_at_32"]
    assert rps["measured"] == pytest.approx(39 / 42, abs=1e-4) and rps["bare_rps"] == 42.0
    assert judged["targets"]["throughput_full_over_bare_at_256"]["met"] is True


def test_ingress_slow_full_path_misses_the_p50_target() -> None:
    from bench import ingress

    judged = ingress.judge(_ingress_report(full_p50=700.0 * 1.16))
    assert judged["met"] is False
    assert judged["targets"]["p50_e2e_full_over_bare_at_32"]["met"] is False
    assert judged["targets"]["throughput_full_over_bare_at_32"]["met"] is True


def test_ingress_lost_throughput_misses() -> None:
    from bench import ingress

    judged = ingress.judge(_ingress_report(full_rps=42.0 * 0.89))
    assert judged["met"] is False
    assert judged["targets"]["throughput_full_over_bare_at_32"]["met"] is False
    assert judged["targets"]["throughput_full_over_bare_at_256"]["met"] is True  # ≥ 0.7 there


def test_ingress_without_a_256_client_point_judges_32_alone() -> None:
    from bench import ingress

    judged = ingress.judge(_ingress_report(clients=(1, 32)))
    assert judged["met"] is True and "throughput_full_over_bare_at_256" not in judged["targets"]


def test_ingress_without_the_32_client_point_is_a_miss() -> None:
    from bench import ingress

    judged = ingress.judge(_ingress_report(clients=(1, 256)))
    assert judged["met"] is False
    assert judged["targets"]["p50_e2e_full_over_bare_at_32"]["measured"] is None
    assert judged["targets"]["throughput_full_over_bare_at_32"]["measured"] is None


def test_ingress_full_path_that_answered_nothing_is_a_miss() -> None:
    from bench import ingress

    judged = ingress.judge(_ingress_report(full_p50=None, full_rps=0.0))
    assert judged["met"] is False
    assert judged["targets"]["p50_e2e_full_over_bare_at_32"]["measured"] is None
    assert judged["targets"]["throughput_full_over_bare_at_32"]["measured"] == 0.0


def test_ingress_summary_counts_only_the_window_after_warmup() -> None:
    from bench.load_stats import Sample, summarize

    samples = [
        Sample(0.2, 0.9, None, 0.1, 16),  # warm-up: in no figure
        Sample(0.5, 1.5, None, 0.1, 16),  # started in the warm-up: throughput only
        Sample(1.0, 2.0, None, 0.2, 16),
        Sample(2.0, 3.0, None, 0.4, 16),
        Sample(3.0, 3.5, "503", None, 0),
        Sample(3.5, 4.5, None, 0.3, 16),  # counted latency, answered after the window
        Sample(3.6, 3.8, None, None, 0),  # answered without content
    ]
    s = summarize(samples, warmup=1.0, seconds=4.0)
    assert s["requests"] == 4 and s["errors"] == {"503": 1} and s["no_content"] == 1
    assert s["rps"] == 1.333  # answered in [1, 4): 4 in 3 s, to 3 decimals
    assert s["e2e_p50_ms"] == pytest.approx(1000.0) and s["ttft_p50_ms"] == pytest.approx(300.0)
    assert s["chunks_mean"] == pytest.approx(12.0)


def test_ingress_has_the_output_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import ingress

    with pytest.raises(SystemExit) as exit_:
        ingress.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert all(flag in text for flag in ("--quiet", "--progress", "--no-progress", "--quick"))


# -- replay ----------------------------------------------------------------------------------------


def _replay_report(speed: float = 105.0, rss: float = 620.0, load_s: float = 7.0,
                   on_time: float = 1.0, answered: int = 339) -> dict[str, Any]:
    return {
        "sim": {"virtual_per_wall": speed, "peak_rss_mib": rss},
        "load": {"lines": 1_000_000, "seconds": load_s, "added_rss_mib": 1.0},
        "live": {"requests": 339, "answered": answered, "lateness": {"within_share": on_time}},
    }


def test_replay_meets_its_targets_and_misses_each_one_alone() -> None:
    assert replay.judge(_replay_report())["met"]
    for bad, target in (
        ({"speed": 99.0}, "virtual_per_wall"),
        ({"rss": 1600.0}, "peak_rss_mib"),
        ({"load_s": 11.0}, "load_seconds"),
        ({"on_time": 0.98}, "live_sent_within_50ms"),
        ({"answered": 338}, "live_all_answered"),
    ):
        judged = replay.judge(_replay_report(**bad))
        assert not judged["met"] and not judged["targets"][target]["met"], target


def test_replay_judges_only_the_parts_it_ran() -> None:
    report = _replay_report()
    del report["live"], report["load"]
    assert set(replay.judge(report)["targets"]) == {"virtual_per_wall", "peak_rss_mib"}
    assert not replay.judge({})["met"]  # nothing measured is no pass


# -- lease and layout ------------------------------------------------------------------------


@pytest.mark.parametrize(("renewal_ms", "met"), [(10.5, True), (50.0, True), (153.6, False)])
def test_lease_renewal_within_50_ms(renewal_ms: float, met: bool) -> None:
    assert lease.judge({"renewal_ms": renewal_ms, "accounts": 10_000})["met"] is met


def test_layout_needs_no_cycle_no_import_back_up_and_few_any() -> None:
    clean = {"any": 80, "cycles": [], "typing_cycles": [], "back_up": []}
    assert layout.judge(clean)["met"] is True
    for miss in ({"any": 81}, {"typing_cycles": [["a", "b"]]}, {"back_up": ["a -> b"]}):
        assert layout.judge(clean | miss)["met"] is False
