"""Autobidder benchmark: regret of budget pacing against the best fixed α, as T grows.

A stationary workload (a few radix trees from ``cluster.sim.workloads``, fresh values 1 +
Pareto(1.5)
every batch), some pacing users and the rest truthful. Each pacing user's per-batch budget γ is a
fraction of what it pays when everyone bids truthfully (measured on a pilot run), so the budget
binds. For every horizon T the repeated auction is run over several seeds, and each pacing user's
regret against the best fixed α in hindsight (same competitor bids, same budget) is averaged.
Theory: regret O(√T), a log-log slope of ½.

Target: the log-log slope of mean regret on T is at most 0.6 (½ plus room for seed noise). Where
the autobidder beats the best fixed α at some T (regret ≤ 0 has no logarithm) the slope is fitted
over the horizons with positive regret; with fewer than two of those there is no growth to fit
and the target is met (the autobidder is never behind by more than one horizon's regret).

Prints one JSON object to stdout, ``met`` on top (exit status 1 when the target is missed);
writes ``regret_vs_T.png`` and ``alpha_over_time.png`` into ``--out`` (default
``results/autobidder/``).

    .venv/bin/python -m bench.autobidder [--out results/autobidder] [--workload mixshare-50]
                                         [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's own ``auction`` package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import matplotlib
import numpy as np

from auction.pacing import DEFAULT_ETA_SCALE
from auction.radix import build_radix_tree
from auction.regret import autobidder_regret, loglog_slope
from auction.repeated import RepeatedResult, simulate, stationary_source
from bench.common import add_output_flags, at_most, emit, verdict
from cluster.progress import progress_bar
from cluster.sim.workloads import make_workload, pareto_values

SLOPE_TARGET = 0.6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/autobidder"))
    p.add_argument("--workload", default="mixshare-50")
    p.add_argument("--n", type=int, default=64, help="requests per batch")
    p.add_argument("--users", type=int, default=12)
    p.add_argument("--pacing", type=int, default=3, help="users that pace; the rest are truthful")
    p.add_argument("--shapes", type=int, default=4, help="distinct trees batches are drawn from")
    p.add_argument(
        "--budget-fraction",
        type=float,
        default=0.5,
        help="γ as a fraction of the user's truthful per-batch spend",
    )
    p.add_argument(
        "--eta-scale", type=float, default=DEFAULT_ETA_SCALE, help="η = eta_scale/(γ·√T)"
    )
    p.add_argument("--mu-max", type=float, default=100.0)
    p.add_argument("--horizons", type=int, nargs="+", default=[100, 400, 1600, 6400])
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[8, 4, 2, 2],
        help="runs per horizon (one number per horizon)",
    )
    p.add_argument("--seed", type=int, default=0)
    add_output_flags(p)  # --progress / --no-progress / --quiet
    args = p.parse_args(argv)
    if len(args.seeds) != len(args.horizons):
        p.error("--seeds needs one count per horizon")
    if not 1 <= args.pacing <= args.users:
        p.error("--pacing must lie in [1, --users]")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure: the pilot, every (T, seed) run, the regret rows and the two PNGs."""
    started = time.perf_counter()
    trees = [
        build_radix_tree(
            make_workload(args.workload, args.n, users=args.users, seed=args.seed + k).requests
        )
        for k in range(args.shapes)
    ]
    source = stationary_source(trees, pareto_values)
    users = [f"user{i}" for i in range(args.users)]
    pilot = simulate(source, 400, {}, users=users, seed=args.seed + 10_000)
    truthful_spend = pilot.payments.mean(axis=0)
    gamma = {
        users[i]: args.budget_fraction * float(truthful_spend[pilot.users.index(users[i])])
        for i in range(args.pacing)
    }

    rows = []
    alpha_run: RepeatedResult | None = None
    counts = zip(args.horizons, args.seeds, strict=True)
    runs = [(T, s) for T, count in counts for s in range(count)]
    bar = progress_bar(runs, progress=args.progress, quiet=args.quiet, desc="autobidder")
    per_T: dict[int, list[dict[str, float]]] = {T: [] for T in args.horizons}
    for T, s in bar:
        bar.set_postfix(T=T, seed=s)
        result = simulate(
            source,
            T,
            gamma,
            users=users,
            seed=args.seed + 100_000 * s + T,
            eta_scale=args.eta_scale,
            mu_max=args.mu_max,
        )
        if s == 0 and max(args.horizons) == T:
            alpha_run = result
        for user in gamma:
            r = autobidder_regret(result, user, mu_max=args.mu_max)
            j = result.pacing.index(user)
            per_T[T].append(
                {
                    "regret": r.regret,
                    "utility": r.utility,
                    "best_utility": r.best_utility,
                    "best_alpha": r.best_alpha,
                    "mean_alpha": float(result.alpha_capped[:, j].mean()),
                    "spend_over_budget": r.spend / r.budget,
                }
            )
    for T in args.horizons:
        cells = per_T[T]
        reg = np.array([c["regret"] for c in cells])
        rows.append(
            {
                "T": T,
                "runs": len(cells),
                "regret_mean": float(reg.mean()),
                "regret_stderr": float(reg.std(ddof=1) / math.sqrt(reg.size))
                if reg.size > 1
                else None,
                "regret_per_batch": float(reg.mean() / T),
                "regret_over_utility": float(reg.sum() / sum(c["best_utility"] for c in cells)),
                "best_fixed_alpha_mean": float(np.mean([c["best_alpha"] for c in cells])),
                "autobidder_alpha_mean": float(np.mean([c["mean_alpha"] for c in cells])),
                "spend_over_budget_mean": float(np.mean([c["spend_over_budget"] for c in cells])),
            }
        )

    horizons = [row["T"] for row in rows]
    regrets = [row["regret_mean"] for row in rows]
    slope = loglog_slope(horizons, regrets)
    ci = _bootstrap_slope(
        horizons,
        [[c["regret"] for c in per_T[T]] for T in horizons],
        np.random.default_rng(args.seed),
    )
    beaten = [row["T"] for row in rows if row["regret_mean"] <= 0]
    positive = [(T, g) for T, g in zip(horizons, regrets, strict=True) if g > 0]
    args.out.mkdir(parents=True, exist_ok=True)
    pngs = [
        str(_plot_regret(args.out, horizons, regrets, rows, slope)),
        str(_plot_alpha(args.out, alpha_run)),
    ]
    return {
        "workload": args.workload,
        "n": args.n,
        "users": args.users,
        "pacing_users": list(gamma),
        "shapes": args.shapes,
        "gamma": {u: round(g, 6) for u, g in gamma.items()},
        "budget_fraction": args.budget_fraction,
        "eta": "eta_scale/(gamma*sqrt(T))",
        "eta_scale": args.eta_scale,
        "mu_max": args.mu_max,
        "regret": rows,
        "loglog_slope": slope,
        "loglog_slope_90ci": ci,
        "theory_slope": 0.5,
        "autobidder_beats_best_fixed_alpha_at_T": beaten,
        "loglog_slope_over_positive_regret": (
            loglog_slope([T for T, _ in positive], [g for _, g in positive]) if beaten else slope
        ),
        "pngs": pngs,
        "runtime_s": round(time.perf_counter() - started, 1),
    }


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The slope target (module docstring) from ``report["regret"]`` (rows of T, regret_mean)."""
    rows = sorted(report["regret"], key=lambda row: row["T"])
    horizons = [row["T"] for row in rows]
    regrets = [row["regret_mean"] for row in rows]
    slope = loglog_slope(horizons, regrets)
    if slope is not None:
        return verdict({"loglog_slope": at_most(slope, SLOPE_TARGET, fitted_over=horizons)})
    positive = [(T, g) for T, g in zip(horizons, regrets, strict=True) if g > 0]
    beaten = [T for T, g in zip(horizons, regrets, strict=True) if g <= 0]
    if len(positive) >= 2:
        fitted = loglog_slope([T for T, _ in positive], [g for _, g in positive])
        return verdict(
            {
                "loglog_slope": at_most(
                    fitted,
                    SLOPE_TARGET,
                    fitted_over=[T for T, _ in positive],
                    autobidder_beats_best_fixed_alpha_at_T=beaten,
                )
            }
        )
    target = {
        "target": f"<= {SLOPE_TARGET:g}",
        "measured": None,
        # Regret ≤ 0 at all horizons but one cannot grow like T^0.6; but a growth claim needs
        # two horizons at least, so a single horizon (or none) is no evidence either way.
        "met": len(rows) >= 2,
        "autobidder_beats_best_fixed_alpha_at_T": beaten,
        "note": "fewer than two horizons with positive regret: no growth to fit",
    }
    return verdict({"loglog_slope": target})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    return emit("autobidder", judge(report), report, args.quiet)


def _bootstrap_slope(
    horizons: list[int], cells: list[list[float]], rng: np.random.Generator, draws: int = 2000
) -> list[float] | None:
    """5th and 95th percentiles of the slope when each T's runs are resampled with replacement
    (resamples with a mean regret ≤ 0 have no slope and are skipped)."""
    slopes = []
    for _ in range(draws):
        means = [float(np.mean(rng.choice(c, size=len(c)))) for c in cells]
        s = loglog_slope(horizons, means)
        if s is not None:
            slopes.append(s)
    if len(slopes) < draws // 2:
        return None
    return [round(float(q), 4) for q in np.percentile(slopes, [5, 95])]


def _pyplot() -> Any:
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _plot_regret(
    out: Path,
    horizons: list[int],
    regrets: list[float],
    rows: list[dict[str, Any]],
    slope: float | None,
) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    T = np.asarray(horizons, dtype=float)
    err = [row["regret_stderr"] or 0.0 for row in rows]
    shown = np.maximum(np.asarray(regrets), 1e-9)
    ax.errorbar(T, shown, yerr=err, marker="o", capsize=3, label="autobidder regret (mean ± s.e.)")
    ref = shown[0] * np.sqrt(T / T[0])
    ax.plot(T, ref, "--", color="grey", label="∝ √T")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (batches)")
    ax.set_ylabel("regret vs best fixed α")
    fitted = "no slope: regret ≤ 0 somewhere" if slope is None else f"log-log slope {slope:.2f}"
    ax.set_title(f"Pacing autobidder: regret vs T ({fitted})")
    ax.legend()
    fig.tight_layout()
    path = out / "regret_vs_T.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_alpha(out: Path, run: RepeatedResult | None) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    if run is not None:
        for j, user in enumerate(run.pacing):
            ax.plot(run.alpha[:, j], lw=0.8, label=f"{user} α")
            spent = np.cumsum(run.payments[:, run.users.index(user)]) / run.budgets[j]
            ax.plot(spent, lw=0.8, ls=":", color=ax.lines[-1].get_color(), label=f"{user} spend/B")
        ax.set_title(f"α over time and cumulative spend / budget (T = {run.T})")
    ax.set_xlabel("batch t")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out / "alpha_over_time.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
