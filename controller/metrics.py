"""The Prometheus metrics of docs/design.md §5, defined once on one registry.

The Helm chart's dashboard and alerts depend on these names; everything that reports (the PoA
estimator, the controller, the auction, the event bus) updates the objects here, and
``prometheus_client.generate_latest(REGISTRY)`` serves them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

# Latency buckets from 5 ms to 2 min: TTFT spans both sides of the knee.
_LATENCY_BUCKETS = (
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

POA_HAT = Gauge("disagg_poa_hat", "Realised over optimal latency in the window", registry=REGISTRY)
POA_ROUTING = Gauge(
    "disagg_poa_routing", "Router's assignment over the optimal one", registry=REGISTRY
)
POA_CAPACITY = Gauge(
    "disagg_poa_capacity", "Realised latency over the router's modelled cost", registry=REGISTRY
)
REGIME = Gauge("disagg_regime", "0 below, 1 transition, 2 saturated", registry=REGISTRY)
ROUTER_TEMPERATURE = Gauge(
    "disagg_router_temperature", "Router softmax temperature tau", registry=REGISTRY
)
ROUTER_OVERLAP_WEIGHT = Gauge(
    "disagg_router_overlap_weight", "Router overlap weight omega", registry=REGISTRY
)
ROUTING_COST = Gauge(
    "disagg_routing_cost", "Cost of the chosen worker in the last decision", registry=REGISTRY
)
TTFT_P99_SMOOTHED = Gauge(
    "disagg_ttft_p99_smoothed_seconds", "EMA of the windowed TTFT P99", registry=REGISTRY
)
TTFT = Histogram(
    "disagg_ttft_seconds", "Time to first token", buckets=_LATENCY_BUCKETS, registry=REGISTRY
)
ITL = Histogram(
    "disagg_itl_seconds",
    "Inter-token latency",
    buckets=(0.002, 0.005, 0.008, 0.01, 0.012, 0.015, 0.02, 0.025, 0.03, 0.05, 0.1),
    registry=REGISTRY,
)
REQUESTS = Counter("disagg_requests", "Requests finished, by status", ["status"], registry=REGISTRY)
AUCTION_QUEUE_DEPTH = Gauge(
    "disagg_auction_queue_depth", "Requests waiting for admission", registry=REGISTRY
)
AUCTION_WELFARE = Gauge(
    "disagg_auction_welfare", "Welfare of the last auctioned batch", registry=REGISTRY
)
AUCTION_REVENUE = Counter("disagg_auction_revenue", "VCG payments charged", registry=REGISTRY)
EVENTS_DROPPED = Counter(
    "disagg_events_dropped", "Events skipped, by reason", ["reason"], registry=REGISTRY
)
CAPACITY_ADVICE = Counter(
    "disagg_capacity_advice", "P/D re-split recommendations issued", registry=REGISTRY
)
