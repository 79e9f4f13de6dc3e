"""``disaggctl experiment controller``'s analysis and report (disaggctl/experiment/controller.py)
on made-up runs: the hindsight-best static arm, ratios with their errors paired by seed, one run
shown once, the planner's missing install named, and a report the referee's checks pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import controller as bench
from disaggctl.experiment import controller as experiment
from disaggctl.experiment.base import Plan
from disaggctl.experiment.checks import report_problems
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.report import Section, render

SEEDS = (0, 1, 2)


def figures(arm: str, topology: str, sim: str, seed: int) -> dict[str, Any]:
    """P99 falls with prefill workers; ours routing is affinity's run; ours re-split in
    between; the planner saves workers."""
    p = int(topology[0])
    p99 = 40.0 / p + (0.5 if arm == "static:0.8,0.1" else 0.0) + 0.1 * seed
    if arm == "ours routing+resplit":
        p99 = 12.0 + 0.1 * seed
    if arm == bench.KV_BOTH:
        p99 = 9.0 + 0.1 * seed
    if arm == "dynamo planner":
        p99 = 20.0 + 0.1 * seed
    if arm == "study table":
        p99 += 0.2
    if sim == "dynamo":  # the other simulator's figures are its own
        p99 *= 0.9
    return {
        "ttft_p50_s": p99 / 5, "ttft_p99_s": p99, "goodput": min(1.0, 2.0 / p99),
        "worker_s": 3000.0 if arm == "dynamo planner" else 8000.0 + seed,
        "moves": 4 if arm in bench.MOVING else 0, "requests": 3658,
    }  # fmt: skip


def made_up(missing_planner: bool = False) -> tuple[Plan, list[Any]]:
    jobs, results = [], []
    for file, speedup in bench.TRACES.values():
        for seed in SEEDS:
            for sim, arm, topology in bench.arms():
                fn = "bench.controller:run_ours" if sim == "ours" else "bench.controller:run_dynamo"
                jobs.append(Job(fn, {"trace": f"/t/{file}", "window_s": 1200.0,
                                     "speedup": speedup, "arm": arm, "topology": topology,
                                     "theta": (1.0, 3.0), "seed": seed}))  # fmt: skip
                if missing_planner and arm == "dynamo planner":
                    results.append({"missing": "Dynamo's planner needs `make planner`"})
                else:
                    results.append(figures(arm, topology, sim, seed))
    setup = {"traces": {n: {"file": f, "speed-up": s, "thresholds θ1, θ2 (s)": (1.0, 3.0)}
                        for n, (f, s) in bench.TRACES.items()}}  # fmt: skip
    return Plan(setup, jobs), results


def test_the_analysis_picks_the_best_static_arm_and_pairs_ratios_by_seed() -> None:
    plan, results = made_up()
    data = experiment.analyse(plan, results)
    ours = data["mooncake"]["ours"]
    assert ours["best"] == "static:0,1 5P/1D"  # 40/5 = 8 s, the least
    mine = ours["rows"]["ours routing+resplit"]
    ratio, se = mine["over_best"]
    assert abs(ratio - 12.1 / 8.1) < 1e-9 and se is not None and se > 0
    assert ours["rows"]["ours routing 3P/3D"]["same_as"] == "static:0,1 3P/3D"
    dynamo = data["mooncake"]["dynamo"]["rows"]
    assert abs(dynamo["ours routing+resplit"]["over_planner"][0] - 12.1 / 20.1) < 1e-9
    over = ours["rows"]["ours routing+resplit"]["over_planner"][0]  # the planner in ours too
    assert abs(over - 12.1 / 20.1) < 1e-9


def test_the_report_passes_the_referees_checks(tmp_path: Path) -> None:
    plan, results = made_up()
    section = Section(experiment.NAME, experiment.TITLE)
    experiment.report(experiment.analyse(plan, results), plan.setup, tmp_path, section)
    text = render(section)
    assert report_problems(text) == []
    assert "the run of static:0,1 1P/5D" in text  # ours routing, shown once
    assert "hindsight-best static: static:0,1 5P/1D" in text
    assert "10% better nowhere" in text
    assert experiment.KV_BOTH == bench.KV_BOTH
    assert "without a restart (kv_both) it reads 9.10 s" in text
    assert "it loses to hindsight-best static: static:0,1 5P/1D" in text
    assert "it loses to hindsight-best static: static:0,1 5P/1D (1.49×), ours" not in text
    assert (tmp_path / "controller_p99.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "controller.csv").is_file()


def test_a_planner_that_could_not_run_is_named_not_hidden(tmp_path: Path) -> None:
    plan, results = made_up(missing_planner=True)
    section = Section(experiment.NAME, experiment.TITLE)
    experiment.report(experiment.analyse(plan, results), plan.setup, tmp_path, section)
    assert "Dynamo's planner needs `make planner`" in render(section)
