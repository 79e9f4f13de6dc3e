"""The auction experiment's figures (``disaggctl.experiment.auction``): welfare against n and ρ,
cache hit rate and mean TTFT per scheduler, the one-bidding-cluster case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disaggctl.experiment import plots
from disaggctl.experiment.auction_rows import SCHEDULERS, one, pick

COLOURS = dict(
    zip(SCHEDULERS, ("tab:red", "tab:blue", "tab:cyan", "tab:orange", "tab:grey"), strict=True)
)


def _grid(count: int) -> tuple[Any, list[Any]]:
    cols = min(3, count)
    rows = (count + cols - 1) // cols
    fig, axes = plots.plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat


def plot_n(data: dict[str, Any], path: Path) -> None:
    workloads = list(dict.fromkeys(r["workload"] for r in data["rows"] if r["sweep"] == "n"))
    fig, axes = _grid(len(workloads))
    for ax, w in zip(axes, workloads, strict=False):
        for name in SCHEDULERS:
            rows = sorted(
                (r for r in pick(data, "n", workload=w) if r["scheduler"] == name),
                key=lambda r: r["n"],
            )
            ns = [r["n"] for r in rows]
            plots.errorbar(ax, ns, rows, "realised_welfare_pct", color=COLOURS[name], label=name)
            if name == "dfs-bid":
                ax.plot(
                    ns,
                    plots.values(rows, "planned_welfare_pct"),
                    ls=":",
                    color=COLOURS[name],
                    label="dfs-bid planned",
                )
        ax.set_xscale("log", base=2)
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_title(w, fontsize=9)
        ax.set_xlabel("batch size n")
        ax.set_ylabel("realised % above ½Σb")
    axes[0].legend(fontsize=6)
    plots.save(fig, path)


def _bars(ax: Any, rows: list[dict[str, Any]], key: str) -> None:
    for i, name in enumerate(SCHEDULERS):
        r = one(rows, name)
        if r is not None and r[key] is not None:
            ax.bar(i, r[key], yerr=r.get(f"{key}_se") or 0, color=COLOURS[name], capsize=2)
    ax.set_xticks(range(len(SCHEDULERS)), SCHEDULERS, rotation=45, fontsize=7)


def plot_cache(data: dict[str, Any], path: Path) -> None:
    Q = max(r["n"] for r in data["rows"] if r["sweep"] == "n")
    workloads = list(dict.fromkeys(r["workload"] for r in data["rows"] if r["sweep"] == "n"))
    fig, axes = plots.plt.subplots(
        2, len(workloads), figsize=(2.6 * len(workloads), 6), squeeze=False
    )
    for j, w in enumerate(workloads):
        rows = pick(data, "n", workload=w, n=Q)
        _bars(axes[0][j], rows, "cache_hit_rate")
        _bars(axes[1][j], rows, "mean_ttft_s")
        axes[0][j].set_title(w, fontsize=9)
    axes[0][0].set_ylabel("cache hit rate")
    axes[1][0].set_ylabel("mean TTFT s")
    plots.save(fig, path)


def plot_rho(data: dict[str, Any], path: Path) -> None:
    workloads = list(dict.fromkeys(r["workload"] for r in data["rows"] if r["sweep"] == "rho"))
    fig, axes = _grid(len(workloads))
    for ax, w in zip(axes, workloads, strict=False):
        for name in SCHEDULERS:
            rows = sorted(
                (r for r in pick(data, "rho", workload=w) if r["scheduler"] == name),
                key=lambda r: r["rho"],
            )
            plots.errorbar(
                ax,
                [r["rho"] for r in rows],
                rows,
                "realised_welfare_pct",
                color=COLOURS[name],
                label=name,
            )
        ax.set_title(w, fontsize=9)
        ax.set_xlabel("ρ")
        ax.set_ylabel("realised % above ½Σb")
    axes[0].legend(fontsize=6)
    plots.save(fig, path)


def plot_one(data: dict[str, Any], path: Path) -> None:
    workloads = list(
        dict.fromkeys(r["workload"] for r in data["rows"] if r["sweep"] == "one-cluster")
    )
    fig, axes = _grid(len(workloads))
    for ax, w in zip(axes, workloads, strict=False):
        _bars(ax, pick(data, "one-cluster", workload=w), "realised_welfare_pct")
        ax.set_title(w, fontsize=9)
        ax.set_ylabel("realised % above ½Σb")
    plots.save(fig, path)
