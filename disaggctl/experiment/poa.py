"""``poa``: the Price of Anarchy across load, on the simulator (docs/design.md §3, §8).

A concurrency sweep (closed loop, C clients) on three deployments: Llama-3.1-70B FP8 1P/2D and
1P/5D, Nemotron-340B FP8 1P/2D. Every point is a static run (the router at τ = 0, ω = 1, no
controller): a warm-up ramping to C, a measured hold, then a drain at C = 0 so that every request
arriving in the hold finishes and counts (TTFT and ITL belong to the hold's arrivals, throughput
to its completions). Per point: poa_hat and its factors poa_routing and poa_capacity (the mean of
the estimator's ticks over the hold), TTFT P99, ITL P99, throughput, and the regime the
controller would call it, from the hold's TTFT P99 against thresholds at the deployment's own
knee (``controller.knee``: N* = X_max·R₀, where the closed loop's two throughput asymptotes
meet, from the sweep itself; θ2 the TTFT P99 there, θ1 = θ2/3), the knee of each label fitted
on the other points, so that no label uses the point it labels. The calm calibration (5× and
15× the calm P99) is reported beside it, with the regimes it would give.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disaggctl.experiment import plots
from disaggctl.experiment.base import Plan, Settings, regime_of
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.knee_labels import describe_thresholds, knee_thresholds
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, summarise

NAME = "poa"
TITLE = "poa: the Price of Anarchy across load"
SECONDS_PER_UNIT = 0.0167  # per simulated second of a point, measured (runner.estimate)

LLAMA, NEMOTRON = "b200-llama70b-fp8-tp4", "b200-nemotron340b-fp8-tp8"
CONFIGS = (
    ("70B 1P/2D", LLAMA, "1P/2D"),
    ("70B 1P/5D", LLAMA, "1P/5D"),
    ("340B 1P/2D", NEMOTRON, "1P/2D"),
)
FULL_C = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
QUICK_C = (1, 16, 64, 256)
KEYS = (
    "poa_hat",
    "poa_routing",
    "poa_capacity",
    "ttft_p99_s",
    "itl_p99_s",
    "throughput_rps",
    "cache_hit_rate",
    "completed",
)


def drain_s(concurrency: int) -> float:
    """Long enough for a saturated queue of C requests to clear (the slowest deployment serves
    ~19 requests/s: 340B 1P/2D)."""
    return 30.0 + 0.15 * concurrency


def plan(settings: Settings) -> Plan:
    cs = QUICK_C if settings.quick else FULL_C
    warm, hold = (8.0, 15.0) if settings.quick else (10.0, 30.0)
    setup = {
        "deployments": [f"{name} ({profile}, {topo})" for name, profile, topo in CONFIGS],
        "concurrency C": list(cs),
        "warm-up s (ramp 2 s)": warm,
        "hold s (measured)": hold,
        "drain s": "30 + 0.15·C (C = 0, lets the hold's requests finish)",
        "policy": "static: τ = 0, ω = 1, no controller",
        "thresholds": "at the knee N* = X_max·R₀ of the sweep's mean throughput: θ2 the TTFT "
        "P99 there, θ1 = θ2/3 (beside them 5×, 15× the calm TTFT P99: C = 32, 30 s, seed 0)",
        "regime labels": "each point against the knee fitted on the deployment's other points "
        "(leave one out), so no label uses the point it labels",
        "poa estimator": "window 256 requests, max age games.poa.MAX_AGE_S",
        "trials (seeds)": list(settings.seeds),
    }
    jobs = [
        Job(f"{__name__}:baseline", {"profile": profile, "topology": topo}, units=30.0)
        for _, profile, topo in CONFIGS
    ]
    for name, profile, topo in CONFIGS:
        for c in cs:
            for seed in settings.seeds:
                kw = {
                    "profile": profile,
                    "topology": topo,
                    "concurrency": c,
                    "seed": seed,
                    "warm_s": warm,
                    "hold_s": hold,
                    "config": name,
                }
                jobs.append(Job(f"{__name__}:run_point", kw, units=warm + hold + drain_s(c)))
    return Plan(setup, jobs)


def baseline(profile: str, topology: str) -> dict[str, float]:
    """The calm TTFT P99 and the calm calibration's thresholds on this deployment."""
    from cluster.sim.profile import load_profile
    from cluster.sim.scenario import calm_baseline_p99
    from controller.detector import Thresholds

    p99 = calm_baseline_p99(load_profile(profile), topology)
    th = Thresholds.calibrated(p99)
    return {"baseline_p99_s": p99, "calm_theta1_s": th.theta1, "calm_theta2_s": th.theta2}


def run_point(
    profile: str,
    topology: str,
    concurrency: int,
    seed: int,
    warm_s: float,
    hold_s: float,
    config: str = "",
) -> dict[str, Any]:
    """One static operating point: the hold's figures."""
    from cluster.sim.loadgen import Phase
    from cluster.sim.profile import load_profile
    from cluster.sim.records import placements_digest
    from cluster.sim.scenario import NamedPhase, run_scenario

    phases = [
        NamedPhase("warm", Phase(warm_s, concurrency, ramp=min(2.0, warm_s))),
        NamedPhase("hold", Phase(hold_s, concurrency)),
        NamedPhase("drain", Phase(drain_s(concurrency), 0)),
    ]
    result = run_scenario(load_profile(profile), topology, phases, adaptive=False, seed=seed)
    hold = result.phases[1]
    arrived = [r for r in result.records if hold["start_s"] <= r.arrival < hold["end_s"]]
    finished = [
        r for r in result.records
        if r.finished is not None and hold["start_s"] <= r.finished < hold["end_s"]
    ]  # fmt: skip
    return {
        **{k: hold[k] for k in KEYS},
        "unfinished": sum(1 for r in arrived if r.finished is None),
        "completed": len(finished),  # the hold's throughput × its length
        "shapes": len({(r.prompt_tokens, r.output_tokens) for r in result.records}),
        "placements": placements_digest(result.records),
    }


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    thresholds: dict[str, dict[str, float | None]] = {}
    trials: dict[tuple[str, int], list[dict[str, Any]]] = {}
    raw = []
    for job, res in zip(plan.jobs, results, strict=True):
        kw = job.kwargs
        if job.fn.endswith(":baseline"):
            name = next(n for n, p, t in CONFIGS if (p, t) == (kw["profile"], kw["topology"]))
            thresholds[name] = res
            continue
        trials.setdefault((kw["config"], kw["concurrency"]), []).append(res)
        raw.append(
            {"config": kw["config"], "concurrency": kw["concurrency"], "seed": kw["seed"], **res}
        )
    points = []
    for (name, c), runs in trials.items():
        row: dict[str, Any] = {"config": name, "concurrency": c, **summarise(runs, KEYS)}
        row["unfinished"] = sum(r["unfinished"] for r in runs)
        points.append(row)
    for name, th in thresholds.items():
        rows = [p for p in points if p["config"] == name]
        th.update(knee_thresholds(rows))
        calm = (float(th["calm_theta1_s"] or 0.0), float(th["calm_theta2_s"] or 0.0))
        at_knee = calm  # a sweep that misses the knee is labelled as the calm multiples say
        if th["theta1_s"] is not None and th["theta2_s"] is not None:
            at_knee = (th["theta1_s"], th["theta2_s"])
        for row in rows:
            # Labelled by a knee fitted on the other points: θ2 is a point's own TTFT P99 when
            # the knee falls on it, which would make its label true by construction.
            own = knee_thresholds([r for r in rows if r is not row])
            t1, t2 = own["theta1_s"], own["theta2_s"]
            loo = at_knee if t1 is None or t2 is None else (t1, t2)
            row["label_theta_s"] = loo
            row["regime"] = regime_of(row["ttft_p99_s"], *loo)
            row["calm_regime"] = regime_of(row["ttft_p99_s"], *calm)
    return {"thresholds": thresholds, "points": points, "trials": raw}


def _rows(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return sorted(
        (p for p in data["points"] if p["config"] == name), key=lambda p: p["concurrency"]
    )


def _knees(rows: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    first = {
        r: next((p["concurrency"] for p in rows if p["regime"] == r), None)
        for r in ("transition", "saturated")
    }
    return first["transition"], first["saturated"]


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    # The prose reads this module's deployments and rows: imported once it is loaded.
    from disaggctl.experiment.poa_prose import (
        describe_factors,
        describe_fixed_ceiling,
        describe_label_gaps,
        describe_latency,
    )

    points = sorted(
        data["points"],
        key=lambda p: ([n for n, _, _ in CONFIGS].index(p["config"]), p["concurrency"]),
    )
    write_csv(folder / "poa_points.csv", points)
    write_csv(folder / "poa_trials.csv", data["trials"])
    th_rows = [
        (
            n, fmt(t["knee_clients"]), fmt(t["theta1_s"]), fmt(t["theta2_s"]),
            fmt(t["baseline_p99_s"]), fmt(t["calm_theta1_s"]), fmt(t["calm_theta2_s"]),
        )
        for n, t in data["thresholds"].items()
    ]  # fmt: skip
    th_header = ("deployment", "knee N*", "θ1", "θ2", "calm P99", "calm θ1 (5×)", "calm θ2 (15×)")
    section.text(
        "Thresholds (seconds of TTFT P99; the regimes below use the knee fitted on every point "
        "but the one labelled, beside these fitted on all):\n\n"
        + markdown_table(th_header, th_rows)
        + "\n\n"
        + describe_thresholds(data)
    )
    rows = [
        (
            p["config"],
            p["concurrency"],
            p["regime"] or "–",
            stat_cell(p, "poa_hat"),
            stat_cell(p, "poa_routing", 4),
            stat_cell(p, "poa_capacity"),
            stat_cell(p, "ttft_p99_s"),
            stat_cell(p, "itl_p99_s"),
            stat_cell(p, "throughput_rps"),
        )
        for p in points
    ]
    header = (
        "deployment",
        "C",
        "regime",
        "poa_hat",
        "poa_routing",
        "poa_capacity",
        "TTFT P99 s",
        "ITL P99 s",
        "req/s",
    )
    section.text("Per point, mean ± 1 s.e.:\n\n" + markdown_table(header, rows))
    section.text(describe_fixed_ceiling(data))
    gaps = describe_label_gaps(data)
    if gaps:
        section.text(gaps)
    _plot_factors(data, folder / "poa_factors.png")
    section.figure(
        "poa_factors.png", "poa_hat and its factors vs concurrency", describe_factors(data)
    )
    _plot_latency(data, folder / "poa_latency.png")
    section.figure(
        "poa_latency.png", "Latency and throughput vs concurrency", describe_latency(data)
    )


def _plot_factors(data: dict[str, Any], path: Path) -> None:
    fig, axes = plots.plt.subplots(1, len(CONFIGS), figsize=(13, 4), sharey=True)
    for ax, (name, _, _) in zip(axes, CONFIGS, strict=True):
        rows = _rows(data, name)
        cs = [p["concurrency"] for p in rows]
        ax.set_xscale("log")
        ax.set_yscale("log")
        plots.shade_regimes(ax, cs, [p["regime"] for p in rows])
        for key, colour in (
            ("poa_hat", "black"),
            ("poa_routing", "tab:blue"),
            ("poa_capacity", "tab:orange"),
        ):
            plots.errorbar(ax, cs, rows, key, color=colour, label=key)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(name)
        ax.set_xlabel("concurrency C")
    axes[0].set_ylabel("PoA (log)")
    axes[0].legend(loc="upper left", fontsize=8)
    plots.save(fig, path)


def _plot_latency(data: dict[str, Any], path: Path) -> None:
    fig, axes = plots.plt.subplots(3, len(CONFIGS), figsize=(13, 9), sharex=True)
    for j, (name, _, _) in enumerate(CONFIGS):
        rows = _rows(data, name)
        cs = [p["concurrency"] for p in rows]
        th = data["thresholds"].get(name, {})
        for i, (key, label) in enumerate(
            (
                ("ttft_p99_s", "TTFT P99 s"),
                ("itl_p99_s", "ITL P99 s"),
                ("throughput_rps", "throughput req/s"),
            )
        ):
            ax = axes[i][j]
            ax.set_xscale("log")
            plots.shade_regimes(ax, cs, [p["regime"] for p in rows])
            plots.errorbar(ax, cs, rows, key, color="black")
            if i == 0:
                ax.set_yscale("log")
                for theta in ("theta1_s", "theta2_s"):
                    if th.get(theta) is not None:
                        ax.axhline(th[theta], ls="--", lw=0.8, color="grey")
                ax.set_title(name)
            if j == 0:
                ax.set_ylabel(label)
            if i == 1 and j == 0:
                plots.regime_legend(ax, loc="upper left")
            if i == 2:
                ax.set_xlabel("concurrency C")
    plots.save(fig, path)
