"""The throughput–TTFT P99 frontier of a panel of experiment cells, with a significance rule.

A cell is a mapping with ``throughput_rps`` and ``ttft_p99_s`` (means over trials, None when
unmeasured) and their standard errors under ``*_se``. Trials are few, so a cell is dominated
only by one that beats it beyond the noise; cells the trials cannot tell apart share the
frontier.
"""

from __future__ import annotations

from typing import Any


def dominates(b: dict[str, Any], a: dict[str, Any]) -> bool:
    """b beats a beyond the noise: no worse on throughput (higher) or TTFT P99 (lower) by more
    than their combined standard errors, and better on one by more than that."""
    better = []
    for key, sign in (("throughput_rps", 1.0), ("ttft_p99_s", -1.0)):
        va, vb = a[key], b[key]
        if va is None or vb is None:
            return False
        noise = (a.get(f"{key}_se") or 0.0) + (b.get(f"{key}_se") or 0.0)
        gain = sign * (vb - va)
        if gain < -noise:
            return False
        better.append(gain > noise)
    return any(better)


def mark_frontier(cells: list[dict[str, Any]]) -> None:
    """Mark the cells no other cell beats beyond the noise (``dominates``): a cell beaten only
    within one standard error on each axis stays on, since the trials cannot tell them apart."""
    for a in cells:
        a["frontier"] = a["ttft_p99_s"] is not None and not any(
            dominates(b, a) for b in cells if b is not a
        )
