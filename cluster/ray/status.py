"""What the service's actors say about themselves (``stats()``, ``snapshot()``, ``tick()``):
frozen records, the same object across a Ray call as in process (docs/design.md §5 "Status").

They are read by the controller (the auction's queue depth, the PoA factors), the demo's report,
the benchmarks and the tests; none is a wire format. ``as_json`` turns one into plain JSON
values for a report (enums by their label).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.events import PoolAction
from controller.controller import RegimeChange
from controller.drain import Drain
from controller.resplit import ResplitCancel, ResplitDecision, Role
from router import Policy

__all__ = [
    "AuctionStats",
    "ControllerSnapshot",
    "EngineInflight",
    "InstanceBinding",
    "KvEventCounts",
    "PoaSnapshot",
    "PoolsSnapshot",
    "ResplitOutcome",
    "ResplitStep",
    "RouterStats",
    "UserBalance",
    "as_json",
]


def as_json(record: object) -> Any:  # JSON of the record's shape, which callers index
    """A record as JSON values: dataclasses as objects, tuples as lists, enums by label."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: as_json(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, enum.Enum):
        return getattr(record, "label", record.name)
    if isinstance(record, Mapping):
        return {k: as_json(v) for k, v in record.items()}
    if isinstance(record, tuple | list):
        return [as_json(v) for v in record]
    return record


# -- the PoA actor ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PoaSnapshot:
    """The last estimate (the factors None for an empty window) and what fed it: ``n``
    requests over ``workers`` at ``t``; ``impossible`` names a factor below 1 beyond the
    tolerance; ``received``/``dropped`` count events by kind and by reason, ``joiner`` the
    joins by outcome."""

    poa_hat: float | None
    poa_routing: float | None
    poa_capacity: float | None
    impossible: tuple[str, ...]
    n: int
    workers: tuple[int, ...]
    attribution_rate: float
    t: float | None
    ticks: int
    pending: int
    joiner: Mapping[str, int]
    received: Mapping[str, int]
    errors: int
    dropped: Mapping[str, int]


# -- the workers and the router ------------------------------------------------------


@dataclass(frozen=True)
class EngineInflight:
    """The load of an engine process that tells only its requests in flight (from its own
    ``/metrics``; None while it does not say)."""

    slot: int
    role: str
    instance_id: int | None
    inflight: float | None


@dataclass(frozen=True)
class KvEventCounts:
    applied: Mapping[str, int]
    dropped: Mapping[str, int]


@dataclass(frozen=True)
class InstanceBinding:
    """For a backend whose engines carry ids of their own: the router's map of them
    (``"role/slot"`` → instance id), the KV events that named no bound instance, and the KV
    subject of each role."""

    instances: Mapping[str, int]
    unbound: Mapping[str, int]
    kv_subjects: Mapping[str, str]


@dataclass(frozen=True)
class RouterStats:
    """The router actor's policy, pools and KV events, and the fleet's routing: its own
    routes plus what the ingress replicas' unexpired reports say."""

    policy: Policy
    workers: Mapping[Role, tuple[int, ...]]
    kv_events: Mapping[Role, KvEventCounts]
    in_flight: Mapping[Role, int]
    routed: int
    routed_to: Mapping[Role, Mapping[int, int]]
    retries: int
    replicas: tuple[str, ...]
    routed_by_replica: Mapping[str, int]
    nats_connected: bool | None
    events_dropped: int  # the bus's queue was full, or a delivery raised
    binding: InstanceBinding | None = None


# -- the auction -----------------------------------------------------------------------------


@dataclass(frozen=True)
class UserBalance:
    spent: float
    held: float
    budget: float


@dataclass(frozen=True)
class AuctionStats:
    """The admission queue, the leases (replica → slots), the books, and the welfare: over
    the batches that have all started, ``realised_welfare`` in TTFT order beside
    ``realised_planned_welfare`` in auction order."""

    queue_depth: int
    in_flight: int
    in_prefill: int
    max_in_prefill: int
    prefill_workers: int | None
    leases: Mapping[str, int]
    regime: str
    batches: int
    revenue: float
    welfare: float
    realised_welfare: float
    realised_planned_welfare: float
    user_welfare: Mapping[str, float]
    released_at_start: int
    nats: bool | None
    users: Mapping[str, UserBalance]


# -- the controller and its pools ------------------------------------------------------------


@dataclass(frozen=True)
class ResplitStep:
    """One step of a re-split, as published (wall ``time.time()``)."""

    t: float
    action: PoolAction
    worker_id: int
    to_role: Role
    prefill: tuple[int, ...]
    decode: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class PoolsSnapshot:
    """Who serves in which role, the move under way (worker, role it goes to), how the
    re-splits ended, and the recent steps."""

    prefill: tuple[int, ...]
    decode: tuple[int, ...]
    resplitting: bool
    moving: tuple[int, Role] | None
    completed: int
    abandoned: int
    cancelled: int
    failed: int
    steps: tuple[ResplitStep, ...]


@dataclass(frozen=True)
class ResplitOutcome:
    """How a re-split asked for by hand ended, and the pools then."""

    result: str  # "warm", "abandoned", "cancelled" or "failed"
    pools: PoolsSnapshot


@dataclass(frozen=True)
class ControllerSnapshot:
    """The regime and policy, the version the router holds (``delivered_version``; ``pending``
    a push still owed), the detector's reading and thresholds, the last tick's ``signals``,
    recent regime changes, drains and re-splits, and what the controller was fed."""

    regime: str
    regime_level: int
    tau: float
    omega: float
    version: int
    delivered_version: int
    pending: bool
    push_failures: int
    ttft_p99_smoothed_s: float | None
    ttft_p99_window_s: float | None
    drains: tuple[Drain, ...]
    theta1_s: float
    theta2_s: float
    samples: int
    observed: int
    errors: int
    ticks: int
    tick_errors: int
    signals: Mapping[str, float | None]
    changes: tuple[RegimeChange, ...]
    dropped: Mapping[str, int]
    pools: PoolsSnapshot | None
    resplits: tuple[ResplitDecision, ...]
    resplit_cancels: tuple[ResplitCancel, ...]
