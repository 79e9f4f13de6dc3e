"""What the experiments' figures share: the Agg backend (files only), the regime colours of the
live demo's timeline (``disaggctl/serve_plot.py``), error bars of 1 standard error, saving."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt

__all__ = [
    "REGIME_COLOURS",
    "errorbar",
    "plt",
    "regime_legend",
    "save",
    "shade_regimes",
    "values",
]

REGIME_COLOURS = {"below": "#e8f5e9", "transition": "#fff3e0", "saturated": "#ffebee"}
DPI = 120


def values(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """``row[key]`` per row, NaN where unknown (matplotlib leaves a gap)."""
    out = []
    for row in rows:
        v = row.get(key)
        out.append(float(v) if isinstance(v, int | float) and math.isfinite(v) else math.nan)
    return out


def errorbar(
    ax: Any, xs: Sequence[float], rows: Sequence[Mapping[str, Any]], key: str, **kwargs: Any
) -> Any:
    """Mean ± 1 standard error of ``key`` (``key_se``; 0 where unknown) against ``xs``."""
    err = [0.0 if math.isnan(e) else e for e in values(rows, f"{key}_se")]
    return ax.errorbar(xs, values(rows, key), yerr=err, capsize=2, marker="o", ms=3, **kwargs)


def shade_regimes(ax: Any, xs: Sequence[float], regimes: Sequence[str | None]) -> None:
    """Colour the span around each x by its regime (edges halfway between neighbours, in log x
    when the axis is logarithmic)."""
    if not xs:
        return
    log = ax.get_xscale() == "log"
    pos = [math.log(x) if log else x for x in xs]
    edges = [pos[0] - (pos[1] - pos[0]) / 2 if len(pos) > 1 else pos[0] - 0.5]
    edges += [(a + b) / 2 for a, b in itertools.pairwise(pos)]
    edges.append(pos[-1] + (pos[-1] - pos[-2]) / 2 if len(pos) > 1 else pos[0] + 0.5)
    for i, regime in enumerate(regimes):
        colour = REGIME_COLOURS.get(str(regime))
        if colour:
            lo, hi = edges[i], edges[i + 1]
            if log:
                lo, hi = math.exp(lo), math.exp(hi)
            ax.axvspan(lo, hi, color=colour, lw=0, zorder=0)


def regime_legend(ax: Any, **kwargs: Any) -> None:
    """A legend of the regime colours (for figures whose background is shaded by regime)."""
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=r) for r, c in REGIME_COLOURS.items()]
    ax.legend(handles=handles, fontsize=7, **kwargs)


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
