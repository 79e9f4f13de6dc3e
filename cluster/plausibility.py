"""What a consumer of the data plane's events can rule out (docs/design.md §5, "Plausibility").

The bus refuses what is malformed; an event that is well-formed can still be impossible for the
deployment that reads it. The controller turns ``first_token`` TTFTs into a regime, so a process
that reaches NATS could publish a few hundred invented 60 s TTFTs and switch an idle service to
``saturated``. Before an event is used, :class:`Plausibility` checks what the consumer knows:

- ``implausible_unrouted``: a ``first_token`` for a request no ``route`` event announced (or
  announced and answered already). Routes and first tokens travel in separate batches, read by
  separate subscriptions, so a first token may come before its route: it is held for
  ``hold_s`` and used when the route comes, dropped otherwise;
- ``implausible_worker``: a worker id outside the deployment's workers;
- ``implausible_time``: a time in the future, a TTFT longer than the service has run, or a TTFT
  shorter than the time from the request's routing to its first token (it arrived before it was
  routed);
- ``implausible_idle``: a TTFT over ``CORROBORATE_ABOVE_S`` during which the engines' own
  ``engine_load`` snapshots show every worker idle (``cluster/engine_activity.py``): what the
  ingress role cannot forge is what the engines say they held.

Each drop is counted in ``disagg_events_dropped_total{reason}``. This is a second line: what
keeps a forger off the bus is NATS's credentials; what these checks add is that a forger, or a
buggy publisher, must also know the deployment's requests and workers. Bounded: at most
``max_routes`` routes remembered (the oldest forgotten first) and ``max_held`` first tokens held.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection

from cluster.engine_activity import CORROBORATE_ABOVE_S, EngineActivity
from cluster.events import EngineLoadEvent, Event, FirstTokenEvent, RouteEvent
from cluster.wire import DROP_REASONS
from telemetry.metrics import EVENTS_DROPPED

__all__ = ["REASONS", "Plausibility"]

REASONS = ("implausible_unrouted", "implausible_worker", "implausible_time", "implausible_idle")
assert DROP_REASONS.issuperset(REASONS)  # the metric's label set is fixed in cluster/wire.py
HOLD_S = 2.0  # a first token waits this long for its route (both leave every 25 ms)
SKEW_S = 5.0  # clocks of different hosts may disagree by this much
# For the engines' snapshots against a TTFT's span: NTP keeps hosts within milliseconds, and a
# long TTFT means engines busy for most of it, so a small margin cannot turn one idle.
IDLE_SKEW_S = 0.5
MAX_ROUTES = 100_000  # ~100 s of routes at 1000 requests/s: far past any prefill
MAX_HELD = 10_000


class Plausibility:
    """Filters a consumer's ``route`` and ``first_token`` events (module docstring).

    ``started_wall``: the service's start (``time.time()``), None if unknown; ``workers``: the
    deployment's worker ids, None if unknown; ``wall``: the clock (tests)."""

    def __init__(
        self, *, started_wall: float | None = None, workers: Collection[int] | None = None,
        hold_s: float = HOLD_S, skew_s: float = SKEW_S, max_routes: int = MAX_ROUTES,
        max_held: int = MAX_HELD, wall: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.started_wall, self.hold_s, self.skew_s = started_wall, hold_s, skew_s
        self.workers = None if workers is None else frozenset(workers)
        self.max_routes, self.max_held, self.wall = max_routes, max_held, wall
        self._routes: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._held: collections.OrderedDict[str, tuple[float, FirstTokenEvent]] = (
            collections.OrderedDict()
        )
        self.activity = EngineActivity(workers)
        self.dropped: collections.Counter[str] = collections.Counter()
        for reason in REASONS:
            EVENTS_DROPPED.labels(reason)  # every series from the start, for rate()

    def admit(self, event: Event) -> list[Event]:
        """The events usable now: ``event`` if plausible (a route also brings the first token
        held for it); nothing if it is held or dropped. An engine's snapshot is remembered as
        evidence; other kinds pass unchecked."""
        if isinstance(event, EngineLoadEvent):
            self.activity.observe(event)
            return [event]
        if isinstance(event, RouteEvent):
            return self._route(event)
        if isinstance(event, FirstTokenEvent):
            return self._first_token(event)
        return [event]

    def expire(self) -> None:
        """Drop the first tokens whose route did not come within ``hold_s``."""
        limit = self.wall() - self.hold_s
        while self._held and next(iter(self._held.values()))[0] <= limit:
            self._held.popitem(last=False)
            self._drop("implausible_unrouted")

    # -- the checks --------------------------------------------------------------------------

    def _route(self, event: RouteEvent) -> list[Event]:
        if not self._known_worker(event.worker_id):
            self._drop("implausible_worker")
            return []
        if event.t > self.wall() + self.skew_s:
            self._drop("implausible_time")
            return []
        self._routes[event.request_id] = event.t
        self._routes.move_to_end(event.request_id)
        while len(self._routes) > self.max_routes:
            self._routes.popitem(last=False)
        held = self._held.pop(event.request_id, None)
        return [event, *self._first_token(held[1])] if held else [event]

    def _first_token(self, event: FirstTokenEvent) -> list[Event]:
        reason = self._impossible(event)
        if reason is not None:
            self._drop(reason)
            return []
        routed = self._routes.pop(event.request_id, None)  # answered: a second one is unrouted
        if routed is None:
            self._hold(event)
            return []
        if event.ttft_s + self.skew_s < event.t - routed:
            self._drop("implausible_time")  # it would have arrived after it was routed
            return []
        return [event]

    def _impossible(self, event: FirstTokenEvent) -> str | None:
        workers = (event.worker_id, event.prefill_worker_id)
        if not all(w is None or self._known_worker(w) for w in workers):
            return "implausible_worker"
        if event.t > self.wall() + self.skew_s:
            return "implausible_time"
        started = self.started_wall
        if started is not None and event.ttft_s > event.t - started + self.skew_s:
            return "implausible_time"  # longer than the service has run
        if event.ttft_s >= CORROBORATE_ABOVE_S and self.activity.idle_throughout(
            event.t - event.ttft_s + IDLE_SKEW_S, event.t - IDLE_SKEW_S
        ):
            return "implausible_idle"  # a long wait while every engine held nothing
        return None

    def _hold(self, event: FirstTokenEvent) -> None:
        if event.request_id in self._held or len(self._held) >= self.max_held:
            self._drop("implausible_unrouted")
            return
        self._held[event.request_id] = (self.wall(), event)

    def _known_worker(self, worker: int) -> bool:
        return self.workers is None or worker in self.workers

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        EVENTS_DROPPED.labels(reason).inc()
