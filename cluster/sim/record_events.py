"""A simulated run's records as the wire events the service publishes (cluster/events.py), so
that the PoA estimator and the bus tests consume the simulator as they consume the service."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from cluster.events import CompleteEvent, Event, FirstTokenEvent, RouteEvent

__all__ = ["completion_event", "first_token_event", "run_events"]


def completion_event(record: Any) -> CompleteEvent:
    """The ``complete`` event of a finished ``cluster.sim.records.RequestRecord``."""
    prefill = record.prefill_worker
    return CompleteEvent(
        request_id=record.request_id,
        t=float(record.finished),
        worker_id=operator.index(record.decode_worker),
        prefill_worker_id=None if prefill is None else operator.index(prefill),
        ttft_s=float(record.ttft),
        itl_s=float(record.mean_itl or 0.0),
        e2e_s=float(record.e2e),
        prompt_tokens=operator.index(record.prompt_tokens),
        cached_tokens=operator.index(record.cached_tokens),
        output_tokens=operator.index(record.output_tokens),
        status=record.status,
    )


def first_token_event(record: Any) -> FirstTokenEvent:
    """The ``first_token`` event of a ``cluster.sim.records.RequestRecord`` that has one."""
    prefill = record.prefill_worker
    return FirstTokenEvent(
        request_id=record.request_id,
        t=float(record.first_token),
        worker_id=operator.index(record.decode_worker),
        prefill_worker_id=None if prefill is None else operator.index(prefill),
        ttft_s=float(record.ttft),
    )


def run_events(records: Iterable[Any], regime: str = "below") -> list[Event]:
    """Route and completion events of a simulated run, in the order they happened."""
    timed: list[tuple[float, Event]] = []
    for record in records:
        if record.decision is not None and record.routed is not None:
            route = RouteEvent.from_decision(
                record.decision, record.routed, record.user, regime, record.prefill_decision
            )
            timed.append((record.routed, route))
        if record.finished is not None:
            timed.append((record.finished, completion_event(record)))
    timed.sort(key=lambda pair: pair[0])
    return [event for _, event in timed]
