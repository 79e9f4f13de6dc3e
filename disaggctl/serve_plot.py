"""The live demo's timeline as a PNG: load, smoothed TTFT P99 with the regime behind it, the
router's τ and ω, poa_hat and its factors, and the auction's queue and revenue, per second."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from disaggctl.load_client import LoadPhase
    from disaggctl.serve_demo import Sample

__all__ = ["plot_timeline"]

_REGIME_COLOURS = {"below": "#e8f5e9", "transition": "#fff3e0", "saturated": "#ffebee"}


def _series(samples: Sequence[Sample], key: str) -> list[float]:
    out = []
    for s in samples:
        v: Any = s.status.get(key)
        out.append(float(v) if isinstance(v, int | float) and math.isfinite(v) else math.nan)
    return out


def plot_timeline(
    samples: Sequence[Sample],
    phases: Sequence[LoadPhase],
    path: Path,
    resplits: Sequence[dict[str, Any]] = (),
) -> None:
    """``resplits``: ``serve_demo.resplit_table`` rows, drawn as a span from start to warm on
    every panel and labelled before → after on the first."""
    t = [s.t for s in samples]
    fig, axes = plt.subplots(5, 1, figsize=(11, 12), sharex=True)
    regimes = [s.status.get("regime") for s in samples]
    for ax in axes:
        for i in range(len(t) - 1):
            colour = _REGIME_COLOURS.get(str(regimes[i]))
            if colour:
                ax.axvspan(t[i], t[i + 1], color=colour, lw=0)
        edge = 0.0
        for phase in phases:
            ax.axvline(edge, color="grey", lw=0.5, ls=":")
            edge += phase.seconds
    for r in resplits:
        end = r.get("end_t") if r.get("end_t") is not None else (t[-1] if t else r["t"])
        for ax in axes:
            ax.axvspan(r["t"], end, color="tab:cyan", alpha=0.25, lw=0)
            ax.axvline(r["t"], color="tab:cyan", lw=1.2)
        label = f"re-split {r['before']}→{r.get('after') or '…'}"
        axes[0].text(r["t"], 1.0, label, fontsize=8, color="teal", va="top", rotation=90,
                     transform=axes[0].get_xaxis_transform())  # fmt: skip
    axes[0].plot(t, [s.clients for s in samples], color="black")
    axes[0].set_ylabel("clients C")
    for phase, start in zip(phases, _starts(phases), strict=True):
        axes[0].text(start + 0.5, 0.0, phase.name, fontsize=8, va="bottom")
    axes[1].plot(t, _series(samples, "ttft_p99_smoothed_s"), color="tab:red")
    axes[1].set_ylabel("TTFT P99 (EMA), s")
    axes[2].plot(t, _series(samples, "tau"), label="τ", color="tab:blue")
    axes[2].plot(t, _series(samples, "omega"), label="ω", color="tab:green")
    axes[2].set_ylabel("router policy")
    axes[2].legend(loc="upper right")
    for key, colour in (("poa_hat", "black"), ("poa_routing", "tab:blue"),
                        ("poa_capacity", "tab:orange")):  # fmt: skip
        axes[3].plot(t, _series(samples, key), label=key, color=colour)
    axes[3].axhline(1.0, color="grey", lw=0.8)
    axes[3].set_yscale("log")
    axes[3].set_ylabel("PoA (log)")
    axes[3].legend(loc="upper right")
    axes[4].plot(t, _series(samples, "queue_depth"), color="tab:purple", label="queue depth")
    axes[4].set_ylabel("auction queue")
    twin = axes[4].twinx()
    twin.plot(t, _series(samples, "revenue"), color="tab:brown", label="revenue")
    twin.set_ylabel("revenue")
    axes[4].set_xlabel("wall seconds (background: regime — green below, orange transition, "
                       "red saturated; cyan: a P/D re-split, start to warm)")  # fmt: skip
    fig.suptitle("disaggctl serve: live timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _starts(phases: Sequence[LoadPhase]) -> list[float]:
    out, edge = [], 0.0
    for phase in phases:
        out.append(edge)
        edge += phase.seconds
    return out
