"""The PoA actor: the live Price-of-Anarchy estimate of the serve runtime (docs/design.md §3
"Game 3", §5 events and metrics).

It subscribes to ``disagg.<ns>.route`` (the router actor's decisions), ``.first_token`` and
``.complete`` (the ingress), and ``.engine_load`` (the engines' snapshots, against which a long
TTFT is checked: ``cluster/engine_activity.py``), joins the first three by request id
(``games.join.EventJoiner``), keeps a ``games.poa.PoaEstimator`` window and every ``tick_s``
estimates poa_hat and its two factors, sets the ``disagg_poa_*`` gauges and keeps the result for
:meth:`PoaActor.snapshot`.

- The completion half of a request is its ``first_token`` event: TTFT is all the estimator needs
  of a completion, and it is known long before the end (§3 property 2, "Timely"). A ``complete``
  event is used only when no ``first_token`` was seen for that request (lost, or the request
  failed before its first token: then its status counts it as failed in the attribution rate).
- Times: every record is stamped with this actor's own clock when it arrives, not with the
  publisher's ``t``. The router and the ingress may stamp on different clocks (virtual time, wall
  time, another node); NATS delivers within milliseconds, and one router publishes in decision
  order, so arrival order is routing order and the window ages on one clock.
- Requests enter the window at their first token and age by their routing time (the route
  event's arrival here), so a load step shows within a tick or two of its first tokens. When the
  controller sees a backlog drain (``forget_before``) the requests routed before it leave.
- The profile's unloaded TTFT (the estimator's anchor at zero load) is in virtual seconds; the
  ingress measures wall seconds, so it is divided by ``speedup``. Without a profile the model is
  fitted on the window alone (games/poa.py "Anchor").
- Nothing here raises into the bus: a message that does not decode is counted by the bus
  (``disagg_events_dropped_total{reason}``), one the joiner cannot use is counted in ``errors``,
  and a tick that fails is logged and the next one runs. An empty window reports None values
  and sets the gauges to NaN ("no estimate", rather than a stale one).

The class is plain Python; the composer wraps it with ``ray.remote`` ("Serve runtime").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable

from cluster.actor_bus import (
    ActorBus,
    cancel_all,
    start_loops,
    subscribe_when_connected,
    wait_subscribed,
)
from cluster.events import CompleteEvent, Event, FirstTokenEvent, RouteEvent
from cluster.plausibility import Plausibility
from cluster.ray.actor_support import Ready, ready_record, wake_after_restart
from cluster.ray.metrics_export import OWNERS, owned_metrics_text
from cluster.ray.status import PoaSnapshot
from games.join import EventJoiner
from games.poa import MAX_AGE_S, PoaEstimate, PoaEstimator
from telemetry import metrics

__all__ = ["PoaActor", "service_clock"]

log = logging.getLogger(__name__)

KINDS = ("route", "first_token", "complete")
# Read besides them: the engines' snapshots, against which a long TTFT is checked
# (cluster/engine_activity.py), as at the controller.
SUBSCRIBED = (*KINDS, "engine_load")
MAX_REQUESTS = 256  # the window's size cap, as the simulator's scenario uses (bench.poa: ~ms)
CONNECT_WAIT_S = 5.0  # ready() waits this long for NATS, then keeps connecting in the background


def service_clock(epoch_wall: float | None) -> Callable[[], float]:
    """Seconds since the service's epoch on the monotonic clock (never goes back, never < 0).

    All actors of one service share ``epoch_wall`` (time.time() at start, "Serve runtime"
    conventions); without one the actor's own start is the epoch."""
    wall = time.time() if epoch_wall is None else float(epoch_wall)
    t0 = time.monotonic() - (time.time() - wall)
    return lambda: max(0.0, time.monotonic() - t0)


def _unloaded(profile: str | None, speedup: float) -> float | None:
    """The profile's unloaded TTFT in wall seconds; None without a profile (the estimator then
    fits its model on the window alone, games/poa.py)."""
    if profile is None:
        return None
    from cluster.sim.profile import load_profile  # the simulator only when a profile is named
    from cluster.sim.scenario import unloaded_ttft

    return unloaded_ttft(load_profile(profile)) / speedup


def _value(x: float) -> float | None:
    # JSON has no NaN; None is "no estimate". inf is a real reading (an optimum of zero cost).
    return None if math.isnan(x) else float(x)


class PoaActor:
    """Route + first_token (+ complete) events → windowed poa_hat (module docstring)."""

    def __init__(
        self,
        *,
        namespace: str = "disagg",
        nats_url: str | None,
        window_s: float = MAX_AGE_S,
        tick_s: float = 1.0,
        profile: str | None = None,
        speedup: float = 1.0,
        epoch_wall: float | None = None,
        max_requests: int = MAX_REQUESTS,
        ttl_s: float = 60.0,
        workers: dict[str, list[int]] | None = None,
    ) -> None:
        for name, value in (("window_s", window_s), ("tick_s", tick_s), ("speedup", speedup)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        unloaded_s = _unloaded(profile, float(speedup))
        self.tick_s = float(tick_s)
        self.estimator = PoaEstimator(max_requests, float(window_s), unloaded_latency_s=unloaded_s)
        self.joiner = EventJoiner(ttl_s=ttl_s)
        # What the deployment rules out (cluster/plausibility.py), as at the controller: a
        # forged route or first token must also name its workers and a possible time.
        ids = None if workers is None else [w for pool in workers.values() for w in pool]
        self.plausible = Plausibility(started_wall=epoch_wall, workers=ids)
        self.now = service_clock(epoch_wall)
        self.bus = ActorBus(nats_url, namespace, role="poa", name="poa")
        self.received: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.errors = 0  # events that decoded but the joiner or estimator refused
        self.ticks = 0
        self.tick_errors = 0
        self.last: PoaEstimate | None = None
        self.last_t: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed = False
        wake_after_restart()

    # -- lifecycle ---------------------------------------------------------------------------

    def _start(self) -> None:
        # A Ray actor's __init__ runs outside its event loop: the tasks start on the first call.
        if self._tasks:
            return
        self._tasks = start_loops(
            self.bus, poa_subscribe=self._subscribe(), poa_tick=self._tick_loop()
        )

    async def ready(self) -> Ready:
        """Start, wait up to CONNECT_WAIT_S for NATS (then keep trying in the background)."""
        self._start()
        connected = await self.bus.wait_connected(CONNECT_WAIT_S)
        if connected:
            await wait_subscribed(self.bus, lambda: self._subscribed)
        return ready_record("poa", nats=connected, subscribed=self._subscribed)

    async def shutdown(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_all(tasks)
        await self.bus.close()

    async def metrics_text(self) -> str:
        return owned_metrics_text(OWNERS["poa"])

    # -- events in ---------------------------------------------------------------------------

    async def _subscribe(self) -> None:
        # Without NATS, events come through on_event (in-process composition).
        self._subscribed = await subscribe_when_connected(self.bus, self.on_event, SUBSCRIBED)

    def on_event(self, event: Event) -> None:
        """One decoded event (the bus callback). Never raises: a bad one is counted; an
        impossible one is dropped (``implausible_*``)."""
        try:
            for usable in self.plausible.admit(event):
                self._feed(usable)
        except Exception:
            self.errors += 1
            if self.errors & (self.errors - 1) == 0:  # 1st, 2nd, 4th, ...: never a flood
                log.exception("PoA actor could not use a %s event", type(event).__name__)

    def _feed(self, event: Event) -> None:
        now = self.now()
        joined = None
        if isinstance(event, RouteEvent):
            self.received["route"] += 1
            joined = self.joiner.add_route(dataclasses.replace(event.to_record(), t=now))
        elif isinstance(event, FirstTokenEvent):
            self.received["first_token"] += 1
            joined = self.joiner.add_completion(dataclasses.replace(event.to_record(), t=now))
        elif isinstance(event, CompleteEvent):
            self.received["complete"] += 1
            # Only when the first token never came: else it would be a duplicate half.
            if not self.joiner.has_completion(event.request_id):
                joined = self.joiner.add_completion(dataclasses.replace(event.to_record(), t=now))
        if joined is not None:
            self.estimator.add(joined)

    # -- ticks -------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                self.tick()
            except Exception:  # the estimate is a report: one bad window must not end them
                self.tick_errors += 1
                log.exception("PoA tick failed (%d so far)", self.tick_errors)

    def tick(self) -> PoaSnapshot:
        """Expire stale halves, estimate over the window, set the gauges; the snapshot."""
        now = self.now()
        self.joiner.expire(now)
        self.plausible.expire()  # first tokens whose route never came
        window = self.estimator.window(now)
        estimate = self.estimator.estimate(now) if window else None
        self.last, self.last_t = estimate, now
        self.ticks += 1
        values = (
            (metrics.POA_HAT, estimate.poa_hat if estimate else math.nan),
            (metrics.POA_ROUTING, estimate.poa_routing if estimate else math.nan),
            (metrics.POA_CAPACITY, estimate.poa_capacity if estimate else math.nan),
        )
        for gauge, value in values:
            gauge.set(value)  # PoaGauge flags (counts) a value below 1: see telemetry/metrics
        return self._snapshot()

    async def forget_before(self, since: float) -> PoaSnapshot:
        """A backlog drained at ``since`` (the controller's ``controller.drain``, on the shared
        service clock): the window forgets the requests routed before it; the new snapshot."""
        if isinstance(since, bool) or not isinstance(since, int | float):
            raise ValueError(f"since must be a number, got {since!r}")
        self.estimator.forget_before(float(since))
        return self.tick()

    async def snapshot(self) -> PoaSnapshot:
        """poa_hat, poa_routing, poa_capacity (None: empty window), n, attribution_rate, t, and
        what was received, dropped and flagged."""
        self._start()
        return self._snapshot()

    def _snapshot(self) -> PoaSnapshot:
        est = self.last
        factors = {
            "poa_hat": None if est is None else _value(est.poa_hat),
            "poa_routing": None if est is None else _value(est.poa_routing),
            "poa_capacity": None if est is None else _value(est.poa_capacity),
        }
        bus = self.bus.bus
        # The same test the metrics module counts in disagg_poa_impossible_total.
        low = 1 - metrics.POA_TOLERANCE
        impossible = sorted(f for f, v in factors.items() if v is not None and v < low)
        return PoaSnapshot(
            **factors,
            impossible=tuple(impossible),
            n=0 if est is None else est.n,
            workers=() if est is None else tuple(est.workers),
            attribution_rate=self.joiner.attribution_rate,
            t=self.last_t,
            ticks=self.ticks,
            pending=self.joiner.pending,
            joiner=dict(self.joiner.counts),
            received=dict(self.received),
            errors=self.errors,
            dropped={**({} if bus is None else bus.dropped), **self.plausible.dropped},
        )
