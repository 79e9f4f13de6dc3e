"""The window's traffic, and how long the overload it causes will last (docs/design.md §4 "A
re-split plans from the traffic").

The detector sees an overload only once TTFT has risen; the traffic that causes it is visible
as soon as it arrives. One control tick's reading is a :class:`Traffic`: the arrival rate λ
(requests/s), the mean prompt I and output O (tokens), the measured cache reuse h (the share of
prompt tokens a cache served, so a prefill computes I' = I·(1 − h)) and the prefill pool's queue
Q (prompt tokens still to compute). The pool's service rate μ (tokens/s) comes from Game 1's cost
model at this shape (``SplitPlanner.prefill_rate``).

The queue's growth over the last ``window_s`` (arrivals against the pool's service, measured),

    g = (Q(t) − Q(t − window_s)) / window_s     (tokens/s),

is read from the queue itself rather than from λ·I' − μ: with prompts of spread lengths the
attention term makes the mean prompt's μ an overestimate (Jensen: E[I'²] > E[I']²), and a model
that thinks the pool keeps up while its queue grows would never move. An overload begins at a
tick where the queue grows (g > 0) or its backlog alone, Q/μ, keeps the pool busy for longer
than ``busy_s`` (a switch), and ends when the queue has cleared: Q/μ ≤ ``CLEAR_S``, the second
of work a pool in service always holds (a queue that shrinks for a while is still the overload's
backlog). :class:`QueueWatch` dates it: it has lasted A = now − the tick it began. The time it
still lasts, R, is at least the backlog's drain time Q/μ (even if no request arrived from now on
the pool is busy that long) and, by the resplitter's median rule (an overload seen for A seconds
is as likely to end before another A as after), A:

    R = max(A, Q/μ).

The demand a split must carry over that time is the arrivals plus the backlog cleared within
it (``Traffic.demand_rate``):

    λ_eff = λ + Q / (I'·max(R, W)),

W the switch: a backlog is work the cluster owes on top of the arrivals, and a split that only
matches λ would carry it forever. Game 1 reads it in its own requests: over a window in which
the queue never emptied the pool served μ̂ = λ·I' − g tokens/s, and where μ̂ < μ each request
costs the pool μ/μ̂ of the model's mean request (``QueueWatch.cost_ratio``: longer prompts than
the mean, chunking, a cache hit that did not happen), so the demand is λ_eff·μ/μ̂.

Both come from the traffic, not from TTFT: a queue of a few 12k-token prompts is visible
10–15 s before the detector's smoothed P99 crosses θ2.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = ["CLEAR_S", "QueueWatch", "Traffic", "TrafficShape"]

CLEAR_S = 1.0  # a cleared queue: at most a second of the pool's work (module docstring)


def _finite(name: str, value: float, low: float = 0.0, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name} must be finite and in [{low:g}, {high:g}], got {value!r}")


@dataclass(frozen=True)
class TrafficShape:
    """Mean prompt and output tokens of the window's requests and the share of prompt tokens
    a cache served (``reuse``): what a request costs the pools."""

    prompt_tokens: float
    output_tokens: float
    reuse: float = 0.0

    def __post_init__(self) -> None:
        _finite("prompt_tokens", self.prompt_tokens, 1.0)
        _finite("output_tokens", self.output_tokens, 1.0)
        _finite("reuse", self.reuse, 0.0, 1.0)

    @property
    def new_tokens(self) -> float:
        """Prompt tokens a prefill computes per request: I·(1 − h), at least one."""
        return max(1.0, self.prompt_tokens * (1.0 - self.reuse))


@dataclass(frozen=True)
class Traffic:
    """One tick's traffic (module docstring): λ, the shape (None when the window held no
    request to measure it from) and the prefill pool's queued prompt tokens."""

    arrival_rate: float
    shape: TrafficShape | None = None
    queued_prefill_tokens: float = 0.0

    def __post_init__(self) -> None:
        _finite("arrival_rate", self.arrival_rate)
        _finite("queued_prefill_tokens", self.queued_prefill_tokens)

    def demand_rate(self, horizon_s: float) -> float:
        """λ_eff = λ + Q/(I'·horizon): the arrivals and the backlog cleared within
        ``horizon_s``."""
        if self.shape is None or self.queued_prefill_tokens <= 0 or horizon_s <= 0:
            return self.arrival_rate
        return self.arrival_rate + self.queued_prefill_tokens / (self.shape.new_tokens * horizon_s)


class QueueWatch:
    """The queue's growth and the overload's age (module docstring), one tick at a time."""

    def __init__(self, window_s: float = 30.0) -> None:
        _finite("window_s", window_s, 1e-9)
        self.window_s = window_s
        self._readings: deque[tuple[float, float]] = deque()
        self.growth_tps = 0.0  # g
        self.served_tps: float | None = None  # μ̂, over a window the queue never emptied
        self.overloaded_since: float | None = None
        self.overloaded = False

    def update(self, now: float, traffic: Traffic, service_tps: float, busy_s: float) -> bool:
        """Whether this tick's traffic overloads the pool that serves ``service_tps``."""
        queued = traffic.queued_prefill_tokens
        readings = self._readings
        readings.append((now, queued))
        while len(readings) > 2 and readings[1][0] <= now - self.window_s:
            readings.popleft()  # keep one reading at least window_s old
        then, before = readings[0]
        self.growth_tps = (queued - before) / (now - then) if now > then else 0.0
        busy = all(q > 0 for _, q in readings)
        self.served_tps = (
            traffic.arrival_rate * traffic.shape.new_tokens - self.growth_tps
            if busy and traffic.shape is not None and now > then
            else None
        )
        backlog_s = queued / service_tps if service_tps > 0 else math.inf
        if queued <= 0 or backlog_s <= CLEAR_S:
            self.overloaded_since = None
        elif self.overloaded_since is None and (self.growth_tps > 0 or backlog_s > busy_s):
            self.overloaded_since = now
        self.overloaded = self.overloaded_since is not None
        return self.overloaded

    def cost_ratio(self, service_tps: float) -> float:
        """μ/μ̂ ≥ 1: how much more a request costs the pool than the model says (1 unless the
        queue stayed busy through the window and served less than μ)."""
        served = self.served_tps
        if served is None or service_tps <= 0:
            return 1.0
        return service_tps / served if 0 < served < service_tps else 1.0

    def remaining_s(self, now: float, queued_tokens: float, service_tps: float) -> float:
        """R = max(A, Q/μ): how long the overload under way will likely still last (0 when
        there is none)."""
        if self.overloaded_since is None:
            return 0.0
        backlog = queued_tokens / service_tps if service_tps > 0 else math.inf
        return max(now - self.overloaded_since, backlog)
