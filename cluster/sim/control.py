"""The control loop on a simulated cluster: the controller and the PoA estimator, ticking in
virtual time exactly as the live actors tick in wall time.

Every first token feeds the detector (its TTFT) and the joiner (the request's routing decision and
its ``first_token`` event, as the bus would deliver them), as the controller and PoA actors take
them in serve mode: the request enters the PoA window then, keyed by its routing time
(docs/design.md §3 property 2). Every ``tick_s`` the estimator refreshes poa_hat over its window
and the controller ticks with it, so the routers' (τ, ω) follow the regime and, with a
re-split lever, the pools follow Game 1's split (``SimPools`` adapts the cluster to
``controller.resplit.PoolTarget``). When a backlog that lasted drains (``controller.drain``: the
admission queue empty, no routed request waiting, or about to wait, to start and no first token
during the tick that took as long as the detector's down-threshold, two ticks running) the PoA
window and the detector forget the requests that met it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from cluster.events import RouteEvent
from cluster.sim.cluster import SimCluster
from cluster.sim.pools import PoolChange
from cluster.sim.records import RequestRecord
from controller.controller import Controller
from controller.drain import Drain, DrainWatch, TickWaits, calm_limit_s
from controller.resplit import Pools, Role
from controller.traffic import Traffic, TrafficShape
from games.join import EventJoiner
from games.poa import PoaEstimate, PoaEstimator
from telemetry import metrics


@dataclass(frozen=True)
class TickSample:
    """What one tick saw: the timeline the demo and the adaptive benchmark plot."""

    t: float
    regime: int
    tau: float
    omega: float
    ttft_p99_window_s: float | None
    ttft_p99_smoothed_s: float | None
    poa_hat: float
    poa_routing: float
    poa_capacity: float
    queue_depth: int
    in_flight: int
    prefill_workers: int = 0
    decode_workers: int = 0
    arrival_rate: float = 0.0


# The traffic's window: 30 s holds some 80 of Mooncake's requests at its own rate, enough for a
# mean prompt that one 30k-token conversation does not swing; a first token answers a request
# that may have waited a minute in a backlog, so the scan for reuse looks that much further back.
TRAFFIC_WINDOW_S = 30.0
REUSE_LOOKBACK_S = 120.0


class SimPools:
    """``controller.resplit.PoolTarget`` over a simulated cluster."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def pools(self) -> Pools:
        now = self.cluster.pools
        return Pools(now.prefill, now.decode)

    def resplitting(self) -> bool:
        return self.cluster.resplitting

    def resplit(self, to_role: Role, reason: str, workers: int = 1) -> None:
        self.cluster.resplit(to_role, reason, workers)

    def max_step(self) -> int:
        """Any number: each worker drains and restarts on its own."""
        return len(self.cluster.pool_state.holds)

    def switch_s(self) -> float:
        """The profile's role switch (virtual seconds, the controller's clock here); a drain
        adds the moving worker's in-flight work, a second or two on decode, left out."""
        return self.cluster.pool_state.role_switch_s

    def cancel(self, reason: str) -> bool:
        return self.cluster.pool_state.cancel(reason)


class ControlLoop:
    def __init__(
        self,
        cluster: SimCluster,
        controller: Controller | None,
        estimator: PoaEstimator,
        *,
        tick_s: float = 1.0,
        until: float = float("inf"),
        on_tick: Callable[[TickSample], None] | None = None,
        drain_limit_s: float | None = None,
        poa_every_s: float = 0.0,
    ) -> None:
        """``drain_limit_s``: the longest TTFT a drained cluster shows (``controller.drain``);
        default the controller's down-threshold, and without a controller no drains (a static
        arm compared with an adaptive one passes the same limit, so both windows age alike).
        ``poa_every_s``: the PoA estimate is refreshed on the first tick at least this long
        after the last one (0: every tick, as the live PoA actor does); the ticks between
        reuse it. A replay of an hour of trace sets it: one estimate costs ~15 ms."""
        if tick_s <= 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        if not 0.0 <= poa_every_s < float("inf"):
            raise ValueError(f"poa_every_s must be finite and >= 0, got {poa_every_s}")
        self.cluster = cluster
        self.controller = controller
        self.estimator = estimator
        self.joiner = EventJoiner(ttl_s=max(60.0, 10 * tick_s))
        self.tick_s = tick_s
        self.until = until
        self.on_tick = on_tick
        self.timeline: list[TickSample] = []
        self.last: PoaEstimate | None = None
        self.poa_every_s = poa_every_s
        self._estimated_at = -math.inf
        self.pool_changes: list[PoolChange] = []
        self.drain = DrainWatch()
        self.waits = TickWaits()
        if drain_limit_s is None and controller is not None:
            detector = controller.detector
            drain_limit_s = calm_limit_s(detector.thresholds, detector.hysteresis)
        self.drain_limit_s = drain_limit_s
        cluster.pool_listeners.append(self.pool_changes.append)
        cluster.first_token_listeners.append(self._first_token)
        cluster.completion_listeners.append(self._completed)
        if controller is not None:
            controller.start(cluster.now)
        cluster.loop.after(tick_s, self._tick)

    def arrival_rate(self, window_s: float = 10.0) -> float:
        """Requests per second that arrived over the last ``window_s``: the demand."""
        now = self.cluster.now
        horizon = now - window_s
        arrived = 0
        for record in reversed(self.cluster.records):
            if record.arrival <= horizon:
                break
            arrived += 1
        return arrived / min(window_s, max(now, 1e-9))

    def traffic(self, window_s: float = TRAFFIC_WINDOW_S) -> Traffic:
        """This tick's traffic (``controller.traffic``): λ and the mean prompt and output of the
        requests that arrived over the last ``window_s``, the reuse met by the prefills that
        answered in it (whenever they arrived: under a backlog the window's own arrivals have
        not started yet), and the prompt tokens the prefill pool still has to compute (waiting
        prompts at that reuse, as their cache lookup happens when they start, and the requests
        the admission stage holds, at the window's mean)."""
        now = self.cluster.now
        since = now - window_s
        arrived = prompt = output = seen = cached = 0
        for record in reversed(self.cluster.records):
            if record.arrival <= since - REUSE_LOOKBACK_S:
                break
            if record.arrival > since:
                arrived += 1
                prompt += record.prompt_tokens
                output += record.output_tokens
            if record.first_token is not None and record.first_token > since:
                seen += record.prompt_tokens
                cached += record.cached_tokens
        rate = arrived / min(window_s, max(now, 1e-9))
        reuse = min(1.0, cached / seen) if seen else 0.0
        shape = None
        if arrived:
            shape = TrafficShape(prompt / arrived, max(1.0, output / arrived), reuse)
        queued = sum(
            (1.0 - reuse) * sum(j.prompt_tokens for j in p.waiting)
            + sum(j.remaining for j in p.running)
            for p in self.cluster.prefill.values()
        )
        if shape is not None:  # the admission stage's queue is prefill work not yet routed
            queued += self.cluster.admission.depth * shape.new_tokens
        return Traffic(rate, shape, queued)

    def _completed(self, record: RequestRecord) -> None:
        metrics.REQUESTS.labels(record.status).inc()
        if record.mean_itl is not None:
            metrics.ITL.observe(record.mean_itl)

    def _first_token(self, record: RequestRecord) -> None:
        if record.ttft is not None:
            self.waits.answered(record.ttft)
        if record.ttft is not None and self.controller is not None:
            self.controller.observe(self.cluster.now, record.ttft)
        if record.decision is not None and record.routed is not None:
            route = RouteEvent.from_decision(
                record.decision, record.routed, record.user, "", record.prefill_decision
            )
            self.joiner.add_route(route.to_record())
        joined = self.joiner.add_completion(record.first_token_event().to_record())
        if joined is not None:
            self.estimator.add(joined)

    def drained(self) -> bool | None:
        """This tick's backlog reading (``controller.drain``); None without a drain limit."""
        if self.drain_limit_s is None:
            return None
        cluster = self.cluster
        return self.waits.reading(
            queued=cluster.admission.depth > 0,
            waiting_s=cluster.start_wait(),
            idle=cluster.in_flight == 0,
            limit_s=self.drain_limit_s,
        )

    def _forget(self, drain: Drain) -> None:
        self.estimator.forget_before(drain.since)
        if self.controller is not None:
            self.controller.drained(drain)

    def _tick(self) -> None:
        now = self.cluster.now
        self.joiner.expire(now)
        drain = self.drain.update(now, self.drained())
        if drain is not None:
            self._forget(drain)
        if self.last is None or drain is not None or now - self._estimated_at >= self.poa_every_s:
            self.last = self.estimator.estimate(now)
            self._estimated_at = now
        est = self.last
        metrics.POA_HAT.set(est.poa_hat)
        metrics.POA_ROUTING.set(est.poa_routing)
        metrics.POA_CAPACITY.set(est.poa_capacity)
        depth = self.cluster.admission.depth + self.cluster.backlog
        traffic = self.traffic()
        rate = traffic.arrival_rate
        metrics.AUCTION_QUEUE_DEPTH.set(self.cluster.admission.depth)
        if self.controller is not None:
            self.controller.tick(
                now,
                queue_depth=depth,
                poa_hat=est.poa_hat,
                poa_routing=est.poa_routing,
                poa_capacity=est.poa_capacity,
                arrival_rate=rate,
                backlog_since=self.drain.backlog_since,
                traffic=traffic,
            )
            detector = self.controller.detector
            regime, p99, smoothed = int(detector.regime), detector.last_p99, detector.smoothed_p99
            # As the service's controller tells its auction: the regime decides FCFS or auction.
            self.cluster.admission.set_regime(detector.regime.label)
        else:
            regime, p99, smoothed = 0, None, None
        policy = self.cluster.policy
        pools = self.cluster.pools
        self.timeline.append(
            TickSample(
                t=now,
                regime=regime,
                tau=policy.tau,
                omega=policy.omega,
                ttft_p99_window_s=p99,
                ttft_p99_smoothed_s=smoothed,
                poa_hat=est.poa_hat,
                poa_routing=est.poa_routing,
                poa_capacity=est.poa_capacity,
                queue_depth=depth,
                in_flight=self.cluster.in_flight,
                prefill_workers=pools.prefill,
                decode_workers=pools.decode,
                arrival_rate=rate,
            )
        )
        if self.on_tick is not None:
            self.on_tick(self.timeline[-1])
        if now + self.tick_s <= self.until:
            self.cluster.loop.after(self.tick_s, self._tick)
