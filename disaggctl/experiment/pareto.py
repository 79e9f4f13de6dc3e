"""``pareto``: fixed router policies (τ, ω) on a grid, below and at saturation (design §4, §8).

Llama-3.1-70B FP8 on 2P/4D (two prefill workers, so the prefill router has a choice as well),
a closed loop at C = 64 and C = 128, every cell of a 4×4 (τ, ω) grid held fixed on every router
(the policy table with all three regimes equal, so the controller never changes it), with one
router that sees load exactly (fresh) and with four router replicas whose load views arrive every
250 ms, 10 ms late (stale; ``ViewSettings.stale(4, report_period_s=0.25, delay_s=0.01)``, as
``bench/adaptive.py``). Per cell: throughput, TTFT P99, ITL P99, poa_hat and its factors, the
prefix-cache hit rate and the regime of the hold's TTFT P99 against the controller's thresholds
for that view. The throughput–TTFT P99 frontier per (C, view) shows which policies no other
beats beyond the noise (better on one axis by more than the two cells' combined standard errors,
and not worse by that on the other); the policy table's entries are (0, 1) below and (0.8, 0.1)
saturated.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from disaggctl.experiment import plots
from disaggctl.experiment.base import Plan, Settings, regime_of
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.frontier import mark_frontier
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, routing_share, summarise

NAME = "pareto"
TITLE = "pareto: fixed (τ, ω) policies below and at saturation"
SECONDS_PER_UNIT = 0.035  # per simulated second of warm-up and hold, measured (runner.estimate)

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
DRAIN_S = 30.0


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
        "thresholds": "θ1, θ2 = 5×, 15× the calm TTFT P99 of the same view (C = 32, 30 s)",
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

    p99 = calm_baseline_p99(load_profile(PROFILE), TOPOLOGY, views=_views(view))
    th = Thresholds.calibrated(p99)
    return p99, th.theta1, th.theta2


def run_cell(
    concurrency: int, view: str, tau: float, omega: float, seed: int, warm_s: float, hold_s: float
) -> dict[str, Any]:
    """One fixed policy at one load: the hold's figures."""
    from cluster.sim.loadgen import Phase
    from cluster.sim.profile import load_profile
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
    )
    hold = result.phases[1]
    return {
        **{k: hold[k] for k in KEYS},
        "baseline_p99_s": p99,
        "theta1_s": theta1,
        "theta2_s": theta2,
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
        row.update(summarise(runs, KEYS))
        row["regime"] = regime_of(row["ttft_p99_s"], th[view]["theta1_s"], th[view]["theta2_s"])
        cells.append(row)
    for c in CONCURRENCY:
        for view in VIEWS:
            mark_frontier([r for r in cells if (r["concurrency"], r["view"]) == (c, view)])
    return {"thresholds": th, "cells": cells, "trials": raw}


def _panel(data: dict[str, Any], c: int, view: str) -> list[dict[str, Any]]:
    return [r for r in data["cells"] if (r["concurrency"], r["view"]) == (c, view)]


def _cell(rows: list[dict[str, Any]], policy: tuple[float, float]) -> dict[str, Any] | None:
    return next((r for r in rows if (r["tau"], r["omega"]) == policy), None)


def _pct(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "–"
    return f"{100 * (a / b - 1):+.0f}%"


def _worse(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    """a's mean above b's by more than their combined standard errors."""
    ea, eb = a.get(f"{key}_se") or 0.0, b.get(f"{key}_se") or 0.0
    return bool(a[key] is not None and b[key] is not None and a[key] - b[key] > ea + eb)


def describe_frontier(data: dict[str, Any]) -> str:
    parts, against = [], []
    for c in CONCURRENCY:
        for view in VIEWS:
            rows = [r for r in _panel(data, c, view) if r["ttft_p99_s"] is not None]
            if not rows:
                continue
            best = min(rows, key=lambda r: r["ttft_p99_s"])
            static, sat = _cell(rows, STATIC), _cell(rows, SATURATED)
            tp = [r["throughput_rps"] for r in rows if r["throughput_rps"]]
            regime = static["regime"] if static else best["regime"]
            text = (
                f"C = {c}, {view} views (static (0, 1) in the {regime} regime): lowest TTFT P99 at "
                f"(τ, ω) = ({best['tau']:g}, {best['omega']:g}), {fmt(best['ttft_p99_s'])} s"
            )
            if static:
                text += f", {_pct(best['ttft_p99_s'], static['ttft_p99_s'])} against static (0, 1)"
            if sat:
                on = "on" if sat.get("frontier") else "off"
                text += (
                    f"; the saturated entry (0.8, 0.1) is {on} the frontier, "
                    f"{_pct(sat['ttft_p99_s'], static['ttft_p99_s'] if static else None)} "
                    f"TTFT P99 against static"
                )
                if (
                    static
                    and regime in ("transition", "saturated")
                    and _worse(sat, static, "ttft_p99_s")
                ):
                    against.append(
                        f"at C = {c} with {view} views the saturated policy (0.8, 0.1) "
                        f"has a higher TTFT P99 than static (0, 1)"
                    )
            if tp:
                text += f"; throughput varies by {100 * (max(tp) / min(tp) - 1):.1f}% across cells"
            parts.append(text)
            if c == max(CONCURRENCY) and regime == "below":
                against.append(
                    f"C = {c} was meant to be at saturation, but with {view} views "
                    "static (0, 1) stays below the controller's first threshold"
                )
            if static and static["regime"] == "below" and _worse(static, best, "ttft_p99_s"):
                against.append(
                    f"at C = {c} with {view} views the below-saturation policy (0, 1) "
                    f"is not the best cell"
                )
    text = (
        "Throughput against TTFT P99 per cell (mean ± 1 s.e.), the frontier joined. "
        + "; ".join(parts)
        + ". In a closed loop throughput is C over the request time, so "
        "cells differ mostly in latency."
    )
    if against:
        text += " Against what the policy table intends: " + "; ".join(against) + "."
    return text


def describe_heatmaps(data: dict[str, Any]) -> str:
    from scipy.stats import spearmanr

    parts, against = [], []
    for c in CONCURRENCY:
        for view in VIEWS:
            rows = [
                r
                for r in _panel(data, c, view)
                if r["poa_hat"] is not None and r["ttft_p99_s"] is not None
            ]
            if len(rows) < 3:
                continue
            lo = min(rows, key=lambda r: r["poa_hat"])
            hi = max(rows, key=lambda r: r["poa_hat"])
            rho = float(spearmanr([r["poa_hat"] for r in rows], [r["ttft_p99_s"] for r in rows])[0])
            text = (
                f"C = {c}, {view}: poa_hat from {fmt(lo['poa_hat'])} at ({lo['tau']:g}, "
                f"{lo['omega']:g}) to {fmt(hi['poa_hat'])} at ({hi['tau']:g}, "
                f"{hi['omega']:g}), rank correlation with TTFT P99 {rho:+.2f}"
            )
            share = routing_share(rows)
            if share is not None:
                text += f", {100 * share:.0f}% of its spread in log poa_routing"
            parts.append(text)
            if not rho > 0.5:
                against.append(f"C = {c}, {view}")
    text = "poa_hat per (τ, ω) cell (left) and TTFT P99 (right). " + "; ".join(parts) + "."
    text += (
        " The share in log poa_routing is cov(log poa_routing, log poa_hat) / var(log poa_hat)"
        " across the panel's cells; the rest is in log poa_capacity. In this closed loop a herd"
        " also bunches the clients' next requests, which no routing of those requests undoes,"
        " so part of a policy's cost shows as capacity (with open-loop arrivals, where only the"
        " routing differs, most of it is in poa_routing:"
        " tests/games/test_poa_split_on_simulator.py)."
    )
    if against:
        text += (
            " Where poa_hat should rank policies as their latency does, it does not clearly "
            "(rank correlation ≤ 0.5): " + ", ".join(against) + "."
        )
    else:
        text += " poa_hat ranks the policies as their TTFT P99 does in every panel."
    return text


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
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
    section.text("Thresholds (s):\n\n" + markdown_table(("view", "calm P99", "θ1", "θ2"), th))
    rows = [
        (
            r["concurrency"],
            r["view"],
            f"{r['tau']:g}",
            f"{r['omega']:g}",
            r["regime"] or "–",
            "yes" if r.get("frontier") else "",
            stat_cell(r, "throughput_rps"),
            stat_cell(r, "ttft_p99_s"),
            stat_cell(r, "itl_p99_s"),
            stat_cell(r, "poa_hat"),
            stat_cell(r, "poa_routing", 4),
            stat_cell(r, "cache_hit_rate"),
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
    _plot_frontier(data, folder / "pareto_frontier.png")
    section.figure(
        "pareto_frontier.png", "Throughput vs TTFT P99 per (C, view)", describe_frontier(data)
    )
    _plot_heatmaps(data, folder / "pareto_heatmaps.png")
    section.figure(
        "pareto_heatmaps.png", "poa_hat and TTFT P99 per (τ, ω) cell", describe_heatmaps(data)
    )


def _plot_frontier(data: dict[str, Any], path: Path) -> None:
    fig, axes = plots.plt.subplots(len(CONCURRENCY), len(VIEWS), figsize=(11, 8.5))
    for i, c in enumerate(CONCURRENCY):
        for j, view in enumerate(VIEWS):
            ax, rows = axes[i][j], _panel(data, c, view)
            for r in rows:
                policy = (r["tau"], r["omega"])
                colour = (
                    "tab:blue" if policy == STATIC else "tab:red" if policy == SATURATED else "grey"
                )
                ax.errorbar(
                    r["ttft_p99_s"],
                    r["throughput_rps"],
                    xerr=r["ttft_p99_s_se"] or 0,
                    yerr=r["throughput_rps_se"] or 0,
                    fmt="o",
                    ms=4,
                    color=colour,
                    capsize=2,
                )
                ax.annotate(
                    f"{r['tau']:g},{r['omega']:g}",
                    (r["ttft_p99_s"], r["throughput_rps"]),
                    fontsize=6,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
            front = sorted(
                (r for r in rows if r.get("frontier") and r["ttft_p99_s"] is not None),
                key=lambda r: r["ttft_p99_s"],
            )
            ax.plot(
                [r["ttft_p99_s"] for r in front],
                [r["throughput_rps"] for r in front],
                color="black",
                lw=1,
            )
            ax.set_title(f"C = {c}, {view} views (blue: (0, 1), red: (0.8, 0.1))", fontsize=9)
            ax.set_xlabel("TTFT P99 s")
            ax.set_ylabel("throughput req/s")
    plots.save(fig, path)


def _plot_heatmaps(data: dict[str, Any], path: Path) -> None:
    taus = sorted({r["tau"] for r in data["cells"]})
    omegas = sorted({r["omega"] for r in data["cells"]})
    panels = [(c, v) for c in CONCURRENCY for v in VIEWS]
    fig, axes = plots.plt.subplots(len(panels), 2, figsize=(9, 3.2 * len(panels)))
    for i, (c, view) in enumerate(panels):
        rows = _panel(data, c, view)
        for j, (key, label) in enumerate((("poa_hat", "poa_hat"), ("ttft_p99_s", "TTFT P99 s"))):
            grid = np.full((len(taus), len(omegas)), np.nan)
            for r in rows:
                if r[key] is not None:
                    grid[taus.index(r["tau"]), omegas.index(r["omega"])] = r[key]
            ax = axes[i][j]
            im = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto")
            for (a, b), v in np.ndenumerate(grid):
                ax.text(b, a, fmt(float(v)), ha="center", va="center", fontsize=7, color="white")
            ax.set_xticks(range(len(omegas)), [f"{o:g}" for o in omegas])
            ax.set_yticks(range(len(taus)), [f"{t:g}" for t in taus])
            ax.set_xlabel("ω")
            ax.set_ylabel("τ")
            ax.set_title(f"{label}, C = {c}, {view}", fontsize=9)
            fig.colorbar(im, ax=ax)
    plots.save(fig, path)
