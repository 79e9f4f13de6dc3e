"""The end of a backlog: when a queue that lasted has emptied (docs/design.md §4 "Recency").

Each tick the caller says whether the backlog is *drained* (``TickWaits.reading``): nothing
queues in front of routing, no routed request has waited, and no first token that came during
the tick took, as long as the detector's down-threshold (``calm_limit_s``), and there is
evidence: a first token came, or nothing is in flight at all. A reading of the moment alone
does not do: a closed loop's clients can all be decoding at once, nobody waiting, and then send
their next requests together into one long prefill iteration. The simulator's control loop
reads its admission queue and how long routed requests have waited to start
(``SimCluster.start_wait``); the service reads the auction's queue and how long routed requests
have waited for their first tokens (``cluster.ray.pending_routes``). None is a tick without the
signal; it changes nothing.

A *backlog* is at least ``episode_ticks`` consecutive ticks not drained (a queue that lasted,
not one iteration's arrivals). It ends with ``drain_ticks`` consecutive drained ticks; ``update``
then returns a ``Drain`` whose ``since`` is the first of them. Everything measured on requests
that arrived before ``since`` (TTFT samples, the PoA window) describes a queue that no longer
exists: the detector drops those samples (``SaturationDetector.relax``) and the estimator those
requests (``PoaEstimator.forget_before``), so a calm phase reads calm within ``drain_ticks``
ticks of the backlog draining, not once a 10 s P99 window, the smoothing and a dwell (or a 30 s
PoA window) have forgotten it. Two ticks rather than one: the auction cuts its queue in batches,
and a queue that is empty at one tick may be a batch just released into a saturated cluster.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from controller.detector import HYSTERESIS, Thresholds

__all__ = ["Drain", "DrainWatch", "TickWaits", "calm_limit_s"]

MAX_DRAINS = 64  # drains a long-running controller remembers


def calm_limit_s(thresholds: Thresholds, hysteresis: float = HYSTERESIS) -> float:
    """The longest TTFT a drained cluster shows: the detector's down-threshold (1 − h)·θ1. A
    request that has waited longer keeps the detector from reading ``below``."""
    return (1.0 - hysteresis) * thresholds.theta1


class TickWaits:
    """One tick's evidence for ``DrainWatch`` (module docstring, "drained")."""

    def __init__(self) -> None:
        self.answered_n = 0
        self.longest_s = 0.0

    def answered(self, ttft_s: float) -> None:
        """A first token came during this tick, ``ttft_s`` after its request arrived."""
        self.answered_n += 1
        self.longest_s = max(self.longest_s, ttft_s)

    def reading(self, *, queued: bool, waiting_s: float, idle: bool, limit_s: float) -> bool:
        """Drained this tick (module docstring); starts the next tick's figures."""
        answered, longest = self.answered_n, self.longest_s
        self.answered_n, self.longest_s = 0, 0.0
        if queued or (answered == 0 and not idle):
            return False
        return max(waiting_s, longest) < limit_s


@dataclass(frozen=True)
class Drain:
    """A backlog ended: drained at ``since``, confirmed at ``t``, after ``backlog_s`` of queue."""

    t: float
    since: float
    backlog_s: float


class DrainWatch:
    """Backlogs and their ends from a per-tick ``drained`` signal (module docstring)."""

    def __init__(self, episode_ticks: int = 3, drain_ticks: int = 2) -> None:
        for name, count in (("episode_ticks", episode_ticks), ("drain_ticks", drain_ticks)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {count!r}")
        self.episode_ticks = episode_ticks
        self.drain_ticks = drain_ticks
        self.drains: deque[Drain] = deque(maxlen=MAX_DRAINS)  # the latest, for snapshots
        self._queued = 0  # consecutive ticks not drained
        self._queued_from = 0.0  # the first of them
        self._backlog_from: float | None = None  # start of a backlog that lasted
        self._drained_from: float | None = None  # first drained tick after it
        self._drained = 0

    @property
    def backlogged(self) -> bool:
        """A backlog has lasted ``episode_ticks`` and has not drained yet."""
        return self._backlog_from is not None

    @property
    def backlog_since(self) -> float | None:
        """When the backlog under way began (its first tick not drained); None without one."""
        return self._backlog_from

    def update(self, now: float, drained: bool | None) -> Drain | None:
        """One tick's reading; the ``Drain`` that ends a backlog, else None."""
        if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
            raise ValueError(f"now must be a finite number, got {now!r}")
        if drained is None:
            return None
        if not isinstance(drained, bool):
            raise ValueError(f"drained must be a bool or None, got {drained!r}")
        if not drained:
            if self._queued == 0:
                self._queued_from = float(now)
            self._queued += 1
            self._drained, self._drained_from = 0, None
            if self._queued == self.episode_ticks and self._backlog_from is None:
                self._backlog_from = self._queued_from
            return None
        self._queued = 0
        if self._backlog_from is None:
            return None
        if self._drained_from is None:
            self._drained_from = float(now)
        self._drained += 1
        if self._drained < self.drain_ticks:
            return None
        since = self._drained_from
        drain = Drain(float(now), since, since - self._backlog_from)
        self.drains.append(drain)
        self._backlog_from, self._drained_from, self._drained = None, None, 0
        return drain
