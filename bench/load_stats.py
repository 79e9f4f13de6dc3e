"""What a closed-loop load run measured, for every HTTP benchmark: one :class:`Sample` per
request and :func:`summarize` over a counted window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Sample", "ms_percentile", "summarize"]


@dataclass(frozen=True)
class Sample:
    started: float  # seconds since the point (level) began
    ended: float
    error: str | None  # None: the stream ended normally; else why (an HTTP status, an exception)
    ttft_s: float | None  # to the first chunk with content
    chunks: int  # chunks with content

    @property
    def e2e_s(self) -> float:
        return self.ended - self.started


def ms_percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds; None when empty."""
    return round(1e3 * float(np.percentile(values, q)), 2) if values else None


def summarize(samples: Sequence[Sample], warmup: float, seconds: float) -> dict[str, Any]:
    """Latencies and content of the requests started in the counted window [warmup, seconds);
    requests/s: those answered within it, over its length."""
    counted = [s for s in samples if warmup <= s.started < seconds]
    ok = [s for s in counted if s.error is None]
    errors: dict[str, int] = {}
    for s in counted:
        if s.error is not None:
            errors[s.error] = errors.get(s.error, 0) + 1
    answered = sum(1 for s in samples if s.error is None and warmup <= s.ended < seconds)
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    e2e = [s.e2e_s for s in ok]
    return {
        "requests": len(ok),
        "errors": errors,
        "no_content": sum(1 for s in ok if s.ttft_s is None),
        "rps": round(answered / (seconds - warmup), 3),
        "ttft_p50_ms": ms_percentile(ttft, 50),
        "ttft_p99_ms": ms_percentile(ttft, 99),
        "e2e_p50_ms": ms_percentile(e2e, 50),
        "e2e_p99_ms": ms_percentile(e2e, 99),
        "chunks_mean": round(float(np.mean([s.chunks for s in ok])), 2) if ok else None,
    }
