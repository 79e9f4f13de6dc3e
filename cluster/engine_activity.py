"""What the engines said they held, as evidence for or against a TTFT (docs/design.md §5,
"Plausibility").

The ingress role publishes ``route`` and ``first_token``; a process holding its credentials can
publish a matched pair whose TTFT is whatever it likes, and the pair passes every check of
routes and times once the service has run longer than the TTFT. What it cannot publish is the
engines' own ``engine_load`` snapshots (the ``worker`` role's). Those say, for each worker, how
many requests its engine holds, on change and at least every third of their TTL
(``cluster.dataplane.engine_loads.EngineReporter``).

A request's TTFT is time spent queued or computing somewhere; the detector reads it as GPU
saturation. A long one while every engine of the deployment said it held nothing is not
evidence of saturation whatever produced it (a forger, a client that stalled, an auction that
was away), so :meth:`EngineActivity.idle_throughout` lets the consumer drop it
(``implausible_idle``). The rule needs positive evidence of idleness: at least
:data:`MIN_REPORTS` snapshots inside the TTFT's span and none saying a request was held, nor
the last one before the span. Where the engines do not report (the Dynamo backend's workers
publish no ``engine_load``) or the bus lost their reports, nothing is ruled out.

Bounded: :data:`MAX_REPORTS` snapshots per worker, older than ``horizon_s`` forgotten, at most
``max_workers`` workers (those of the deployment when it is known).
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Collection

from cluster.events import EngineLoadEvent

__all__ = ["CORROBORATE_ABOVE_S", "EngineActivity"]

# A TTFT shorter than this is never checked: a request that came and went within a couple of
# the engines' report periods (50 ms, heartbeat every 0.33 s) may leave no snapshot behind.
CORROBORATE_ABOVE_S = 2.0
MIN_REPORTS = 2
MAX_REPORTS = 4_096  # per worker: over 20 min of heartbeats, or 200 s of changes every 50 ms
HORIZON_S = 600.0  # no TTFT the detector uses is longer; older snapshots are forgotten
MAX_WORKERS = 1_024


class EngineActivity:
    """Each worker's recent ``(t, requests)`` snapshots (module docstring)."""

    def __init__(
        self, workers: Collection[int] | None = None, *, horizon_s: float = HORIZON_S,
        max_reports: int = MAX_REPORTS, max_workers: int = MAX_WORKERS,
    ) -> None:  # fmt: skip
        self.workers = None if workers is None else frozenset(workers)
        self.horizon_s, self.max_reports, self.max_workers = horizon_s, max_reports, max_workers
        self._times: dict[int, collections.deque[float]] = {}
        self._held: dict[int, collections.deque[int]] = {}

    def observe(self, event: EngineLoadEvent) -> bool:
        """Remember one snapshot; False (ignored) for a worker outside the deployment, one out
        of order, or a new worker past ``max_workers``."""
        worker = event.worker_id
        if self.workers is not None and worker not in self.workers:
            return False
        times = self._times.get(worker)
        if times is None:
            if len(self._times) >= self.max_workers:
                return False
            times = self._times[worker] = collections.deque()
            self._held[worker] = collections.deque()
        held = self._held[worker]
        if times and event.t < times[-1]:
            return False  # the publisher keeps its order; an older snapshot adds nothing
        times.append(event.t)
        held.append(event.requests)
        while len(times) > self.max_reports or times[0] < event.t - self.horizon_s:
            times.popleft()
            held.popleft()
        return True

    def idle_throughout(self, start: float, end: float) -> bool:
        """Whether the engines' snapshots show every worker idle over ``[start, end]``: at
        least :data:`MIN_REPORTS` inside it, and none inside it or carried into it (the last
        before ``start``) with a request held."""
        seen = 0
        for worker, times in self._times.items():
            held = self._held[worker]
            first = bisect.bisect_left(times, start)
            last = bisect.bisect_right(times, end)
            if first > 0 and held[first - 1] > 0:
                return False  # it held a request when the span began
            for i in range(first, last):
                if held[i] > 0:
                    return False
            seen += last - first
        return seen >= MIN_REPORTS

    def __len__(self) -> int:
        return sum(len(t) for t in self._times.values())
