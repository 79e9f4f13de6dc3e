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
SECONDS_PER_UNIT = 0.0066  # per batch of a run (pacing, regret, bound), measured

SPREADS = {
    "equal": (0.5, 0.5, 0.5),
    "mild": (0.35, 0.5, 0.7),
    "wide": (0.2, 0.5, 1.0),
    "extreme": (0.05, 0.3, 1.0),
}
FULL_T, QUICK_T = (100, 400, 1600, 6400), (50, 200)
WORKLOAD, N, USERS, SHAPES, PILOT_T = "mixshare-50", 64, 12, 4, 400
# How many of the USERS pace: three beside nine truthful bidders, and every budgeted user. User
# i paces with its spread's fraction i mod 3, so both populations draw from the same three
# fractions (four users each when all twelve pace).
PACERS = (3, USERS)


def series(pacers: int, spread: str) -> str:
    """A (population, spread) pair's name in the tables, plots and prose."""
    return spread if pacers == len(next(iter(SPREADS.values()))) else f"{spread}, all {pacers}"


SERIES = [(k, s) for k in PACERS for s in SPREADS]
SPREADS_FIRST, SPREADS_LAST = next(iter(SPREADS)), list(SPREADS)[-1]
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
        "pacing users": f"{' or '.join(map(str, PACERS))} of {USERS} (user i: fraction i mod 3)",
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
        Job(
            f"{__name__}:run_repeated",
            {"spread": s, "T": T, "seed": seed, "pacers": k},
            units=T + PILOT_T / 4,
        )
        for k, s in SERIES
        for T in horizons
        for seed in settings.seeds
    ]
    return Plan(setup, jobs)


def run_repeated(spread: str, T: int, seed: int, pacers: int = 3) -> dict[str, Any]:
    """One repeated auction: welfare against truthful and the bound, and each pacer's regret;
    the first ``pacers`` users pace (``PACERS``)."""
    import numpy as np

    from auction.pacing_bound import pacing_welfare_bound
    from auction.radix import build_radix_tree
    from auction.regret import autobidder_regret
    from auction.repeated import simulate, stationary_source
    from auction.schedulers import dfs_bid_order
    from auction.welfare import welfare
    from cluster.sim.workloads import make_workload, pareto_values

    trees = [
        build_radix_tree(make_workload(WORKLOAD, N, users=USERS, seed=seed + k).requests)
        for k in range(SHAPES)
    ]
    source = stationary_source(trees, pareto_values)
    users = [f"user{i}" for i in range(USERS)]
    pilot = simulate(source, PILOT_T, {}, users=users, seed=seed + 10_000)
    spend = pilot.payments.mean(axis=0)
    fractions = SPREADS[spread]
    gamma = {
        users[i]: fractions[i % len(fractions)] * float(spend[pilot.users.index(users[i])])
        for i in range(pacers)
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
        name = series(kw.get("pacers", 3), kw["spread"])
        groups.setdefault((name, kw["T"]), []).append(res)
        raw.append({"series": name, "T": kw["T"], "seed": kw["seed"], **res})
    rows: list[dict[str, Any]] = [
        {"series": s, "T": T, **summarise(runs, KEYS)} for (s, T), runs in groups.items()
    ]
    slopes, tail_slopes = {}, {}
    for s in _names(rows):
        pts = sorted((int(r["T"]), float(r["regret"] or 0.0)) for r in rows if r["series"] == s)
        slopes[s] = loglog_slope([t for t, _ in pts], [g for _, g in pts])
        # The slope between the two longest horizons: the whole-range fit averages in the short
        # horizons, where regret has not yet reached its asymptotic growth.
        tail = pts[-2:]
        tail_slopes[s] = loglog_slope([t for t, _ in tail], [g for _, g in tail])
    return {"rows": rows, "slopes": slopes, "tail_slopes": tail_slopes, "trials": raw}


def _names(rows: list[dict[str, Any]]) -> list[str]:
    """The series present, in ``SERIES`` order."""
    present = {r["series"] for r in rows}
    return [name for name in (series(k, s) for k, s in SERIES) if name in present]


def _at(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return sorted((r for r in data["rows"] if r["series"] == name), key=lambda r: r["T"])


def describe_welfare(data: dict[str, Any]) -> str:
    parts, against = [], []
    last = {}
    for s in _names(data["rows"]):
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
    for k in PACERS:
        ordered = [series(k, s) for s in SPREADS if series(k, s) in last]
        if len(ordered) < 2:
            continue
        a, b = last[ordered[0]]["welfare_ratio"], last[ordered[-1]]["welfare_ratio"]
        if a is not None and b is not None:
            text += (
                f" With {k} of {USERS} pacing, from the {SPREADS_FIRST} to the {SPREADS_LAST} "
                "spread the paced welfare "
                + (
                    f"drops by {100 * (a - b):.1f} points: unequal pacing reverses more "
                    "siblings, as the bound's κ says."
                    if b < a
                    else f"does not drop ({100 * (b - a):+.1f} points): the spread of budgets "
                    "did not cost welfare here."
                )
            )
    few, every = PACERS
    pairs = [
        (s, last.get(series(few, s)), last.get(series(every, s)))
        for s in SPREADS
        if series(few, s) in last and series(every, s) in last
    ]
    if pairs:
        text += (
            f" Every budgeted user pacing against {few} of {USERS}: "
            + "; ".join(
                f"{s} {fmt(_pc(b, 'welfare_ratio'))}% against {fmt(_pc(a, 'welfare_ratio'))}%"
                for s, a, b in pairs
                if a is not None and b is not None
            )
            + " of truthful welfare."
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
    order = _names(data["rows"])
    rows = sorted(data["rows"], key=lambda r: (order.index(r["series"]), r["T"]))
    write_csv(folder / "autobid.csv", rows)
    write_csv(folder / "autobid_trials.csv", data["trials"])
    table = [
        (
            r["series"],
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
        "spread (pacers)",
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
    section.text(
        f'Per spread and horizon, mean ± 1 s.e. ("all {USERS}": every budgeted user paces; '
        f"otherwise {PACERS[0]} of {USERS}):\n\n" + markdown_table(header, table)
    )
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
    """One panel per pacing population, a colour per spread."""
    fig, axes = plots.plt.subplots(1, len(PACERS), figsize=(11, 4.5), sharey=True)
    for ax, k in zip(axes, PACERS, strict=True):
        for s in SPREADS:
            rows = _at(data, series(k, s))
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
        ax.set_title(f"{k} of {USERS} users pace", fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("% of truthful welfare")
    fig.suptitle("Paced welfare (solid) and κ bound (dashed), share of truthful")
    plots.save(fig, path)


def _plot_regret(data: dict[str, Any], path: Path) -> None:
    """A colour per spread; solid: the few pace, dash-dotted: every budgeted user paces."""
    fig, ax = plots.plt.subplots(figsize=(7, 4.5))
    colours = plots.plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (k, s), style in zip(SERIES, ["-"] * len(SPREADS) + ["-."] * len(SPREADS), strict=True):
        name = series(k, s)
        rows = _at(data, name)
        if not rows:
            continue
        shown = [{"v": max(r["regret"] or 0.0, 1e-6), "v_se": r["regret_se"]} for r in rows]
        plots.errorbar(
            ax,
            [r["T"] for r in rows],
            shown,
            "v",
            ls=style,
            color=colours[list(SPREADS).index(s) % len(colours)],
            label=f"{name} (slope {fmt(data['slopes'][name])})",
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
    ax.legend(fontsize=6)
    plots.save(fig, path)
