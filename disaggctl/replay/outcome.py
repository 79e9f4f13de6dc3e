"""One arm of a replay as the report reads it, from the simulator or from the live service.

An :class:`ArmOutcome` is plain data (it crosses a Ray task's boundary): the arm's summary
figures and, per request, the columns the plots need. Its requests are also written one JSON
object per line (``requests-<arm>.jsonl``) and its ticks as one JSON list (``ticks-<arm>.json``)
by the side that produced them, so an hour of trace never travels whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from disaggctl.jsonout import strict_dumps

__all__ = ["ArmOutcome", "arm_slug", "latency_summary", "write_jsonl"]


def arm_slug(name: str) -> str:
    """A file-name-safe form of an arm's name (``static:0,1`` → ``static-0-1``)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "arm"


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """One strict JSON object per line; returns how many."""
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(strict_dumps(row) + "\n")
            n += 1
    return n


def _percentile(values: np.ndarray, q: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q)) if finite.size else math.nan


def latency_summary(
    ttft: Sequence[float], itl: Sequence[float], e2e: Sequence[float]
) -> dict[str, float]:
    """TTFT P50/P90/P99, ITL P50/P99 (over tokens or requests, as given) and E2E P99 (NaN
    entries are requests that never got there)."""
    t, i, e = (np.asarray(x, dtype=np.float64) for x in (ttft, itl, e2e))
    return {
        "ttft_p50_s": _percentile(t, 50),
        "ttft_p90_s": _percentile(t, 90),
        "ttft_p99_s": _percentile(t, 99),
        "itl_p50_s": _percentile(i, 50),
        "itl_p99_s": _percentile(i, 99),
        "e2e_p99_s": _percentile(e, 99),
    }


@dataclass
class ArmOutcome:
    """An arm's figures and its per-request columns (NaN where a request got no first token or
    never finished), its ticks (time, regime, pools, policy, PoA) and the files it wrote."""

    name: str
    summary: dict[str, Any]
    arrival_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    ticks: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return arm_slug(self.name)
