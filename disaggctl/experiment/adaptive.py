"""``adaptive``: the controller against static routing through a load ramp and a spike (§4, §8).

The cases, arms, phases and targets of ``bench/adaptive.py`` (imported, not copied): 70B and 340B
deployments with one fresh router, four stale router replicas, and the re-split lever; calm → ramp
through the knee → saturated hold → spike → calm. Static keeps τ = 0, ω = 1; adaptive runs the
controller with thresholds 5× and 15× a calm baseline measured on the same deployment; re-split
adds the controller's second lever. Every (case, arm, seed) is one simulation
(``bench.adaptive.run_arm``); at the first seed its controller timeline is kept for the plot. Per
phase: TTFT P99, ITL P99, throughput, poa_hat and its factors, pools; per case the saturated hold
of the compared arm over static's, paired by seed, and ``bench.adaptive.judge``'s verdict on its
targets.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from disaggctl.experiment import adaptive_plots
from disaggctl.experiment.base import Plan, Settings
from disaggctl.experiment.fanout import Job, bench_module
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, mean_se, summarise

NAME = "adaptive"
TITLE = "adaptive: the controller against static routing through a ramp and a spike"
SECONDS_PER_UNIT = 0.0365  # per simulated second of a run, measured (runner.estimate)
KEYS = (
    "poa_hat",
    "poa_routing",
    "poa_capacity",
    "ttft_p99_s",
    "itl_p99_s",
    "throughput_rps",
    "cache_hit_rate",
    "prefill_workers",
    "decode_workers",
)
RATIO_KEYS = ("ttft_p99_s", "poa_hat", "throughput_rps", "itl_p99_s")
TICK_FIELDS = (
    "t",
    "regime",
    "tau",
    "omega",
    "ttft_p99_window_s",
    "ttft_p99_smoothed_s",
    "poa_hat",
    "prefill_workers",
    "decode_workers",
    "queue_depth",
)
REGIMES = ("below", "transition", "saturated")


def bench() -> ModuleType:
    """``bench.adaptive``, imported from the project root."""
    return bench_module("adaptive")


def _phases(quick: bool) -> Any:
    A = bench()
    return A.REDUCED_PHASES if quick else A.PHASES


def plan(settings: Settings) -> Plan:
    A = bench()
    names = list(A.REDUCED_CASES) if settings.quick else [c.name for c in A.CASES]
    cases = [c for c in A.CASES if c.name in names]
    phases = _phases(settings.quick)
    span = sum(p.phase.duration for p in phases)
    setup = {
        "cases": [f"{c.name}: {c.profile} {c.topology}, arms {'/'.join(c.arms)}" for c in cases],
        "phases": [
            f"{p.name} {p.phase.duration:g} s to C = {p.phase.concurrency}"
            f"{f' (ramp {p.phase.ramp:g} s)' if p.phase.ramp else ''}"
            for p in phases
        ],
        "stale views": f"{A.STALE}",
        "thresholds": "θ1, θ2 = 5×, 15× the calm TTFT P99 of the same deployment",
        "targets (bench.adaptive)": f"stale: TTFT P99 and poa_hat ≤ {A.STALE_RATIO_MAX:g}× "
        f"static, throughput ≥ {A.STALE_THROUGHPUT_MIN:g}×; re-split: TTFT P99 ≤ "
        f"{A.RESPLIT_TTFT_MAX:g}×; every adaptive run reaches saturated",
        "trials (seeds)": list(settings.seeds),
        "timeline seed": settings.seeds[0],
    }
    jobs: list[Job] = []
    owner: dict[tuple[str, str, str, str, int], str] = {}  # a run's first case: it runs it
    for case in cases:
        for arm in case.arms:
            for seed in settings.seeds:
                first = owner.setdefault(run_key(case.name, arm, seed), case.name)
                if first != case.name:
                    continue
                kw = {
                    "case": case.name,
                    "arm": arm,
                    "seed": seed,
                    "quick": settings.quick,
                    "timeline": seed == settings.seeds[0],
                }
                jobs.append(Job(f"{__name__}:run_arm", kw, units=span))
    shared = [
        f"{c.name} {arm}: the runs of {owner[run_key(c.name, arm, settings.seeds[0])]}"
        for c in cases
        for arm in c.arms
        if owner[run_key(c.name, arm, settings.seeds[0])] != c.name
    ]
    if shared:
        setup["runs shared between cases (same deployment, views, arm and seeds)"] = shared
    return Plan(setup, jobs)


def run_key(case: str, arm: str, seed: int) -> tuple[str, str, str, str, int]:
    """What a run is made of (``bench.adaptive.arm_scenario``'s inputs besides the phases and
    thresholds, which follow from them): two (case, arm, seed) with one key are one run."""
    c = _case(case)
    views = json.dumps(c.views.record(), sort_keys=True, default=str)
    return c.profile, c.topology, views, arm, seed


def _case(name: str) -> Any:
    return next(c for c in bench().CASES if c.name == name)


@lru_cache(maxsize=16)
def thresholds(case: str) -> Any:
    """The case's thresholds, as ``bench.adaptive.main`` calibrates them (deterministic)."""
    from cluster.sim.profile import load_profile
    from cluster.sim.scenario import calm_baseline_p99
    from controller.detector import Thresholds

    c = _case(case)
    baseline = calm_baseline_p99(load_profile(c.profile), c.topology, views=c.views)
    return Thresholds.calibrated(baseline)


def run_arm(case: str, arm: str, seed: int, quick: bool, timeline: bool = False) -> dict[str, Any]:
    """``bench.adaptive``'s figures for one (case, arm, seed); with ``timeline``, also the
    controller's ticks of that very run (``timeline``: one dict per tick)."""
    A = bench()
    th = thresholds(case)
    result = A.arm_scenario(_case(case), arm, seed, _phases(quick), th)
    out: dict[str, Any] = A.arm_figures(result)
    out["thresholds_s"] = [th.theta1, th.theta2]
    if timeline:
        out["timeline"] = [{k: getattr(s, k) for k in TICK_FIELDS} for s in result.timeline]
    return out


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    A = bench()
    done: dict[tuple[str, str, str, str, int], dict[str, Any]] = {}
    owners: dict[tuple[str, str, str, str, int], str] = {}
    ticks: dict[tuple[str, str, str, str, int], Any] = {}
    seeds: list[int] = []
    for job, res in zip(plan.jobs, results, strict=True):
        kw = job.kwargs
        key = run_key(kw["case"], kw["arm"], kw["seed"])
        if "timeline" in res:
            ticks[key] = res.pop("timeline")
        done[key], owners[key] = {"seed": kw["seed"], **res}, kw["case"]
        seeds += [] if kw["seed"] in seeds else [kw["seed"]]
    # Every case's arms, a shared run read from its owner's job (``plan``).
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    timelines: dict[str, dict[str, Any]] = {}
    shared: dict[str, dict[str, str]] = {}
    for case in A.CASES:
        for arm in case.arms:
            keys = [run_key(case.name, arm, seed) for seed in seeds]
            if not all(k in done for k in keys):
                continue
            runs[(case.name, arm)] = [done[k] for k in keys]
            if keys[0] in ticks:
                timelines.setdefault(case.name, {})[arm] = ticks[keys[0]]
            if owners[keys[0]] != case.name:
                shared.setdefault(case.name, {})[arm] = owners[keys[0]]
    cases: dict[str, Any] = {}
    for case in A.CASES:
        if (case.name, case.arms[0]) not in runs:
            continue
        entry: dict[str, Any] = {
            "profile": case.profile,
            "topology": case.topology,
            "views": case.views.record(),
            "arms": list(case.arms),
            "compare": case.compare,
            "thresholds_s": runs[(case.name, "static")][0]["thresholds_s"],
            "shared": shared.get(case.name, {}),  # arm → the case whose runs it is
        }
        for arm in case.arms:
            arm_runs = runs[(case.name, arm)]
            phases = []
            for rows in zip(*[r["phases"] for r in arm_runs], strict=True):
                phases.append({"phase": rows[0]["phase"], **summarise(rows, KEYS)})
            entry[arm] = {
                "phases": phases,
                "bench_phases": A._mean_rows([r["phases"] for r in arm_runs]),
                "late_hold_ttft_p99_s": mean_se(r["late_hold_ttft_p99_s"] for r in arm_runs)[0],
                "regime_switches": [r["regime_switches"] for r in arm_runs],
                "resplits": [r["resplits"] for r in arm_runs],
            }
        entry["paired_hold_ratios"] = _paired(runs, case, A.HOLD)
        cases[case.name] = entry
    bench_view = {
        name: {**e, **{arm: {**e[arm], "phases": e[arm]["bench_phases"]} for arm in e["arms"]}}
        for name, e in cases.items()
    }
    summary = A.summarize_cases(bench_view)
    verdict = A.judge({"cases": bench_view, "summary": summary})
    for e in cases.values():
        for arm in e["arms"]:
            e[arm].pop("bench_phases")
    return {"cases": cases, "summary": summary, "verdict": verdict, "timelines": timelines}


def _paired(
    runs: dict[tuple[str, str], list[dict[str, Any]]], case: Any, hold: str
) -> dict[str, float | None]:
    """Per key: the compared arm's hold over static's, seed by seed, as mean ± s.e."""

    def hold_row(r: dict[str, Any]) -> dict[str, Any]:
        return next(p for p in r["phases"] if p["phase"] == hold)

    static = {r["seed"]: hold_row(r) for r in runs[(case.name, "static")]}
    other = {r["seed"]: hold_row(r) for r in runs[(case.name, case.compare)]}
    out = {}
    for key in RATIO_KEYS:
        ratios = [
            other[s][key] / static[s][key]
            for s in static
            if s in other and other[s][key] is not None and static[s][key]
        ]
        out[key], out[f"{key}_se"] = mean_se(ratios)
    # The hold's second half (``bench.adaptive.arm_figures``), paired the same way.
    late = {r["seed"]: r["late_hold_ttft_p99_s"] for r in runs[(case.name, "static")]}
    ratios = [
        r["late_hold_ttft_p99_s"] / late[r["seed"]]
        for r in runs[(case.name, case.compare)]
        if late.get(r["seed"]) and r["late_hold_ttft_p99_s"] is not None
    ]
    out["late_hold_ttft_p99_s"], out["late_hold_ttft_p99_s_se"] = mean_se(ratios)
    return out


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    from disaggctl.experiment.adaptive_prose import describe_timeline

    rows, csv_rows = [], []
    for name, e in data["cases"].items():
        for arm in e["arms"]:
            owner = e.get("shared", {}).get(arm)
            if owner is not None:  # one run shown once: where it was made
                rows.append((name, arm, "every", *([f"the runs of {owner}"] * 5), ""))
                continue
            for p in e[arm]["phases"]:
                csv_rows.append({"case": name, "arm": arm, **p})
                pools = f"{fmt(p['prefill_workers'])}P/{fmt(p['decode_workers'])}D"
                rows.append(
                    (
                        name,
                        arm,
                        p["phase"],
                        stat_cell(p, "ttft_p99_s"),
                        stat_cell(p, "itl_p99_s"),
                        stat_cell(p, "throughput_rps"),
                        stat_cell(p, "poa_hat"),
                        stat_cell(p, "poa_capacity"),
                        pools,
                    )
                )
    write_csv(folder / "adaptive_phases.csv", csv_rows)
    header = (
        "case",
        "arm",
        "phase",
        "TTFT P99 s",
        "ITL P99 s",
        "req/s",
        "poa_hat",
        "poa_capacity",
        "pools (time mean; a moving worker in neither)",
    )
    section.text("Per case, arm and phase, mean ± 1 s.e.:\n\n" + markdown_table(header, rows))
    summary_rows, summary_csv = [], []
    for name, e in data["cases"].items():
        r = e["paired_hold_ratios"]
        targets = {k: v for k, v in data["verdict"]["targets"].items() if k.startswith(f"{name}:")}
        met = (
            "–"
            if not targets
            else "met"
            if all(v["met"] for v in targets.values())
            else "missed: "
            + ", ".join(k.split(":", 1)[1] for k, v in targets.items() if not v["met"])
        )
        summary_rows.append(
            (
                name,
                e["compare"],
                stat_cell(r, "ttft_p99_s"),
                stat_cell(r, "poa_hat"),
                stat_cell(r, "throughput_rps"),
                stat_cell(r, "late_hold_ttft_p99_s"),
                met,
            )
        )
        summary_csv.append({"case": name, "arm": e["compare"], **r, "targets": met})
    write_csv(folder / "adaptive_summary.csv", summary_csv)
    detected = data["verdict"]["targets"].get("saturated_regime_detected", {})
    verdict = "met" if data["verdict"]["met"] else "missed"
    section.text(
        "Saturated hold, compared arm over static (paired by seed, mean ± 1 s.e.):\n\n"
        + markdown_table(
            (
                "case",
                "arm",
                "TTFT P99 ×",
                "poa_hat ×",
                "throughput ×",
                "late-hold TTFT P99 ×",
                "targets",
            ),
            summary_rows,
        )
        + f"\n\nEvery adaptive run reaches saturated: {detected.get('measured')}"
        + (f" (missed: {', '.join(detected.get('missed', []))})" if detected.get("missed") else "")
        + f". bench.adaptive's verdict over all targets: {verdict}."
    )
    for name, e in data["cases"].items():
        file = f"adaptive_timeline_{_slug(name)}.png"
        adaptive_plots.plot_timeline(name, e, data["timelines"].get(name, {}), setup, folder / file)
        section.figure(
            file,
            f"{name}: timeline of one seed",
            describe_timeline(name, e, data["verdict"], data["timelines"].get(name, {})),
        )
