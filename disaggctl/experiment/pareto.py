"""``pareto``: fixed router policies (τ, ω) on a grid, below and at saturation (design §4, §8).

Llama-3.1-70B FP8 on 2P/4D (two prefill workers, so the prefill router has a choice as well),
a closed loop at C = 64 and C = 128, every cell of a 4×4 (τ, ω) grid held fixed on every router
(the policy table with all three regimes equal, so the controller never changes it), with one
router that sees load exactly (fresh) and with four router replicas whose load views arrive every
250 ms, 10 ms late (stale; ``ViewSettings.stale(4, report_period_s=0.25, delay_s=0.01)``, as
``bench/adaptive.py``). Per cell: throughput, TTFT P99, ITL P99, poa_hat and its factors, the
prefix-cache hit rate and the regime of the hold's TTFT P99 against the controller's thresholds
for that view (calibrated on the same traffic). The throughput–TTFT P99 frontier per (C, view)
shows which policies no other beats beyond the noise (better on one axis by more than the two
cells' combined standard errors, and not worse by that on the other); the policy table's entries
are (0, 1) below and (0.8, 0.1) saturated.

The traffic is agent trajectories (``cluster.sim.trajectories.TrajectorySource``, the chains shape
of docs/design.md §8): a shared 1k-token system prompt, a 1.5k-token task context per
trajectory (a retrieved document or a few source files), then four steps of 256 new tokens, each
prompt extending the last. Its hit rate depends on the router, which is the point: a step's
history is cached only on the prefill worker that prefilled the trajectory's earlier steps, so
a router that weighs overlap sends it back there and one that weighs load alone (ω = 0, or a
high τ) finds it there by chance. Why four steps of a 1.5k-token context rather than the chains'
eight steps of a 0.9k one: with two prefill workers a load-blind router has sent a trajectory to
both within a few steps, after which either one holds most of its history, and the hit rate
barely moves (0.82–0.83 over ten cells of {0, 0.3, 0.8, 2} × {0, 0.1, 1} at C = 128, one
seed); with the longer context and fewer steps it moves from 0.70 to 0.83 at C = 64. The calibration
workload (5 templates that every worker caches in seconds) hit 0.500 in every cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Any

from cluster.sim.trajectories import TrajectoryShape, TrajectorySource
from disaggctl.experiment.base import Plan, Settings, regime_of
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.frontier import mark_frontier
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, summarise

NAME = "pareto"
TITLE = "pareto: fixed (τ, ω) policies below and at saturation"
SECONDS_PER_UNIT = 0.131  # per simulated second of warm-up and hold, measured (runner.estimate)

PROFILE, TOPOLOGY = "b200-llama70b-fp8-tp4", "2P/4D"
CONCURRENCY = (64, 128)
VIEWS = ("fresh", "stale")
FULL_TAU, FULL_OMEGA = (0.0, 0.3, 0.8, 2.0), (0.0, 0.1, 0.5, 1.0)
QUICK_TAU, QUICK_OMEGA = (0.0, 0.8), (0.1, 1.0)
STATIC, SATURATED = (0.0, 1.0), (0.8, 0.1)  # the policy table's below and saturated entries
KEYS = (
    "throughput_rps",
    "ttft_p99_s",
    "itl_p99_s",
    "poa_hat",
    "poa_routing",
    "poa_capacity",
    "cache_hit_rate",
)
BREAKDOWN = ("tail_wait_s", "tail_prefill_s", "tail_other_s")
TABLE_KEYS = (
    "throughput_rps",
    "ttft_p99_s",
    "itl_p99_s",
    "poa_hat",
    "poa_routing",
    "cache_hit_rate",
)
DRAIN_S = 30.0
# The trajectories' shape (module docstring); TrajectoryShape's own defaults are the chains'.
WORKLOAD = TrajectoryShape(steps=4, task_tokens=1536)


def _source(seed: int) -> TrajectorySource:
    return TrajectorySource(WORKLOAD, seed=seed + 1)


def _views(view: str) -> Any:
    from cluster.sim.views import ViewSettings

    if view == "fresh":
        return ViewSettings()
    return ViewSettings.stale(replicas=4, report_period_s=0.25, delay_s=0.01)


def plan(settings: Settings) -> Plan:
    taus, omegas = (QUICK_TAU, QUICK_OMEGA) if settings.quick else (FULL_TAU, FULL_OMEGA)
    warm, hold = (6.0, 12.0) if settings.quick else (10.0, 30.0)
    setup = {
        "profile": PROFILE,
        "topology": TOPOLOGY,
        "concurrency C": list(CONCURRENCY),
        "τ grid": list(taus),
        "ω grid": list(omegas),
        "views": "fresh: 1 router, exact load; stale: 4 replicas, load reports every 0.25 s, "
        "0.01 s late (KV events 0.01 s late)",
        "warm-up s (ramp 2 s)": warm,
        "hold s (measured)": hold,
        "drain s (C = 0)": DRAIN_S,
        "workload": "agent trajectories, round robin (cluster.sim.trajectories): "
        + ", ".join(f"{k} {v}" for k, v in asdict(WORKLOAD).items()),
        "thresholds": "θ1, θ2 = 5×, 15× the calm TTFT P99 of the same view and workload "
        "(C = 32, 30 s)",
        "trials (seeds)": list(settings.seeds),
    }
    jobs = []
    for c in CONCURRENCY:
        for view in VIEWS:
            for tau in taus:
                for omega in omegas:
                    for seed in settings.seeds:
                        kw = {
                            "concurrency": c,
                            "view": view,
                            "tau": tau,
                            "omega": omega,
                            "seed": seed,
                            "warm_s": warm,
                            "hold_s": hold,
                        }
                        jobs.append(Job(f"{__name__}:run_cell", kw, units=warm + hold))
    return Plan(setup, jobs)


@lru_cache(maxsize=8)
def thresholds(view: str) -> tuple[float, float, float]:
    """(calm P99, θ1, θ2) of the deployment with ``view``'s routers (deterministic: cached)."""
    from cluster.sim.profile import load_profile
    from cluster.sim.scenario import calm_baseline_p99
    from controller.detector import Thresholds

    p99 = calm_baseline_p99(load_profile(PROFILE), TOPOLOGY, views=_views(view), source=_source(0))
    th = Thresholds.calibrated(p99)
    return p99, th.theta1, th.theta2


def run_cell(
    concurrency: int, view: str, tau: float, omega: float, seed: int, warm_s: float, hold_s: float
) -> dict[str, Any]:
    """One fixed policy at one load: the hold's figures."""
    from cluster.sim.loadgen import Phase
    from cluster.sim.profile import load_profile
    from cluster.sim.records import placements_digest
    from cluster.sim.scenario import NamedPhase, run_scenario
    from controller.detector import Thresholds
    from controller.policy import PolicyTable, RegimePolicy

    p99, theta1, theta2 = thresholds(view)
    policy = RegimePolicy(tau, omega)
    phases = [
        NamedPhase("warm", Phase(warm_s, concurrency, ramp=min(2.0, warm_s))),
        NamedPhase("hold", Phase(hold_s, concurrency)),
        NamedPhase("drain", Phase(DRAIN_S, 0)),
    ]
    result = run_scenario(
        load_profile(PROFILE),
        TOPOLOGY,
        phases,
        adaptive=True,
        seed=seed,
        views=_views(view),
        thresholds=Thresholds(theta1, theta2),
        table=PolicyTable(policy, policy, policy),
        source=_source(seed),
    )
    hold = result.phases[1]
    return {
        **{k: hold[k] for k in KEYS},
        **tail_breakdown(result.records, hold["start_s"], hold["end_s"]),
        "placements": placements_digest(result.records),
        "baseline_p99_s": p99,
        "theta1_s": theta1,
        "theta2_s": theta2,
    }


TAIL = 0.95  # the slowest 5% of first tokens: what TTFT P99 is made of


def tail_breakdown(records: Sequence[Any], start: float, end: float) -> dict[str, float | None]:
    """Where the slowest first tokens of the hold's arrivals spent their time, in seconds on
    average: waiting for a prefill worker (arrival to prefill start, admission included), the
    prefill itself (which the cached prefix shortens), and the rest (the KV transfer and the
    first decode step)."""
    tails = [
        r for r in records
        if start <= r.arrival < end and r.first_token is not None and r.prefill_start is not None
        and r.prefill_end is not None
    ]  # fmt: skip
    if not tails:
        return dict.fromkeys(BREAKDOWN)
    tails.sort(key=lambda r: r.first_token - r.arrival)
    tails = tails[int(TAIL * len(tails)) :]
    n = len(tails)
    return {
        "tail_wait_s": sum(r.prefill_start - r.arrival for r in tails) / n,
        "tail_prefill_s": sum(r.prefill_end - r.prefill_start for r in tails) / n,
        "tail_other_s": sum(r.first_token - r.prefill_end for r in tails) / n,
    }


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    groups: dict[tuple[int, str, float, float], list[dict[str, Any]]] = {}
    raw, th = [], {}
    for job, res in zip(plan.jobs, results, strict=True):
        kw = job.kwargs
        key = (kw["concurrency"], kw["view"], kw["tau"], kw["omega"])
        groups.setdefault(key, []).append(res)
        raw.append({**{k: kw[k] for k in ("concurrency", "view", "tau", "omega", "seed")}, **res})
        th[kw["view"]] = {k: res[k] for k in ("baseline_p99_s", "theta1_s", "theta2_s")}
    cells = []
    for (c, view, tau, omega), runs in groups.items():
        row: dict[str, Any] = {"concurrency": c, "view": view, "tau": tau, "omega": omega}
        row.update(summarise(runs, (*KEYS, *BREAKDOWN)))
        row["regime"] = regime_of(row["ttft_p99_s"], th[view]["theta1_s"], th[view]["theta2_s"])
        row["placements"] = tuple(r.get("placements") for r in runs)
        cells.append(row)
    for c in CONCURRENCY:
        for view in VIEWS:
            at = [r for r in cells if (r["concurrency"], r["view"]) == (c, view)]
            mark_same_runs(at)
            mark_frontier([r for r in at if r["same_as"] is None])
    return {"thresholds": th, "cells": cells, "trials": raw}


def mark_same_runs(cells: list[dict[str, Any]]) -> None:
    """``same_as``: the (τ, ω) of an earlier cell (in τ, ω order) whose runs placed every request
    on the same workers as this one's, seed for seed (``placements_digest``): the two are one
    run, shown once. None for a cell of its own."""
    first: dict[tuple[Any, ...], tuple[float, float]] = {}
    for cell in sorted(cells, key=lambda r: (r["tau"], r["omega"])):
        digests = cell["placements"]
        known = None if None in digests else first.get(digests)
        cell["same_as"] = known
        if known is None and None not in digests:
            first[digests] = (cell["tau"], cell["omega"])


def panel(
    data: dict[str, Any], c: int, view: str, *, distinct: bool = False
) -> list[dict[str, Any]]:
    """The cells of one (C, view); ``distinct``: without those that repeat another's run."""
    return [
        r
        for r in data["cells"]
        if (r["concurrency"], r["view"]) == (c, view) and not (distinct and r.get("same_as"))
    ]


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    # The figures' and the prose's modules read this one's grid: imported once it is loaded.
    from disaggctl.experiment.pareto_plots import plot_frontier, plot_heatmaps
    from disaggctl.experiment.pareto_prose import (
        describe_cache,
        describe_frontier,
        describe_heatmaps,
        describe_same_runs,
        describe_tails,
    )

    cells = sorted(
        data["cells"],
        key=lambda r: (r["concurrency"], VIEWS.index(r["view"]), r["tau"], r["omega"]),
    )
    write_csv(folder / "pareto_cells.csv", cells)
    write_csv(folder / "pareto_trials.csv", data["trials"])
    th = [
        (v, fmt(t["baseline_p99_s"]), fmt(t["theta1_s"]), fmt(t["theta2_s"]))
        for v, t in data["thresholds"].items()
    ]
    theta2 = {v: t["theta2_s"] for v, t in data["thresholds"].items()}
    section.text(
        "Thresholds (s):\n\n"
        + markdown_table(("view", "calm P99", "θ1", "θ2"), th)
        + "\n\nThe rule every regime below follows: the cell's hold TTFT P99 against its own "
        "view's thresholds, which come from a separate calm run (C = 32) and never from the "
        "cells. The views' thresholds differ ("
        + ", ".join(f"θ2 {v} {fmt(t)} s" for v, t in theta2.items())
        + "), so a TTFT P99 between them reads saturated with one view's and transition "
        "with the other's."
    )
    rows = [
        (
            r["concurrency"],
            r["view"],
            f"{r['tau']:g}",
            f"{r['omega']:g}",
            r["regime"] or "–",
            "yes" if r.get("frontier") else "",
            *(
                (stat_cell(r, k, 4 if k == "poa_routing" else 3) for k in TABLE_KEYS)
                if not r.get("same_as")
                else (f"the run of ({r['same_as'][0]:g}, {r['same_as'][1]:g})",) * len(TABLE_KEYS)
            ),
        )
        for r in cells
    ]
    header = (
        "C",
        "view",
        "τ",
        "ω",
        "regime",
        "frontier",
        "req/s",
        "TTFT P99 s",
        "ITL P99 s",
        "poa_hat",
        "poa_routing",
        "cache hit",
    )
    section.text("Per cell, mean ± 1 s.e.:\n\n" + markdown_table(header, rows))
    section.text(describe_same_runs(data))
    section.text(describe_cache(data))
    section.text(describe_tails(data))
    plot_frontier(data, folder / "pareto_frontier.png")
    section.figure(
        "pareto_frontier.png", "Throughput vs TTFT P99 per (C, view)", describe_frontier(data)
    )
    plot_heatmaps(data, folder / "pareto_heatmaps.png")
    section.figure(
        "pareto_heatmaps.png", "poa_hat and TTFT P99 per (τ, ω) cell", describe_heatmaps(data)
    )
