"""The adaptive experiment's timeline figure (``disaggctl.experiment.adaptive``): per case, one
seed's clients, TTFT P99, regime, τ and pools over time."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from disaggctl.experiment import plots

REGIMES = ("below", "transition", "saturated")


def _clients(phases: list[str], ts: list[float]) -> list[float]:
    """Target concurrency over time from the setup's phase lines (duration, C, ramp)."""
    spans = []
    for line in phases:
        m = re.match(r"\S+ ([\d.]+) s to C = (\d+)(?: \(ramp ([\d.]+) s\))?", line)
        if m:
            spans.append((float(m[1]), float(m[2]), float(m[3] or 0.0)))
    out = []
    for t in ts:
        start, prev, c = 0.0, 0.0, 0.0
        for dur, target, ramp in spans:
            if t <= start + dur:
                c = (
                    target
                    if not ramp or t >= start + ramp
                    else prev + (target - prev) * (t - start) / ramp
                )
                break
            start, prev = start + dur, target
        out.append(c)
    return out


def plot_timeline(
    name: str, entry: dict[str, Any], timeline: dict[str, Any], setup: dict[str, Any], path: Path
) -> None:
    fig, axes = plots.plt.subplots(4, 1, figsize=(11, 9), sharex=True)
    colours = {"static": "tab:grey", "adaptive": "tab:blue", "resplit": "tab:green"}
    for arm in entry["arms"]:
        ticks = timeline.get(arm, [])
        ts = [s["t"] for s in ticks]
        colour = colours.get(arm, "black")
        axes[1].plot(
            ts,
            [
                s["ttft_p99_window_s"] if s["ttft_p99_window_s"] is not None else float("nan")
                for s in ticks
            ],
            color=colour,
            lw=1,
            label=arm,
        )
        axes[2].step(ts, [s["tau"] for s in ticks], where="post", color=colour, label=f"{arm} τ")
        axes[2].step(
            ts,
            [s["regime"] for s in ticks],
            where="post",
            color=colour,
            ls=":",
            label=f"{arm} regime",
        )
        axes[3].step(
            ts,
            [s["prefill_workers"] for s in ticks],
            where="post",
            color=colour,
            label=f"{arm} prefill",
        )
        axes[3].step(
            ts,
            [s["decode_workers"] for s in ticks],
            where="post",
            color=colour,
            ls="--",
            label=f"{arm} decode",
        )
        if arm == entry["compare"]:
            regimes = [REGIMES[s["regime"]] for s in ticks]
            for ax in axes:
                for i in range(len(ts) - 1):
                    ax.axvspan(
                        ts[i], ts[i + 1], color=plots.REGIME_COLOURS[regimes[i]], lw=0, zorder=0
                    )
            axes[0].plot(ts, _clients(setup["phases"], ts), color="black")
    for theta in entry["thresholds_s"]:
        axes[1].axhline(theta, ls="--", lw=0.8, color="grey")
    axes[0].set_ylabel("clients C")
    axes[0].set_title(f"{name} (background: regime of the {entry['compare']} arm)")
    plots.regime_legend(axes[0], loc="upper right")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("TTFT P99 (10 s window), s")
    axes[1].legend(loc="upper left", fontsize=7)
    axes[2].set_ylabel("τ; regime (0 below, 2 saturated)")
    axes[2].legend(loc="upper left", fontsize=7, ncol=3)
    axes[3].set_ylabel("workers")
    axes[3].legend(loc="upper left", fontsize=7, ncol=3)
    axes[3].set_xlabel("simulated time s")
    plots.save(fig, path)
