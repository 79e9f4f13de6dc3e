"""``autobid``: pacing autobidders in repeated auctions, against truthful bidding and the κ bound.

A stationary workload (``bench/autobidder.py``'s: batches drawn from a few radix trees of
``mixshare-50``, fresh values 1 + Pareto(1.5) every batch, ``dfs-bid`` order and VCG prices), some
pacing users and the rest truthful. A pacing user's per-batch budget γ is a fraction of what it
pays when everyone bids truthfully (a pilot run); the spread of those fractions across the pacing
users makes their multipliers α differ, which is what costs welfare (docs/design.md §1,
"Heterogeneous pacing"). Per batch, under the true values: the welfare of the paced bids'
schedule, of the schedule single-shot truthful bidding would get (``dfs-bid`` on the values: the
best DFS schedule), and the κ bound ``pacing_welfare_bound`` that the paced welfare must meet.
Per pacing user: regret against the best fixed α in hindsight (``auction/regret.py``), as T grows
(theory: O(√T), a log-log slope of ½).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from disaggctl.experiment import plots
from disaggctl.experiment.base import Plan, Settings
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, fmt_mean_se, summarise

NAME = "autobid"
TITLE = "autobid: pacing autobidders in repeated auctions and the κ bound"
SECONDS_PER_UNIT = 0.0018  # per batch of a run (pacing, regret, bound), measured

SPREADS = {
    "equal": (0.5, 0.5, 0.5),
    "mild": (0.35, 0.5, 0.7),
    "wide": (0.2, 0.5, 1.0),
    "extreme": (0.05, 0.3, 1.0),
}
FULL_T, QUICK_T = (100, 400, 1600, 6400), (50, 200)
WORKLOAD, N, USERS, SHAPES, PILOT_T = "mixshare-50", 64, 12, 4, 400
KEYS = (
    "welfare_ratio",
    "bound_ratio",
    "pct_above_half_pacing",
    "pct_above_half_truthful",
    "bound_holds",
    "regret",
    "regret_per_batch",
    "spend_over_budget",
    "alpha_mean",
)
SLOPE_TARGET = 0.6  # bench.autobidder's ceiling on the log-log slope


def plan(settings: Settings) -> Plan:
    horizons = QUICK_T if settings.quick else FULL_T
    from auction.pacing import DEFAULT_ETA_SCALE, DEFAULT_MU_MAX

    setup = {
        "workload": f"{WORKLOAD}, n = {N} per batch, {USERS} users, {SHAPES} tree shapes",
        "values": "1 + Pareto(1.5), fresh every batch; truthful users bid them",
        "pacing users": len(next(iter(SPREADS.values()))),
        "budget spreads (γ / truthful spend, per pacing user)": [
            f"{k}: {', '.join(f'{f:g}' for f in v)}" for k, v in SPREADS.items()
        ],
        "pilot (truthful spend)": f"T = {PILOT_T}, seed + 10000",
        "horizons T": list(horizons),
        "η": f"eta_scale/(γ·√T), eta_scale = {DEFAULT_ETA_SCALE:g}",
        "μ_max": DEFAULT_MU_MAX,
        "scheduler and prices": "dfs-bid, VCG",
        "trials (seeds)": list(settings.seeds),
    }
    jobs = [
        Job(f"{__name__}:run_repeated", {"spread": s, "T": T, "seed": seed}, units=T + PILOT_T / 4)
        for s in SPREADS
        for T in horizons
        for seed in settings.seeds
    ]
    return Plan(setup, jobs)


def run_repeated(spread: str, T: int, seed: int) -> dict[str, Any]:
    """One repeated auction: welfare against truthful and the bound, and each pacer's regret."""
    import numpy as np

    from auction.pacing_bound import pacing_welfare_bound
    from auction.radix import build_radix_tree
    from auction.regret import autobidder_regret
    from auction.repeated import simulate, stationary_source
    from auction.schedulers import dfs_bid_order
    from auction.welfare import welfare
    from cluster.workloads import make_workload, pareto_values

    trees = [
        build_radix_tree(make_workload(WORKLOAD, N, users=USERS, seed=seed + k).requests)
        for k in range(SHAPES)
    ]
    source = stationary_source(trees, pareto_values)
    users = [f"user{i}" for i in range(USERS)]
    pilot = simulate(source, PILOT_T, {}, users=users, seed=seed + 10_000)
    spend = pilot.payments.mean(axis=0)
    gamma = {
        users[i]: f * float(spend[pilot.users.index(users[i])])
        for i, f in enumerate(SPREADS[spread])
    }
    result = simulate(source, T, gamma, users=users, seed=seed + 100_000 + T)
    paced = truthful = bound = half = 0.0
    holds = 0
    for batch, bids in zip(result.batches, result.bids, strict=True):
        v = batch.values
        w = welfare(dfs_bid_order(batch.tree, bids), v)
        b = pacing_welfare_bound(batch.tree, v, bids)
        paced += w
        truthful += welfare(dfs_bid_order(batch.tree, v), v)
        bound += b
        half += 0.5 * float(v.sum())
        holds += w >= b * (1 - 1e-12) - 1e-12
    regrets = [autobidder_regret(result, u) for u in gamma]
    return {
        "welfare_ratio": paced / truthful,
        "bound_ratio": bound / truthful,
        "pct_above_half_pacing": 100 * (paced / half - 1),
        "pct_above_half_truthful": 100 * (truthful / half - 1),
        "bound_holds": holds / T,
        "regret": float(np.mean([r.regret for r in regrets])),
        "regret_per_batch": float(np.mean([r.regret for r in regrets])) / T,
        "regret_by_user": [r.regret for r in regrets],
        "spend_over_budget": float(np.mean([r.spend / r.budget for r in regrets])),
        "alpha_mean": float(result.alpha_capped.mean()),
        "gamma": list(gamma.values()),
    }


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    from auction.regret import loglog_slope

    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    raw = []
    for job, res in zip(plan.jobs, results, strict=True):
        kw = job.kwargs
        groups.setdefault((kw["spread"], kw["T"]), []).append(res)
        raw.append({"spread": kw["spread"], "T": kw["T"], "seed": kw["seed"], **res})
    rows: list[dict[str, Any]] = [
        {"spread": s, "T": T, **summarise(runs, KEYS)} for (s, T), runs in groups.items()
    ]
    slopes, tail_slopes = {}, {}
    for s in SPREADS:
        pts = sorted((int(r["T"]), float(r["regret"] or 0.0)) for r in rows if r["spread"] == s)
        slopes[s] = loglog_slope([t for t, _ in pts], [g for _, g in pts])
        # The slope between the two longest horizons: the whole-range fit averages in the short
        # horizons, where regret has not yet reached its asymptotic growth.
        tail = pts[-2:]
        tail_slopes[s] = loglog_slope([t for t, _ in tail], [g for _, g in tail])
    return {"rows": rows, "slopes": slopes, "tail_slopes": tail_slopes, "trials": raw}


def _at(data: dict[str, Any], spread: str) -> list[dict[str, Any]]:
    return sorted((r for r in data["rows"] if r["spread"] == spread), key=lambda r: r["T"])


def describe_welfare(data: dict[str, Any]) -> str:
    parts, against = [], []
    last = {}
    for s in SPREADS:
        rows = _at(data, s)
        if not rows:
            continue
        r = last[s] = rows[-1]
        paced = fmt_mean_se(_pc(r, "welfare_ratio"), _pc(r, "welfare_ratio_se"))
        parts.append(
            f"{s}: paced welfare {paced}% of truthful, bound {fmt(_pc(r, 'bound_ratio'))}%"
        )
        worst = min(x["bound_holds"] for x in rows if x["bound_holds"] is not None)
        if worst < 1.0:
            against.append(
                f"under {s} the paced welfare falls below the κ bound in "
                f"{100 * (1 - worst):.1f}% of batches"
            )
        if any((x["welfare_ratio"] or 0) > 1 + 1e-9 for x in rows):
            against.append(f"under {s} paced bids beat the truthful DFS optimum, which they cannot")
    T = max(r["T"] for r in data["rows"])
    text = (
        f"Welfare under the true values, as a share of what single-shot truthful bidding gets "
        f"(dfs-bid on the values), against T; dashed: the κ bound. At T = {T}: "
        + "; ".join(parts)
        + "."
    )
    if against:
        text += " Against the theory: " + "; ".join(against) + "."
    else:
        text += " The bound holds in every batch of every run."
    ordered = [s for s in SPREADS if s in last]
    if len(ordered) >= 2:
        a, b = last[ordered[0]]["welfare_ratio"], last[ordered[-1]]["welfare_ratio"]
        if a is not None and b is not None:
            text += f" From the {ordered[0]} to the {ordered[-1]} spread the paced welfare " + (
                f"drops by {100 * (a - b):.1f} points: unequal pacing reverses more "
                "siblings, as the bound's κ says."
                if b < a
                else f"does not drop ({100 * (b - a):+.1f} points): the spread of budgets did "
                "not cost welfare here."
            )
    return text


def _pc(row: dict[str, Any], key: str) -> float | None:
    return None if row.get(key) is None else 100 * row[key]


def describe_regret(data: dict[str, Any]) -> str:
    parts, against = [], []
    tails = data.get("tail_slopes", {})
    for s, slope in data["slopes"].items():
        rows = _at(data, s)
        tail = tails.get(s)
        beaten = [r["T"] for r in rows if r["regret"] is not None and r["regret"] <= 0]
        text = f"{s}: slope {fmt(slope)}" if slope is not None else f"{s}: no slope (regret ≤ 0)"
        if tail is not None and len(rows) > 2:
            text += f" ({fmt(tail)} between T = {rows[-2]['T']} and {rows[-1]['T']})"
        if beaten:
            text += f", the autobidder beats every fixed α at T = {', '.join(map(str, beaten))}"
        if rows:
            text += f", regret per batch {fmt(rows[-1]['regret_per_batch'])} at T = {rows[-1]['T']}"
        parts.append(text)
        if slope is not None and slope > SLOPE_TARGET:
            against.append(f"{s} grows faster than √T (slope {fmt(slope)} > {SLOPE_TARGET:g})")
        elif tail is not None and tail > SLOPE_TARGET and len(rows) > 2:
            against.append(
                f"{s} grows as T^{fmt(tail)} between its two longest horizons, faster than "
                f"T^{SLOPE_TARGET:g}, though its whole-range fit ({fmt(slope)}) does not"
            )
    text = (
        "Mean regret of the pacing users against the best fixed α in hindsight, log-log "
        "against T (theory: slope ½). " + "; ".join(parts) + "."
    )
    if against:
        text += " Against the O(√T) guarantee: " + "; ".join(against) + "."
    else:
        text += (
            f" No spread grows faster than T^{SLOPE_TARGET:g}, over the whole range or between "
            "its two longest horizons."
        )
    return text


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    rows = sorted(data["rows"], key=lambda r: (list(SPREADS).index(r["spread"]), r["T"]))
    write_csv(folder / "autobid.csv", rows)
    write_csv(folder / "autobid_trials.csv", data["trials"])
    table = [
        (
            r["spread"],
            r["T"],
            stat_cell(r, "welfare_ratio", scale=100),
            stat_cell(r, "bound_ratio", scale=100),
            stat_cell(r, "pct_above_half_pacing"),
            stat_cell(r, "pct_above_half_truthful"),
            stat_cell(r, "bound_holds", scale=100),
            stat_cell(r, "regret"),
            stat_cell(r, "spend_over_budget"),
            stat_cell(r, "alpha_mean"),
        )
        for r in rows
    ]
    header = (
        "spread",
        "T",
        "paced / truthful %",
        "κ bound / truthful %",
        "paced % above ½Σv",
        "truthful % above ½Σv",
        "bound holds % batches",
        "regret",
        "spend / budget",
        "mean α'",
    )
    section.text("Per spread and horizon, mean ± 1 s.e.:\n\n" + markdown_table(header, table))
    slopes = ", ".join(f"{s} {fmt(v)}" for s, v in data["slopes"].items())
    section.text(
        f"Log-log slope of mean regret on T: {slopes} (theory ½; bench target ≤ {SLOPE_TARGET:g})."
    )
    _plot_welfare(data, folder / "autobid_welfare.png")
    section.figure(
        "autobid_welfare.png", "Paced welfare and the κ bound vs truthful", describe_welfare(data)
    )
    _plot_regret(data, folder / "autobid_regret.png")
    section.figure("autobid_regret.png", "Regret vs T", describe_regret(data))


def _plot_welfare(data: dict[str, Any], path: Path) -> None:
    fig, ax = plots.plt.subplots(figsize=(7, 4.5))
    for s in SPREADS:
        rows = _at(data, s)
        Ts = [r["T"] for r in rows]
        line = plots.errorbar(
            ax,
            Ts,
            [{"v": _pc(r, "welfare_ratio"), "v_se": _pc(r, "welfare_ratio_se")} for r in rows],
            "v",
            label=f"{s} {SPREADS[s]}",
        )
        ax.plot(
            Ts,
            plots.values([{"v": _pc(r, "bound_ratio")} for r in rows], "v"),
            ls="--",
            color=line[0].get_color(),
        )
    ax.axhline(100, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("T (batches)")
    ax.set_ylabel("% of truthful welfare")
    ax.set_title("Paced welfare (solid) and κ bound (dashed), share of truthful")
    ax.legend(fontsize=7)
    plots.save(fig, path)


def _plot_regret(data: dict[str, Any], path: Path) -> None:
    fig, ax = plots.plt.subplots(figsize=(7, 4.5))
    for s in SPREADS:
        rows = _at(data, s)
        shown = [{"v": max(r["regret"] or 0.0, 1e-6), "v_se": r["regret_se"]} for r in rows]
        plots.errorbar(
            ax, [r["T"] for r in rows], shown, "v", label=f"{s} (slope {fmt(data['slopes'][s])})"
        )
    Ts = sorted({r["T"] for r in data["rows"]})
    first = [r for r in data["rows"] if r["T"] == Ts[0] and r["regret"]]
    if first:
        ref = max(r["regret"] for r in first)
        ax.plot(Ts, [ref * math.sqrt(t / Ts[0]) for t in Ts], ls=":", color="grey", label="∝ √T")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (batches)")
    ax.set_ylabel("regret vs best fixed α")
    ax.legend(fontsize=7)
    plots.save(fig, path)
