"""Per-request records and the summaries experiments report (percentiles, throughput)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cluster.lifecycle import Lifecycle
from router import Decision


@dataclass(eq=False)
class RequestRecord(Lifecycle):
    """One simulated request's :class:`~cluster.lifecycle.Lifecycle` (the service's steps and
    rules, in simulated seconds since the run began), with what only the simulator sees: its
    prefill and KV transfer, the routers' decisions and every inter-token latency."""

    prefill_start: float | None = None
    prefill_end: float | None = None
    transfer_end: float | None = None
    decision: Decision | None = field(default=None, repr=False)  # the decode route
    prefill_decision: Decision | None = field(default=None, repr=False)  # when remote
    itl: np.ndarray | None = field(default=None, repr=False)

    @property
    def mean_itl(self) -> float | None:
        return None if self.itl is None or self.itl.size == 0 else float(self.itl.mean())


@dataclass(frozen=True)
class Summary:
    """Figures over the requests that finished inside a window [start, end)."""

    start: float
    end: float
    completed: int
    throughput_rps: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    e2e_p99_s: float
    cache_hit_rate: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


def placements_digest(records: Sequence[RequestRecord]) -> str:
    """A digest of where every request ran (its prefill and decode workers, in arrival order).
    Two runs of one workload and seed with the same digest placed every request alike, so
    their figures are one run's: a report shows such arms once, and says so."""
    digest = hashlib.sha256()
    for r in sorted(records, key=lambda r: (r.arrival, r.request_id)):
        digest.update(f"{r.request_id}:{r.prefill_worker}:{r.decode_worker};".encode())
    return digest.hexdigest()[:16]


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    data = np.asarray(values, dtype=np.float64)
    return float(np.percentile(data, q)) if data.size else float("nan")


def summarize(
    records: Sequence[RequestRecord],
    start: float,
    end: float,
    by: Literal["finish", "arrival"] = "finish",
) -> Summary:
    """Throughput of the requests finishing in [start, end); TTFT, ITL (over all tokens) and
    E2E percentiles and the cache hit rate over the same requests (``by="finish"``) or over the
    requests that *arrived* in [start, end) (``by="arrival"``: the latency the load of that
    window met, whenever it finished; a request still without a first token when the records
    were taken has no TTFT to count)."""
    if by not in ("finish", "arrival"):
        raise ValueError(f"by must be 'finish' or 'arrival', got {by!r}")
    done = [r for r in records if r.finished is not None and start <= r.finished < end]
    met = done if by == "finish" else [r for r in records if start <= r.arrival < end]
    ttft = [r.ttft for r in met if r.ttft is not None]
    itl_parts = [r.itl for r in met if r.itl is not None and r.itl.size]
    itl = np.concatenate(itl_parts) if itl_parts else np.zeros(0)
    prompt = sum(r.prompt_tokens for r in met if r.first_token is not None)
    cached = sum(r.cached_tokens for r in met if r.first_token is not None)
    return Summary(
        start=start,
        end=end,
        completed=len(done),
        throughput_rps=len(done) / (end - start) if end > start else float("nan"),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        itl_p50_s=percentile(itl, 50),
        itl_p99_s=percentile(itl, 99),
        e2e_p99_s=percentile([r.e2e for r in met if r.e2e is not None], 99),
        cache_hit_rate=cached / prompt if prompt else 0.0,
    )
