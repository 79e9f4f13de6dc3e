"""The controller actor: TTFT → regime → the router's (τ, ω), live (docs/design.md §4, §5).

It runs the plain ``controller.controller.Controller`` (a ``SaturationDetector`` and a
``PolicyTable``) in the serve runtime:

- TTFT comes from ``disagg.<ns>.first_token`` events (the ingress publishes one per request the
  moment it streams the first token, §3 property 2), each observed at this actor's clock.
- Every ``tick_s`` it ticks the controller with the auction's queue depth and the PoA actor's
  estimate (both optional: a missing handle, a failed or slow call gives None for that tick).
- Recency (``controller.drain``): routes open a request, first tokens close its wait and
  completes end it (``pending_routes``); when a backlog that lasted has drained — the auction's
  queue empty, nobody waiting and no first token taking the detector's down-threshold, two ticks
  running — the detector forgets the queue's TTFTs and the PoA actor its window
  (``forget_before``).
- On a regime change the controller bumps the policy version; ``cluster.ray.policy_push``
  delivers it to the router actor and the regime to the auction actor in the background,
  retried tick after tick while they are down, so ticking never stops (the router keeps its last
  policy meanwhile, §4). Each change is published as a ``RegimeEvent`` on
  ``disagg.<ns>.regime``.

``ControllerSettings`` is the config shape (a StrictModel; the composer passes its
``model_dump()``). Thresholds are wall seconds of TTFT (``theta1_s`` < ``theta2_s``), or multiples
of a calm baseline P99 (``calibrate``), as ``controller.detector.Thresholds.calibrated`` and the
simulator's scenario (k1 = 5, k2 = 15) do, or, when neither is given, ``DEFAULT_THETA_S``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from cluster.actor_bus import (
    ActorBus,
    cancel_all,
    start_loops,
    subscribe_when_connected,
    wait_subscribed,
)
from cluster.actor_ref import ActorRef
from cluster.events import (
    CompleteEvent,
    EngineLoadEvent,
    Event,
    FirstTokenEvent,
    RegimeEvent,
    RouteEvent,
)
from cluster.models import validate_model
from cluster.plausibility import Plausibility
from cluster.ray.actor_support import Ready, ready_record, wake_after_restart
from cluster.ray.controller_pools import ArrivalMeter, build_pools
from cluster.ray.controller_settings import DEFAULT_THETA_S, ControllerSettings
from cluster.ray.live_traffic import LiveTraffic
from cluster.ray.metrics_export import OWNERS, owned_metrics_text
from cluster.ray.pending_routes import EVENT_SLACK_S, PendingRoutes
from cluster.ray.poa_actor import CONNECT_WAIT_S, service_clock
from cluster.ray.policy_push import PolicyPush
from cluster.ray.pools import ActorPools, Launcher
from cluster.ray.refs import AuctionRef, PoaRef, RouterRef
from cluster.ray.status import (
    AuctionStats,
    ControllerSnapshot,
    ResplitOutcome,
)
from cluster.worker_spec import WorkerSpec
from controller.controller import Controller, RegimeChange
from controller.detector import SaturationDetector
from controller.drain import DrainWatch, TickWaits, calm_limit_s
from controller.evidence import EvidencePolicy
from controller.resplit import ResplitDecision, Resplitter
from router import Policy
from telemetry.metrics import OLDEST_WAIT, POOL_WORKERS

__all__ = ["DEFAULT_THETA_S", "ControllerActor", "ControllerSettings"]

T = TypeVar("T")

log = logging.getLogger(__name__)

MAX_CHANGES = 32  # recent regime changes kept for snapshot()
MAX_DECISIONS = 32  # recent re-split decisions kept for snapshot()


def _signal(value: object) -> float | None:
    """A number for Controller.tick, or None (it refuses NaN, strings and booleans)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


class ControllerActor:
    """first_token TTFTs → Controller → router.set_policy / auction.set_regime (module doc)."""

    def __init__(
        self,
        *,
        namespace: str = "disagg",
        nats_url: str | None,
        router: ActorRef | None,
        auction: ActorRef | None,
        poa: ActorRef | None,
        settings: Mapping[str, object],
        epoch_wall: float | None = None,
        pools: dict[str, int] | None = None,
        workers: dict[str, list[int]] | None = None,
        worker_spec: Mapping[str, object] | None = None,
        release_on_shutdown: bool = True,
        launcher: Launcher | None = None,
    ) -> None:
        """``workers`` (ids by role) and ``worker_spec`` (``cluster.worker_spec.WorkerSpec``) give
        the re-split lever its pools (``settings.resplit``); without them it is off.
        ``settings.resplit.enabled`` false: the controller never re-splits on its own.
        ``release_on_shutdown``: false when the service outlives its jobs (``serve deploy``):
        shutdown then leaves the workers a re-split started running.
        ``launcher``: in-process tests' fake actors."""
        self.settings = validate_model(ControllerSettings, settings, "controller settings")
        # The pools' sizes as deployed; a re-split (docs/design.md §4) moves them.
        for role, count in (pools or {}).items():
            if role not in ("prefill", "decode") or not isinstance(count, int) or count < 0:
                raise ValueError(f"pools: bad entry {role!r}: {count!r}")
            POOL_WORKERS.labels(role=role).set(count)
        s = self.settings
        self.router = RouterRef(router) if router is not None else None
        self.auction = AuctionRef(auction) if auction is not None else None
        self.poa = PoaRef(poa) if poa is not None else None
        self.now = service_clock(epoch_wall)
        self.bus = ActorBus(nats_url, namespace, role="controller", name="controller")
        self.drain = DrainWatch()
        self.pending = PendingRoutes()
        self.waits = TickWaits()
        detector = SaturationDetector(
            s.thresholds(),
            window_s=s.window_s,
            min_samples=s.min_samples,
            beta=s.beta,
            hysteresis=s.hysteresis,
            dwell=s.dwell,
        )
        self.push = PolicyPush(router, auction, s.call_timeout_s)
        self.arrivals = ArrivalMeter()
        self.traffic = LiveTraffic()
        # A TTFT is used only for a request the deployment routed (cluster/plausibility.py).
        ids = None if workers is None else [w for pool in workers.values() for w in pool]
        self.plausible = Plausibility(started_wall=epoch_wall, workers=ids)
        self.pools: ActorPools | None = None
        self.resplitter: Resplitter | None = None
        if workers is not None and worker_spec is not None:
            self.pools, self.resplitter = build_pools(
                section=s.resplit,
                workers=workers,
                spec=WorkerSpec.model_validate(worker_spec),
                router=router,
                publish=self.bus.publish,
                ttft_slo_wall_s=detector.thresholds.theta1,
                call_timeout_s=max(s.call_timeout_s, 5.0),  # a drain waits on its own timeout
                detached_service=not release_on_shutdown,
                launcher=launcher,
                on_decision=self._decided,
            )
        self._discovered = False
        table = s.policy.table()
        self.controller = Controller(
            detector, table, self.push.target, on_change=self._changed,
            # enabled: false keeps the lever's hands off (operators' resplit_now still works)
            resplitter=self.resplitter if s.resplit.enabled else None,
            evidence=EvidencePolicy(table) if s.routing == "evidence" else None,
        )  # fmt: skip
        self.auction_stats: AuctionStats | None = None  # the auction's, read every tick
        self.observed = 0
        self.errors = 0  # first_token events the detector refused
        self.ticks = 0
        self.tick_errors = 0
        self.last_signals: dict[str, float | None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed = False
        self.controller.start(self.now())  # version 1: the router starts from a known policy
        self._synced = False  # numbering continued from the router's (after our own restart)
        wake_after_restart()

    # -- lifecycle ---------------------------------------------------------------------------

    def _start(self) -> None:
        # A Ray actor's __init__ runs outside its event loop: the tasks start on the first call.
        if self._tasks:
            return
        self._tasks = start_loops(
            self.bus, controller_subscribe=self._subscribe(), controller_tick=self._tick_loop()
        )
        self.push.kick()  # version 1 goes out now, not a tick later

    async def ready(self) -> Ready:
        self._start()
        connected = await self.bus.wait_connected(CONNECT_WAIT_S)
        if connected:
            await wait_subscribed(self.bus, lambda: self._subscribed)
        return ready_record("controller", nats=connected, subscribed=self._subscribed)

    async def shutdown(self) -> None:
        tasks = [*self._tasks, *([self.push.task] if self.push.task else [])]
        self._tasks, self.push.task = [], None
        await cancel_all(tasks)
        release = getattr(getattr(self.pools, "launcher", None), "release", None)
        if release is not None:  # a local service: the workers re-splits started go with it
            await release()
        await self.bus.close()

    async def metrics_text(self) -> str:
        return owned_metrics_text(OWNERS["controller"])

    # -- TTFT in -----------------------------------------------------------------------------

    async def _subscribe(self) -> None:
        # Without NATS, TTFTs come through on_event (in-process composition).
        # route: the arrival rate (controller_pools) and who waits (pending_routes), which a
        # first_token or a complete (a request that ended without one) closes.
        # engine_load: what the engines held, against which a long TTFT is checked.
        kinds = ("first_token", "route", "complete", "engine_load")
        self._subscribed = await subscribe_when_connected(self.bus, self.on_event, kinds)

    def on_event(self, event: Event) -> None:
        """A decoded event (the bus callback); never raises. Only plausible ones count."""
        dropped = self.plausible.dropped.total()
        usable_events = self.plausible.admit(event)
        if isinstance(event, FirstTokenEvent) and self.plausible.dropped.total() > dropped:
            self.pending.ended(event.request_id)  # ruled out: its route must not wait for good
        for usable in usable_events:
            if isinstance(usable, RouteEvent):
                self.arrivals.observe(self.now())
                self.pending.routed(usable.request_id, self.now())
            elif isinstance(usable, CompleteEvent):
                self.pending.ended(usable.request_id)
                self.traffic.complete(self.now(), usable)
            elif isinstance(usable, EngineLoadEvent):
                self.traffic.engine_load(self.now(), usable)
            elif isinstance(usable, FirstTokenEvent):
                self.pending.answered(usable.request_id)
                self.waits.answered(usable.ttft_s)
                try:
                    self.controller.observe(self.now(), usable.ttft_s)
                    self.observed += 1
                except ValueError:
                    self.errors += 1

    # -- ticks -------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            try:
                await self.tick()
            except Exception:  # a control loop that stops leaves the router stuck: never stop
                self.tick_errors += 1
                log.exception("controller tick failed (%d so far)", self.tick_errors)

    async def tick(self) -> ControllerSnapshot:
        """One control step: signals, Controller.tick, push what is pending; the snapshot."""
        self.plausible.expire()  # first tokens whose route never came
        await self._sync_router()
        queue_depth, poa = await asyncio.gather(self._queue_depth(), self._poa_values())
        signals = {"queue_depth": queue_depth, **poa}
        now = self.now()
        rate = None
        if self.pools is not None:
            if not self._discovered:  # after a restart of this actor: who serves which role
                self._discovered = True
                self.pools.discover()
            rate = self.arrivals.rate(now)
            await self._sync_prefill_slots()
        self.last_signals = signals if rate is None else {**signals, "arrival_rate": rate}
        drain = self.drain.update(now, self._drained(queue_depth, now))
        if drain is not None:  # the queue's samples go, here and in the PoA window
            self.controller.drained(drain)
            estimator, since = self.poa, drain.since
            await self.push.deliver(
                None if estimator is None else (lambda: estimator.forget_before(since)),
                "forget_before",
            )
        self.controller.tick(
            now,
            queue_depth=queue_depth,
            poa_hat=signals.get("poa_hat"),
            poa_routing=signals.get("poa_routing"),
            poa_capacity=signals.get("poa_capacity"),
            arrival_rate=rate,
            backlog_since=self.drain.backlog_since,
            traffic=None if rate is None else self.traffic.reading(now, rate),
        )
        self.ticks += 1
        if len(self.controller.changes) > 2 * MAX_CHANGES:  # the plain Controller keeps them all
            del self.controller.changes[:-MAX_CHANGES]
        self.push.kick()
        return self._snapshot()

    def _drained(self, queue_depth: float | None, now: float) -> bool | None:
        """The backlog reading (``cluster.ray.pending_routes``); None when the auction, which
        holds the queue in front of routing, did not answer."""
        wait = self.pending.oldest_wait_s(now)
        OLDEST_WAIT.set(wait)
        detector = self.controller.detector
        if self.auction is not None and queue_depth is None:
            return None
        return self.waits.reading(
            queued=bool(queue_depth),
            waiting_s=wait,
            idle=self.pending.idle(now),
            limit_s=calm_limit_s(detector.thresholds, detector.hysteresis) + EVENT_SLACK_S,
        )

    async def _sync_prefill_slots(self) -> None:
        """Tell the auction how many workers prefill now whenever its stats (read this tick)
        say otherwise, so a derived ``max_in_prefill`` follows a re-split, and a restarted
        auction learns the pools it was not built with (``AuctionActor.set_prefill_workers``)."""
        assert self.pools is not None
        count = self.pools.pools().prefilling
        known = None if self.auction_stats is None else self.auction_stats.prefill_workers
        if known is not None and known != count:
            auction = self.auction
            await self.push.deliver(
                None if auction is None else (lambda: auction.set_prefill_workers(count)),
                f"set_prefill_workers({count})",
            )

    async def _ask(self, call: Callable[[], Awaitable[T]] | None, what: str) -> T | None:
        """``call()`` within the call timeout, or None (no such peer, failed or slow)."""
        if call is None:
            return None
        try:
            return await asyncio.wait_for(call(), self.settings.call_timeout_s)
        except Exception as exc:  # a dead or slow peer is a missing signal, not an error
            log.debug("%s failed: %r", what, exc)
            return None

    async def _sync_router(self) -> None:
        """Keep the router on the current policy across restarts on either side.

        A restarted router starts from its default policy (version 0); a restarted controller
        from version 1. So: continue our numbering after the router's (versions keep naming one
        policy each), and push the current policy again whenever the router's version is not
        the one we delivered and nothing is pending.
        """
        stats = await self._ask(
            None if self.router is None else self.router.stats, "the router's stats"
        )
        if stats is None:  # the router did not answer
            return
        if self.pools is not None:
            await self.pools.sync_router(stats.workers)
        version = stats.policy.version
        if not self._synced:
            self._synced = True
            if version >= self.controller.version:
                self.controller.version = version
                self._repush()
                return
        if version != self.push.delivered_version and self.push.target.pending is None:
            self._repush()

    def _repush(self) -> None:
        policy = self.controller.table[self.controller.regime]
        self.controller.version += 1
        self.push.target.pending = Policy(
            policy.tau, policy.omega, self.controller.version, self.controller.regime.label
        )

    async def _queue_depth(self) -> float | None:
        self.auction_stats = await self._ask(
            None if self.auction is None else self.auction.stats, "the auction's stats"
        )
        return None if self.auction_stats is None else _signal(self.auction_stats.queue_depth)

    async def _poa_values(self) -> dict[str, float | None]:
        snap = await self._ask(None if self.poa is None else self.poa.snapshot, "the PoA snapshot")
        if snap is None:  # the PoA actor did not answer
            return dict.fromkeys(("poa_hat", "poa_routing", "poa_capacity"))
        return {
            "poa_hat": _signal(snap.poa_hat),
            "poa_routing": _signal(snap.poa_routing),
            "poa_capacity": _signal(snap.poa_capacity),
        }

    # -- re-splits ---------------------------------------------------------------------------

    def _decided(self, decision: ResplitDecision) -> None:
        if self.resplitter is not None and len(self.resplitter.decisions) > 2 * MAX_DECISIONS:
            del self.resplitter.decisions[:-MAX_DECISIONS]

    async def resplit_now(
        self, to_role: str, reason: str = "operator", worker_id: int | None = None
    ) -> ResplitOutcome:
        """Move one worker to ``to_role`` now, whatever the signals say (operators, tests);
        returns when it is done: how it ended ("warm", "abandoned", "cancelled" or "failed")
        and the pools then."""
        self._start()
        if self.pools is None:
            raise ValueError("the re-split lever is off: no worker pools were given")
        if to_role not in ("prefill", "decode"):
            raise ValueError(f"to_role must be 'prefill' or 'decode', got {to_role!r}")
        if worker_id is not None and (type(worker_id) is not int or worker_id < 0):
            raise ValueError(f"worker_id must be an int >= 0, got {worker_id!r}")
        result = await self.pools.move(to_role, str(reason)[:512], worker_id)  # type: ignore[arg-type]
        return ResplitOutcome(result, self.pools.snapshot())

    # -- changes out -------------------------------------------------------------------------

    def _changed(self, change: RegimeChange) -> None:
        self.push.regime_changed(change.regime.label)
        try:
            self.bus.publish(RegimeEvent.from_change(change))
        except Exception:  # an event is a report; the policy push must happen regardless
            log.exception("could not publish the regime event")

    # -- snapshot ----------------------------------------------------------------------------

    async def snapshot(self) -> ControllerSnapshot:
        """Regime, τ, ω, version, smoothed P99, recent changes, delivery and signal state."""
        self._start()
        return self._snapshot()

    def _snapshot(self) -> ControllerSnapshot:
        c = self.controller
        d = c.detector
        policy = c.table[d.regime]
        bus = self.bus.bus
        resplitter = self.resplitter
        return ControllerSnapshot(
            regime=d.regime.label,
            regime_level=int(d.regime),
            tau=policy.tau,
            omega=policy.omega,
            version=c.version,
            delivered_version=self.push.delivered_version,
            pending=self.push.target.pending is not None,
            push_failures=self.push.failures,
            ttft_p99_smoothed_s=d.smoothed_p99,
            ttft_p99_window_s=d.last_p99,
            drains=tuple(self.drain.drains),
            theta1_s=d.thresholds.theta1,
            theta2_s=d.thresholds.theta2,
            samples=d.samples,
            observed=self.observed,
            errors=self.errors,
            ticks=self.ticks,
            tick_errors=self.tick_errors,
            signals=dict(self.last_signals),
            changes=tuple(c.changes[-MAX_CHANGES:]),
            dropped={**({} if bus is None else bus.dropped), **self.plausible.dropped},
            pools=None if self.pools is None else self.pools.snapshot(),
            resplits=tuple(resplitter.decisions[-MAX_DECISIONS:]) if resplitter else (),
            resplit_cancels=tuple(resplitter.cancels[-MAX_DECISIONS:]) if resplitter else (),
        )
