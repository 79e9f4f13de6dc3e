"""Load generators: a closed loop at concurrency C with ramp and hold phases, and open-loop
Poisson arrivals with a piecewise-constant rate schedule (spikes).

Both draw requests from a ``RequestSource`` (a callable returning the next ``SimRequest``), so
any workload can drive them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cluster.sim.cluster import SimCluster, SimRequest
from cluster.sim.records import RequestRecord

RequestSource = Callable[[], SimRequest]


@dataclass(frozen=True)
class Phase:
    """Hold ``concurrency`` clients for ``duration`` s, reaching it linearly over ``ramp`` s."""

    duration: float
    concurrency: int
    ramp: float = 0.0

    def __post_init__(self) -> None:
        if self.duration <= 0 or self.concurrency < 0 or self.ramp < 0:
            raise ValueError(f"bad phase {self}: duration > 0, concurrency >= 0, ramp >= 0")
        if self.ramp > self.duration:
            raise ValueError(f"bad phase {self}: ramp longer than the phase")


class ClosedLoop:
    """Clients that each send a request, wait for it to finish and send the next (no think time).

    When the target concurrency drops, clients retire as their request finishes.
    """

    def __init__(self, cluster: SimCluster, source: RequestSource, phases: Sequence[Phase]) -> None:
        if not phases:
            raise ValueError("a closed loop needs at least one phase")
        self.cluster = cluster
        self.source = source
        self.phases = list(phases)
        self.active = 0
        self.target = 0
        self._ramp_from = 0
        self._owner: set[str] = set()
        cluster.completion_listeners.append(self._finished)
        t = cluster.now
        for phase in self.phases:
            self._schedule_phase(t, phase)
            t += phase.duration
        self.end = t

    def _schedule_phase(self, t0: float, phase: Phase) -> None:
        loop = self.cluster.loop
        loop.at(t0, self._begin_phase)
        steps = max(1, round(phase.ramp * 10))  # ramps move in 0.1 s steps
        for k in range(1, steps + 1):
            loop.at(t0 + phase.ramp * k / steps, self._retarget, phase.concurrency, k / steps)

    def _begin_phase(self) -> None:
        self._ramp_from = self.target

    def _retarget(self, goal: int, fraction: float) -> None:
        self.target = round(self._ramp_from + (goal - self._ramp_from) * fraction)
        while self.active < self.target:
            self._send()

    def _send(self) -> None:
        request = self.source()
        self.active += 1
        self._owner.add(request.request_id)
        self.cluster.submit(request)

    def _finished(self, record: RequestRecord) -> None:
        if record.request_id not in self._owner:
            return
        self._owner.discard(record.request_id)
        self.active -= 1
        if self.cluster.now < self.end:
            while self.active < self.target:
                self._send()


class OpenLoop:
    """Poisson arrivals; ``schedule`` is [(start time, rate req/s), ...], piecewise constant."""

    def __init__(
        self,
        cluster: SimCluster,
        source: RequestSource,
        schedule: Sequence[tuple[float, float]],
        end: float,
        seed: int = 0,
    ) -> None:
        if not schedule or any(rate < 0 for _, rate in schedule):
            raise ValueError("an open loop needs a schedule of non-negative rates")
        self.cluster = cluster
        self.source = source
        self.schedule = sorted(schedule)
        self.end = end
        self._rng = np.random.default_rng(seed)
        self._next_arrival(cluster.now)

    def rate_at(self, t: float) -> float:
        rate = 0.0
        for start, r in self.schedule:
            if t >= start:
                rate = r
        return rate

    def _next_arrival(self, t: float) -> None:
        # Thinning against the peak rate keeps arrivals exact across rate changes.
        peak = max(r for _, r in self.schedule)
        if peak <= 0:
            return
        while True:
            t += self._rng.exponential(1.0 / peak)
            if t >= self.end:
                return
            if self._rng.random() * peak <= self.rate_at(t):
                self.cluster.loop.at(t, self._arrive)
                return

    def _arrive(self) -> None:
        self.cluster.submit(self.source())
        self._next_arrival(self.cluster.now)
