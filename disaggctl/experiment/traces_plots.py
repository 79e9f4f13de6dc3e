"""The ``traces`` experiment's figure: each arm's TTFT P99 against the load, one trace a figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from disaggctl.experiment import plots

__all__ = ["plot_loads"]


def plot_loads(
    data: dict[str, Any], trace: str, arms: Sequence[str], loads: Sequence[float], path: Path
) -> Path:
    fig, ax = plots.plt.subplots(figsize=(7, 4))
    for k, arm in enumerate(arms):
        rows = [
            next(r for r in data["rows"] if (r["trace"], r["load"], r["arm"]) == (trace, f, arm))
            for f in loads
        ]
        xs = [f + (k - (len(arms) - 1) / 2) * 0.012 for f in loads]  # side by side
        plots.errorbar(ax, xs, rows, "ttft_p99_s", label=arm)
    ax.set_yscale("log")
    ax.set_xticks(list(loads), [f"{f:g}·X_max" for f in loads])
    ax.set_xlabel("arrival rate (share of the deployment's measured capacity)")
    ax.set_ylabel("TTFT P99 (s)")
    ax.set_title(f"{trace} (70B)")
    ax.legend(fontsize=8)
    return plots.save(fig, path)
