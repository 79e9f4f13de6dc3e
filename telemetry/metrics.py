"""The Prometheus metrics of docs/design.md §5, defined once on one registry.

The Helm chart's dashboard and alerts depend on these names; everything that reports (the PoA
estimator, the controller, the auction, the event bus) updates the objects here, and
``prometheus_client.generate_latest(REGISTRY)`` serves them:

- ``disagg_poa_hat``, ``disagg_poa_routing``, ``disagg_poa_capacity``: the live PoA estimate and
  its two factors (gauges, ``PoaGauge``);
- ``disagg_poa_impossible_total{factor}``: how many times one of those gauges was set below 1
  (``factor`` is ``poa_hat``, ``poa_routing`` or ``poa_capacity``). Each is realised (or modelled)
  cost over an optimum, so a value below 1 − ``POA_TOLERANCE`` is impossible and means the
  estimator is wrong, not that the cluster beats its optimum. The value is still exported as it
  came (never clamped, so the dashboard shows what the estimator said); the counter counts it and
  the first one per factor is logged as a warning;
- ``disagg_regime`` (0/1/2), ``disagg_router_temperature``, ``disagg_router_overlap_weight``,
  ``disagg_policy_balance`` (λ of controller/evidence.py), ``disagg_routing_cost``,
  ``disagg_ttft_p99_smoothed_seconds``;
- ``disagg_ttft_seconds``, ``disagg_itl_seconds`` (histograms);
- ``disagg_requests_total{status}``, ``disagg_auction_queue_depth``, ``disagg_auction_welfare``
  (planned, at the auction) and ``disagg_auction_realised_welfare`` (on the realised TTFT order,
  once every request of the batch has started),
  ``disagg_auction_revenue_total``, ``disagg_events_dropped_total{reason}``,
  ``disagg_capacity_advice_total``;
- ``disagg_ingress_actor_calls_total{method, plane}`` and
  ``disagg_ingress_view_requests{replica, role, worker}``: what each ingress replica counts
  itself (its unary actor calls on requests' paths, to the control plane or the engines; its
  load view), exported by the replica (``cluster/serve/replica_metrics.py``);
- ``disagg_dynamo_router_agreement_total{role, agree}`` and ``disagg_dynamo_router_cost_gap{role}``
  (Dynamo backend): our router in shadow against Dynamo's picks;
- ``disagg_pool_workers{role}`` (gauge), ``disagg_resplits_total`` and
  ``disagg_resplit_in_progress`` (0/1): the pools' sizes, how many re-splits finished (the worker
  serves in its new role) and whether one is under way (docs/design.md §4, "two levers"; an
  alert on the last one catches a re-split that never finishes).
"""

from __future__ import annotations

import logging

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    disable_created_metrics,
)

log = logging.getLogger(__name__)

# The `_created` timestamp series double every counter's and histogram's exposition and no
# dashboard or alert of ours reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry(auto_describe=True)

# A PoA value below 1 − POA_TOLERANCE is flagged; the slack absorbs float rounding of a ratio
# that is exactly 1 (e.g. poa_hat = poa_routing · poa_capacity with both factors at 1).
POA_TOLERANCE = 1e-9
POA_FACTORS = ("poa_hat", "poa_routing", "poa_capacity")

POA_IMPOSSIBLE = Counter(
    "disagg_poa_impossible",
    "PoA gauge values set below 1 (impossible: realised over optimal), by factor",
    ["factor"],
    registry=REGISTRY,
)
for _factor in POA_FACTORS:
    POA_IMPOSSIBLE.labels(_factor)  # every factor's series exists (at 0) from the start

_poa_warned: set[str] = set()  # factors already logged: one warning each per process


def flag_impossible_poa(factor: str, value: float) -> bool:
    """Count (and, the first time per factor, log) a PoA ``value`` below 1 − ``POA_TOLERANCE``.

    Returns whether it was flagged. NaN and values ≥ 1 − tolerance (∞ included) are not.
    """
    if not value < 1.0 - POA_TOLERANCE:
        return False
    POA_IMPOSSIBLE.labels(factor).inc()
    if factor not in _poa_warned:
        _poa_warned.add(factor)
        log.warning(
            "%s = %r is below 1, which a ratio of realised over optimal cannot be: the PoA "
            "estimate is wrong here (exported unchanged; counted in "
            "disagg_poa_impossible_total{factor=%r}, further ones are not logged)",
            factor,
            value,
            factor,
        )
    return True


class PoaGauge(Gauge):
    """A PoA gauge: ``set`` exports the value as given and flags it when it is below 1.

    The factor is the metric's name without ``disagg_`` (``disagg_poa_hat`` → ``poa_hat``), so
    every caller of ``POA_HAT.set`` and the others (today the simulator's control loop,
    ``cluster/sim/control.py``) is checked without having to know about the check.
    """

    def set(self, value: float) -> None:
        super().set(value)
        flag_impossible_poa(self._name.removeprefix("disagg_"), float(value))


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

POA_HAT = PoaGauge(
    "disagg_poa_hat", "Realised over optimal latency in the window", registry=REGISTRY
)
POA_ROUTING = PoaGauge(
    "disagg_poa_routing", "Router's assignment over the optimal one", registry=REGISTRY
)
POA_CAPACITY = PoaGauge(
    "disagg_poa_capacity", "Realised latency over the router's modelled cost", registry=REGISTRY
)
REGIME = Gauge("disagg_regime", "0 below, 1 transition, 2 saturated", registry=REGISTRY)
ROUTER_TEMPERATURE = Gauge(
    "disagg_router_temperature", "Router softmax temperature tau", registry=REGISTRY
)
ROUTER_OVERLAP_WEIGHT = Gauge(
    "disagg_router_overlap_weight", "Router overlap weight omega", registry=REGISTRY
)
POLICY_BALANCE = Gauge(
    "disagg_policy_balance",
    "Where the applied policy lies between cache affinity (0) and the regime's row (1), "
    "moved by the PoA window's evidence (controller/evidence.py)",
    registry=REGISTRY,
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
AUCTION_REALISED_WELFARE = Gauge(
    "disagg_auction_realised_welfare",
    "Welfare of the last batch whose requests all have a first token, on the realised TTFT order",
    registry=REGISTRY,
)
AUCTION_REVENUE = Counter("disagg_auction_revenue", "VCG payments charged", registry=REGISTRY)
EVENTS_DROPPED = Counter(
    "disagg_events_dropped", "Events skipped, by reason", ["reason"], registry=REGISTRY
)
CAPACITY_ADVICE = Counter(
    "disagg_capacity_advice", "P/D re-split recommendations issued", registry=REGISTRY
)
OLDEST_WAIT = Gauge(
    "disagg_oldest_wait_seconds",
    "How long the longest-waiting routed request has waited for its first token",
    registry=REGISTRY,
)
BACKLOG_DRAINS = Counter(
    "disagg_backlog_drains",
    "Backlogs that drained: the detector and the PoA window forgot the queue's requests",
    registry=REGISTRY,
)
POOL_WORKERS = Gauge(
    "disagg_pool_workers", "Workers per pool, by role", ["role"], registry=REGISTRY
)
RESPLITS = Counter(
    "disagg_resplits", "P/D re-splits finished (a worker serves in its new role)", registry=REGISTRY
)
RESPLIT_IN_PROGRESS = Gauge(
    "disagg_resplit_in_progress",
    "1 while a P/D re-split is draining or warming up a worker, else 0",
    registry=REGISTRY,
)
DYNAMO_AGREEMENT = Counter(
    "disagg_dynamo_router_agreement",
    "Our router in shadow against Dynamo's KvRouter, by role: same worker, a tie in our cost, "
    "or different",
    ["role", "agree"],
    registry=REGISTRY,
)
DYNAMO_COST_GAP = Summary(
    "disagg_dynamo_router_cost_gap",
    "Our cost of Dynamo's pick minus our lowest cost, by role",
    ["role"],
    registry=REGISTRY,
)
INGRESS_ACTOR_CALLS = Counter(
    "disagg_ingress_actor_calls",
    "Unary Ray actor calls this ingress replica made for requests, by plane (control, engine) "
    "and method",
    ["method", "plane"],
    registry=REGISTRY,
)
INGRESS_VIEW_REQUESTS = Gauge(
    "disagg_ingress_view_requests",
    "Requests in flight per worker in one ingress replica's load view",
    ["replica", "role", "worker"],
    registry=REGISTRY,
)

# Families only the Dynamo backend exports (its replicas' shadow router): a simulated service's
# /metrics has every other family of this registry.
DYNAMO_ONLY = frozenset({"disagg_dynamo_router_agreement", "disagg_dynamo_router_cost_gap"})
assert {family.name for family in REGISTRY.collect()} >= DYNAMO_ONLY
