"""The metric families the ingress owns (docs/design.md §5 names):

- ``disagg_ttft_seconds``: wall seconds from the request's arrival at the ingress (before its
  body is read) to the first output token coming back from the request path;
- ``disagg_itl_seconds``: wall seconds between token chunks, per token: a chunk of k tokens
  that came Δ after the previous one counts k observations of Δ/k (the first chunk counts
  toward TTFT only: its tokens arrived together, and zero gaps would drag ITL down);
- ``disagg_requests_total{status}``: completion requests by outcome: ``"ok"`` (answered),
  the HTTP status code of a failure (``"400"``, ``"401"``, ``"402"``, ``"404"``, ``"413"``,
  ``"500"``, ``"503"``; for a failure after a stream started, the code in its error event), or
  ``"disconnected"`` (the client left first). A bounded set, as a label must be.

One registry per app, not the process-wide ``telemetry.metrics.REGISTRY``: two apps in one
process (tests) stay apart, and /metrics shows exactly what the ingress owns. Names and buckets
are those of ``telemetry/metrics.py`` (tested), so dashboards read both alike.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

__all__ = ["ITL_BUCKETS", "TTFT_BUCKETS", "IngressMetrics"]

TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.35,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    60.0,
    120.0,
)
ITL_BUCKETS = (0.002, 0.005, 0.008, 0.01, 0.012, 0.015, 0.02, 0.025, 0.03, 0.05, 0.1)


class IngressMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.ttft = Histogram(
            "disagg_ttft_seconds",
            "Time to first token",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "disagg_itl_seconds", "Inter-token latency", buckets=ITL_BUCKETS, registry=self.registry
        )
        self.requests = Counter(
            "disagg_requests", "Requests finished, by status", ["status"], registry=self.registry
        )

    def count(self, status: str) -> None:
        self.requests.labels(status).inc()

    def chunk(self, tokens: int, dt: float) -> None:
        """``tokens`` arrived ``dt`` seconds after the previous chunk."""
        per_token = max(dt, 0.0) / tokens
        for _ in range(tokens):
            self.itl.observe(per_token)

    def text(self) -> str:
        return generate_latest(self.registry).decode()
