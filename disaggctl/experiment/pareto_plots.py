"""The pareto experiment's figures: the throughput–TTFT P99 frontier per (C, view) and the
(τ, ω) heat maps of poa_hat and TTFT P99 (``disaggctl.experiment.pareto``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from disaggctl.experiment import plots
from disaggctl.experiment.pareto import CONCURRENCY, SATURATED, STATIC, VIEWS, panel
from disaggctl.experiment.stats import fmt


def plot_frontier(data: dict[str, Any], path: Path) -> None:
    fig, axes = plots.plt.subplots(len(CONCURRENCY), len(VIEWS), figsize=(11, 8.5))
    for i, c in enumerate(CONCURRENCY):
        for j, view in enumerate(VIEWS):
            ax, rows = axes[i][j], panel(data, c, view)
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


def plot_heatmaps(data: dict[str, Any], path: Path) -> None:
    taus = sorted({r["tau"] for r in data["cells"]})
    omegas = sorted({r["omega"] for r in data["cells"]})
    panels = [(c, v) for c in CONCURRENCY for v in VIEWS]
    fig, axes = plots.plt.subplots(len(panels), 2, figsize=(9, 3.2 * len(panels)))
    for i, (c, view) in enumerate(panels):
        rows = panel(data, c, view)
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
