"""A replay's report: ``summary.md`` and ``summary.json`` with every arm's figures and its ratio to
the first arm, and three plots (docs/design.md §8 "Real traces"):

- ``ttft.png``: TTFT over arrival time (median and P99 per bin), one line per arm, behind them
  the regime of the first arm that has one, and its pools (prefill workers) on a second axis;
- ``arrivals.png``: requests arrived and completed so far, over time: an open loop's arrivals
  are the trace's whatever the service does, so a gap that widens is a queue that grows;
- ``prefix_reuse.png``: the share of prompt tokens served from a KV cache, per bin.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from disaggctl.experiment.plots import REGIME_COLOURS, plt, regime_legend, save
from disaggctl.experiment.report import knob_table, markdown_table
from disaggctl.experiment.stats import fmt
from disaggctl.jsonout import strict_dumps
from disaggctl.replay.outcome import ArmOutcome

__all__ = ["RATIO_KEYS", "SUMMARY_KEYS", "write_report"]

_REGIMES = ("below", "transition", "saturated")
SUMMARY_KEYS = (
    ("completed", "done"),
    ("ttft_p50_s", "TTFT P50 s"),
    ("ttft_p90_s", "TTFT P90 s"),
    ("ttft_p99_s", "TTFT P99 s"),
    ("itl_p50_s", "ITL P50 s"),
    ("throughput_rps", "req/s"),
    ("prefix_reuse", "prefix reuse"),
    ("resplits", "re-splits"),
)
RATIO_KEYS = ("ttft_p50_s", "ttft_p99_s", "throughput_rps")


def _ratio(a: Any, b: Any) -> float:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or b == 0:
        return math.nan
    return float(a) / float(b)


def _bins(outcomes: Sequence[ArmOutcome], count: int = 60) -> np.ndarray:
    end = max((max(o.arrival_s, default=0.0) for o in outcomes), default=0.0)
    return np.linspace(0.0, max(end, 1e-9), count + 1)


def _binned(xs: np.ndarray, ys: np.ndarray, edges: np.ndarray, q: float) -> np.ndarray:
    out = np.full(len(edges) - 1, np.nan)
    which = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, len(edges) - 2)
    for b in range(len(edges) - 1):
        vals = ys[(which == b) & np.isfinite(ys)]
        if vals.size:
            out[b] = np.percentile(vals, q)
    return out


def _shade_ticks(ax: Any, ticks: Sequence[Mapping[str, Any]]) -> bool:
    """The regime behind ``ax`` from a run's ticks; False when the ticks carry none."""
    if not ticks or all(t.get("regime") in (None, 0) for t in ticks):
        return False
    for a, b in itertools.pairwise(ticks):
        regime = a.get("regime")
        label = _REGIMES[regime] if isinstance(regime, int) and 0 <= regime < 3 else regime
        colour = REGIME_COLOURS.get(str(label))
        if colour:
            ax.axvspan(a["t"], b["t"], color=colour, lw=0, zorder=0)
    return True


def _plot_ttft(outcomes: Sequence[ArmOutcome], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    edges = _bins(outcomes)
    mid = (edges[:-1] + edges[1:]) / 2
    regime_of = next((o for o in outcomes if _shade_ticks(ax, o.ticks)), None)
    for k, o in enumerate(outcomes):
        x, y = np.asarray(o.arrival_s), np.asarray(o.ttft_s, dtype=np.float64)
        colour = f"C{k}"
        ax.plot(mid, _binned(x, y, edges, 99), color=colour, lw=1.6, label=f"{o.name} P99")
        ax.plot(mid, _binned(x, y, edges, 50), color=colour, lw=0.9, ls="--", label=f"{o.name} P50")
    ax.set_yscale("log")
    ax.set_xlabel("arrival time (s since the replay began)")
    ax.set_ylabel("TTFT (s)")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    if regime_of is not None:
        ax.set_title(f"TTFT by arrival; background: the regime of {regime_of.name}", fontsize=9)
        pools = ax.twinx()
        t = [s["t"] for s in regime_of.ticks]
        workers = [float(s.get("prefill_workers") or math.nan) for s in regime_of.ticks]
        pools.step(t, workers, where="post",
                   color="teal", lw=1.0, alpha=0.8)  # fmt: skip
        pools.set_ylabel(f"prefill workers ({regime_of.name})", color="teal", fontsize=8)
        regime_legend(ax, loc="lower right")
    return save(fig, path)


def _plot_arrivals(outcomes: Sequence[ArmOutcome], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4))
    for k, o in enumerate(outcomes):
        arrivals = np.sort(np.asarray(o.arrival_s))
        done = np.sort(np.asarray(o.finish_s)[np.isfinite(o.finish_s)])
        if k == 0:
            ax.plot(arrivals, np.arange(1, arrivals.size + 1), color="black", lw=1.2,
                    label="arrived (every arm)")  # fmt: skip
        ax.plot(done, np.arange(1, done.size + 1), color=f"C{k}", lw=1.0, label=f"{o.name} done")
    ax.set_xlabel("time (s since the replay began)")
    ax.set_ylabel("requests")
    ax.legend(fontsize=7)
    return save(fig, path)


def _plot_reuse(outcomes: Sequence[ArmOutcome], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 3.5))
    edges = _bins(outcomes)
    mid = (edges[:-1] + edges[1:]) / 2
    for k, o in enumerate(outcomes):
        x = np.asarray(o.arrival_s)
        which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
        prompt = np.bincount(which, weights=np.asarray(o.prompt_tokens, float), minlength=len(mid))
        cached = np.bincount(which, weights=np.asarray(o.cached_tokens, float), minlength=len(mid))
        share = np.divide(cached, prompt, out=np.full(len(mid), np.nan), where=prompt > 0)
        ax.plot(mid, share, color=f"C{k}", lw=1.0, label=o.name)
    ax.set_ylim(0, 1)
    ax.set_xlabel("arrival time (s since the replay began)")
    ax.set_ylabel("prompt tokens from a cache")
    ax.legend(fontsize=7)
    return save(fig, path)


def summary_table(outcomes: Sequence[ArmOutcome]) -> str:
    """Every arm's figures, then its ratio to the first arm's TTFT P50, P99 and throughput."""
    first = outcomes[0].summary
    header = ["arm", *(label for _, label in SUMMARY_KEYS)]
    header += [f"{key.removesuffix('_s').replace('_', ' ')} / first" for key in RATIO_KEYS]
    rows = []
    for o in outcomes:
        s = o.summary
        cells: list[Any] = [o.name]
        cells += [s.get(key, math.nan) for key, _ in SUMMARY_KEYS]
        cells += [fmt(_ratio(s.get(key), first.get(key))) for key in RATIO_KEYS]
        rows.append(cells)
    return markdown_table(header, rows)


def write_report(
    out: Path, outcomes: Sequence[ArmOutcome], setup: Mapping[str, Any], title: str
) -> list[Path]:
    """``summary.md``, ``summary.json`` and the three plots in ``out``; returns their paths."""
    if not outcomes:
        raise ValueError("a report needs at least one arm")
    figures = [
        _plot_ttft(outcomes, out / "ttft.png"),
        _plot_arrivals(outcomes, out / "arrivals.png"),
        _plot_reuse(outcomes, out / "prefix_reuse.png"),
    ]
    data = {
        "setup": dict(setup),
        "arms": [
            {
                "name": o.name,
                "summary": o.summary,
                "ratios_to_first": {
                    k: _ratio(o.summary.get(k), outcomes[0].summary.get(k)) for k in RATIO_KEYS
                },
                "files": o.files,
            }
            for o in outcomes
        ],
    }
    summary_json = out / "summary.json"
    summary_json.write_text(strict_dumps(data, indent=2) + "\n")
    text = [
        f"# {title}",
        "## Setup",
        knob_table({k: v for k, v in setup.items() if not isinstance(v, Mapping)}),
        "## Arms",
        "Latencies over every request of the replay, attributed by arrival; throughput over "
        "the whole replay; prefix reuse is the share of prompt tokens served from a KV cache. "
        "The last columns divide each arm's figure by the first arm's.",
        summary_table(outcomes),
        "## Figures",
        *(f"![{p.stem}]({p.name})" for p in figures),
    ]
    summary_md = out / "summary.md"
    summary_md.write_text("\n\n".join(text) + "\n")
    return [summary_md, summary_json, *figures]
