"""The controller's second lever: re-split the P/D pools when saturation is capacity, not routing
(docs/design.md §4 "Two levers, not one").

Routing (τ, ω) can only recover poa_routing. When the cluster is saturated and the estimator says
the loss is capacity — poa_capacity ≥ ``dominance``·poa_routing for ``dwell_ticks`` ticks in a
row — the resplitter asks Game 1 for the best split at the measured arrival rate λ and, if that
split has more prefill workers than the cluster has now, moves TP groups from decode to
prefill (as many at once as pay most, below). When load has fallen it moves one group back
toward the operator's split, the one the cluster started with (the split provisioned for calm
load; the controller only deviates from it under capacity saturation). "Load has fallen" is
read from demand, not from TTFT: the split one step back must carry the measured λ within the
SLOs with headroom,

    λ ≤ release_fraction · κ(P − 1, D + 1),    κ(P, D) = min(P·κ_P, D·κ_D)

(κ_P, κ_D: Game 1's per-worker SLO rates, ``games.pd_allocation.slo_capacity``; the load
λ/κ(P − 1, D + 1) read as the mean of the last ``release_ticks`` ticks' readings, each at its
window's traffic shape, plus twice their spread, so that a calm half-minute between busy ones is
not a fall), for ``release_ticks`` ticks in a row outside ``saturated``. TTFT alone cannot say
it: the re-split itself brings TTFT down, and a lever that gave capacity back whenever TTFT
looked calm would undo its own move while the load still needs it.

The traffic plans a move too (``controller.traffic``, docs/design.md §4 "A re-split plans from
the traffic"): with a reading of the window's traffic, a move up is also due after
``dwell_ticks`` ticks in which the prefill queue outruns the pool or the demand λ (in Game 1's
requests: times μ/μ̂, the model's service over the measured one) exceeds the split's SLO
capacity κ(P, D) at the window's shape, whatever the detector reads. Such ticks make one
overload *episode* while the traffic overloads the split it found, so the steps it asks for are
one decision; Game 1's split is asked at the demand plus the backlog owed
(``Traffic.demand_rate``), and R below is the longer of the episode's age and the backlog's
drain time.

A move up also has to pay for itself (``resplit_payoff``). The moving worker serves in neither
pool for the switch, W seconds on the controller's clock (``PoolTarget.switch_s``: drain and
warm-up; wall seconds in serve mode, so the profile's role switch divided by the speed-up). With
κ the SLO capacity and λ the demand, the cluster serves min(λ, κ(P, D)) now, min(λ, κ(P, D − 1))
during the switch and min(λ, κ(P + 1, D − 1)) after it, so

    gain = min(λ, κ(P + 1, D − 1)) − min(λ, κ(P, D))     per second once the worker serves,
    loss = min(λ, κ(P, D)) − min(λ, κ(P, D − 1))         per second while it moves,
    benefit = gain · max(0, R − W),   cost = loss · W,    start only if benefit > cost,

R being the overload's likely remaining time. k workers moved at once switch side by side (each
TP group loads its own weights), so the same rule with P + k, D − k weighs a step of k against
one switch; the step taken is the k, up to Game 1's split, the decode pool's ``min_decode`` and
what the target moves at once (``PoolTarget.max_step``), of most benefit − cost. In a
prefill-bound overload every step toward the split gains and none loses: one switch for all of
it, not k switches in a row while the queue grows. Nothing says when an overload ends, so R is the
time it has lasted, A: since the backlog under way began (``controller.drain``), or since the
regime turned saturated if that is earlier; the detector confirms an overload some 10–15 s after
its queue forms (window, smoothing, dwell). An overload seen for A seconds is as
likely to end before another A as after (the median of a scale-free duration), so A is the
median remaining time. In a prefill-bound saturation the decode pool does not bind, loss = 0,
and the rule reads: move once the overload has lasted one switch; a spike shorter than the
switch (``make demo``'s, against 60 wall seconds at speed-up 0.5) no longer takes a decode worker
away for longer than it lasts.

A move up whose overload ends (the regime reads ``below``) while its worker still drains is
called off (``PoolTarget.cancel``): the worker serves its old role again at once. Once drained,
its old engine is gone, and going back would cost a whole switch where finishing costs what is
left of one, so a warm-up runs to its end. Either way the cluster holds one serving worker fewer
for at most the drain and one warm-up.

Never oscillating comes from three things:

- hysteresis: moving up needs *saturated* and capacity dominance; moving back needs demand a
  fifth (``release_fraction`` = 0.8) below what the smaller split carries, so the demand that
  justified a move up never justifies the move back;
- one move at a time (of one TP group, or of the several a move up takes at once), and none
  while the target reports a re-split in progress (drain and warm-up take tens of seconds on
  real hardware); a move back is always one group;
- a cool-down of ``cooldown_s`` after a re-split finishes before the next may start, so the
  estimator sees the new split's effect before the lever is pulled again (but for the next
  step up the same overload episode's traffic asks for: its evidence is read every tick).

The target does the work (a simulated cluster, or the serve runtime's worker actors): it drains
the moving worker, restarts it in its new role and reports progress. This module only decides.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from controller.detector import Regime
from controller.resplit_settings import RESPLIT_BOUNDS as RESPLIT_BOUNDS
from controller.resplit_settings import ResplitSettings as ResplitSettings
from controller.split import Payoff as Payoff
from controller.split import Pools as Pools
from controller.split import PoolTarget as PoolTarget
from controller.split import Role as Role
from controller.split import SplitPlanner as SplitPlanner
from controller.split import resplit_payoff as resplit_payoff
from controller.traffic import QueueWatch, Traffic, TrafficShape


@dataclass(frozen=True)
class ResplitDecision:
    """One re-split the resplitter started."""

    t: float
    to_role: Role
    before: Pools
    goal: Pools
    arrival_rate: float
    poa_routing: float | None
    poa_capacity: float | None
    reason: str
    workers: int = 1  # TP groups moved at once


@dataclass(frozen=True)
class ResplitCancel:
    """A move up called off while its worker drained: the overload it answered was over."""

    t: float
    to_role: Role
    reason: str


class Resplitter:
    """Decides re-splits of ``target``'s pools, one tick at a time (module docstring).

    ``planner`` answers Game 1's two questions: the best split at arrival rate λ, and the
    arrival rate a split carries within the SLOs; ``home`` is the split to return to when load
    falls (default: the target's pools at construction)."""

    def __init__(
        self,
        target: PoolTarget,
        planner: SplitPlanner,
        settings: ResplitSettings | None = None,
        *,
        home: Pools | None = None,
        on_decision: Callable[[ResplitDecision], None] | None = None,
    ) -> None:
        self.target = target
        self.planner = planner
        self.settings = settings or ResplitSettings()
        self.home = home if home is not None else target.pools()
        self.on_decision = on_decision
        self.decisions: list[ResplitDecision] = []
        self.cancels: list[ResplitCancel] = []
        self._moving_up = False  # the move under way answers an overload
        self._up_ticks = 0
        self._down_ticks = 0
        self._busy = False
        self._idle_since: float | None = None  # when the last re-split finished
        self._overload_since: float | None = None  # start of the regime's saturated stretch
        self.unpaid = 0  # ticks a move up was due but would not have paid for itself
        self.queue = QueueWatch()
        self._plan_ticks = 0
        # The overload episode under way: when it began, and the split it found.
        self._episode: tuple[float, Pools] | None = None
        self._episode_moves = 0  # moves up made in the episode under way
        # λ/κ(P − 1, D + 1) of the last ticks, each at its own window's shape
        self._loads: deque[float] = deque(maxlen=self.settings.release_ticks)

    def tick(
        self,
        now: float,
        regime: Regime,
        arrival_rate: float,
        poa_routing: float | None = None,
        poa_capacity: float | None = None,
        backlog_since: float | None = None,
        traffic: Traffic | None = None,
    ) -> ResplitDecision | None:
        """Update the counters with this tick's signals; start a re-split when they say so.
        ``backlog_since``: when the backlog under way began (``DrainWatch.backlog_since``);
        ``traffic``: the window's traffic, for the planned move (module docstring)."""
        if not (math.isfinite(arrival_rate) and arrival_rate >= 0):
            raise ValueError(f"arrival_rate must be finite and >= 0, got {arrival_rate!r}")
        s = self.settings
        shape = traffic.shape if traffic is not None else None
        if regime != Regime.SATURATED:
            self._overload_since = None
        elif self._overload_since is None:
            self._overload_since = now
        capacity_bound = (
            regime == Regime.SATURATED
            and poa_routing is not None
            and poa_capacity is not None
            and poa_capacity >= s.dominance * poa_routing
        )
        self._up_ticks = self._up_ticks + 1 if capacity_bound else 0
        pools = self.target.pools()
        overloaded, remaining, cost = self._read_queue(now, pools, traffic)
        # The SLO's reading of the same traffic: a split whose SLO capacity is below the demand
        # misses the SLO in steady state even while its queue clears between bursts.
        rate = cost * traffic.arrival_rate if traffic is not None else 0.0
        short = shape is not None and rate > self.planner.capacity(pools, shape)
        overloaded = overloaded or short
        remaining = max(remaining, self._episode_age(now, pools, overloaded, rate, shape))
        self._plan_ticks = self._plan_ticks + 1 if overloaded else 0
        smaller = Pools(pools.prefill - 1, pools.decode + 1)
        held = self.planner.capacity(smaller, shape)
        self._loads.append(cost * arrival_rate / held if held > 0 else math.inf)
        demand_fell = (
            regime != Regime.SATURATED
            and not overloaded
            and pools.prefill > max(self.home.prefill, s.min_prefill)
            and self._load_bound() <= s.release_fraction
        )
        self._down_ticks = self._down_ticks + 1 if demand_fell else 0
        busy = self.target.resplitting()
        if busy and self._moving_up and regime == Regime.BELOW and not overloaded:
            busy = not self._cancel(now)
        if self._busy and not busy:
            self._idle_since = now
            self._moving_up = False
        self._busy = busy
        planned = self._plan_ticks >= s.dwell_ticks
        cooling = self._idle_since is not None and now - self._idle_since < s.cooldown_s
        # The next step toward the split an episode's traffic asks for needs no cool-down: its
        # evidence is read every tick (the dwell on the new split), not a PoA window to refill.
        onward = planned and self._episode is not None and self._episode_moves > 0
        if busy or (cooling and not onward):
            return None
        if (self._up_ticks >= s.dwell_ticks or planned) and pools.decode > s.min_decode:
            starts = [t for t in (self._overload_since, backlog_since) if t is not None]
            lasted = now - min(starts) if self._overload_since is not None else 0.0
            lasted = max(lasted, remaining)
            switch = self.target.switch_s()
            demand = arrival_rate
            if traffic is not None:  # the backlog is owed too, in Game 1's requests
                demand = cost * max(demand, traffic.demand_rate(max(lasted, switch)))
            goal = self.planner.best_split(demand, shape)
            if goal.prefill > pools.prefill:
                payoff = self._best_step(pools, goal, demand, lasted, switch, shape)
                if not payoff.pays:  # due, but the switch would cost more than it returns
                    self.unpaid += 1
                else:
                    why = (
                        f"the traffic overloads {pools} for {self._plan_ticks} ticks (prefill "
                        f"queue {traffic.queued_prefill_tokens:.3g} tokens, or demand over its "
                        "SLO capacity)"
                        if planned and traffic is not None
                        else f"capacity-bound for {self._up_ticks} ticks: poa_capacity "
                        f"{poa_capacity:.3g} >= {s.dominance:g} x poa_routing {poa_routing:.3g}"
                    )
                    reason = (
                        f"{why}; Game 1 at {demand:.3g} req/s{_shown(shape)}: {goal}; "
                        f"{payoff.workers} worker(s) at once pay for their {payoff.switch_s:.3g}"
                        f" s switch, the overload likely lasting {lasted:.3g} s more (benefit "
                        f"{payoff.benefit:.3g} > cost {payoff.cost:.3g} request-s)"
                    )
                    return self._start(
                        now, "prefill", pools, goal, arrival_rate, reason, poa_routing,
                        poa_capacity, payoff.workers,
                    )  # fmt: skip
        if self._down_ticks >= s.release_ticks:
            reason = (
                f"demand {arrival_rate:.3g} req/s; its load on {smaller}'s SLO capacity "
                f"(mean + 2 s.d. over {len(self._loads)} ticks) {self._load_bound():.3g} <= "
                f"{s.release_fraction:g} for {self._down_ticks} ticks: back toward {self.home}"
            )
            return self._start(
                now, "decode", pools, self.home, arrival_rate, reason, poa_routing, poa_capacity
            )
        return None

    def _best_step(
        self,
        pools: Pools,
        goal: Pools,
        demand: float,
        lasted: float,
        switch: float,
        shape: TrafficShape | None,
    ) -> Payoff:
        """The move up that returns most (``resplit_payoff``'s benefit − cost): k workers at
        once, k up to what Game 1's split asks, what the decode pool can give (``min_decode``)
        and what the target moves at once; the fewest among equals. In a prefill-bound overload
        the decode pool does not bind, every step toward the goal gains and none loses: all
        of it at once, one switch instead of k in a row while the queue grows."""
        most = min(
            goal.prefill - pools.prefill,
            pools.decode - self.settings.min_decode,
            self.target.max_step(),
        )
        best = resplit_payoff(self.planner, pools, demand, lasted, switch, shape)
        for k in range(2, most + 1):
            payoff = resplit_payoff(self.planner, pools, demand, lasted, switch, shape, k)
            if payoff.net > best.net:
                best = payoff
        return best

    def _episode_age(
        self, now: float, pools: Pools, overloaded: bool, rate: float, shape: TrafficShape | None
    ) -> float:
        """A for the traffic's moves: how long the overload episode has lasted. It begins at
        the first overloaded tick and lasts while the traffic overloads the split it found
        (its demand above that split's SLO capacity) or the current one: a move that answered
        it changes the split, not the traffic, and the next move's evidence is the same
        episode's, not a new one that must last a switch again."""
        if self._episode is None:
            if not overloaded:
                return 0.0
            self._episode = (now, pools)
        since, found = self._episode
        if not overloaded and (shape is None or rate <= self.planner.capacity(found, shape)):
            self._episode, self._episode_moves = None, 0
            return 0.0
        return now - since

    def _load_bound(self) -> float:
        """The load a move back must fit: the mean of λ/κ(P − 1, D + 1) over the last
        ``release_ticks`` ticks (each at its window's shape) plus twice its standard deviation.
        A trace's arrival rate swings by a third between half-minute windows and its mean prompt
        as much (Mooncake's); a split that carries only the calm windows would be left at the
        next busy one, and the lever would pay a switch each way for nothing."""
        loads = self._loads
        mean = sum(loads) / len(loads)
        if not math.isfinite(mean):
            return math.inf
        spread = math.sqrt(sum((x - mean) ** 2 for x in loads) / len(loads))
        return mean + 2.0 * spread

    def _read_queue(
        self, now: float, pools: Pools, traffic: Traffic | None
    ) -> tuple[bool, float, float]:
        """(overloaded, R, μ/μ̂) from the prefill queue (``controller.traffic``); (False, 0, 1)
        with no traffic reading."""
        if traffic is None:
            return False, 0.0, 1.0
        service = self.planner.prefill_rate(pools, traffic.shape) if pools.prefilling else 0.0
        overloaded = self.queue.update(now, traffic, service, self.target.switch_s())
        remaining = self.queue.remaining_s(now, traffic.queued_prefill_tokens, service)
        return overloaded, remaining, self.queue.cost_ratio(service)

    def _cancel(self, now: float) -> bool:
        """The overload a move up answered is over before its worker drained: the worker
        would serve nothing new for the rest of the drain and a whole warm-up, for a split
        the load no longer needs; called off, it serves its old role again at once."""
        reason = "the overload ended while the worker drained: it serves its old role again"
        if not self.target.cancel(reason):
            return False
        self._moving_up = False
        self.cancels.append(ResplitCancel(now, "prefill", reason))
        return True

    def _start(
        self,
        now: float,
        to_role: Role,
        pools: Pools,
        goal: Pools,
        arrival_rate: float,
        reason: str,
        poa_routing: float | None,
        poa_capacity: float | None,
        workers: int = 1,
    ) -> ResplitDecision:
        decision = ResplitDecision(
            now, to_role, pools, goal, arrival_rate, poa_routing, poa_capacity, reason, workers
        )
        self.target.resplit(to_role, reason, workers)
        self.decisions.append(decision)
        self._busy = True
        self._moving_up = to_role == "prefill"
        up_in_episode = self._moving_up and self._episode is not None
        self._episode_moves = self._episode_moves + 1 if up_in_episode else 0
        self._up_ticks = self._down_ticks = self._plan_ticks = 0
        if self.on_decision is not None:
            self.on_decision(decision)
        return decision


def _shown(shape: TrafficShape | None) -> str:
    if shape is None:
        return ""
    return (
        f" (prompts {shape.prompt_tokens:.0f} tokens, {shape.reuse:.0%} cached, "
        f"outputs {shape.output_tokens:.0f})"
    )
