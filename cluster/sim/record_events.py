"""A simulated run's records as the wire events the service publishes (cluster/events.py), so
that the PoA estimator and the bus tests consume the simulator as they consume the service."""

from __future__ import annotations

from collections.abc import Iterable

from cluster.events import Event, RouteEvent
from cluster.sim.records import RequestRecord

__all__ = ["run_events"]


def run_events(records: Iterable[RequestRecord], regime: str = "below") -> list[Event]:
    """Route and completion events of a simulated run, in the order they happened."""
    timed: list[tuple[float, Event]] = []
    for record in records:
        if record.decision is not None and record.routed is not None:
            route = RouteEvent.from_decision(
                record.decision, record.routed, record.user, regime, record.prefill_decision
            )
            timed.append((record.routed, route))
        if record.finished is not None:
            timed.append((record.finished, record.complete_event(itl_s=record.mean_itl or 0.0)))
    timed.sort(key=lambda pair: pair[0])
    return [event for _, event in timed]
