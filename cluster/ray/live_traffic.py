"""The window's traffic as the controller actor reads it from the bus (``controller.traffic``;
docs/design.md §4 "A re-split plans from the traffic").

The simulator reads its requests and queues directly; the live controller has the events:

- λ: ``route`` events (``controller_pools.ArrivalMeter``: the demand, not the prefill pool's
  throughput);
- the shape: ``complete`` events of the last ``window_s`` (prompt, cached and output tokens of
  what finished; a completion is the first moment all three are known);
- the prefill queue: the latest ``engine_load`` of each prefill worker, while its ``ttl_s``
  holds (prompt tokens the engine runs or queues, what its own scheduler sees).

Sizes are bounded: at most ``MAX_COMPLETES`` completions in the window (the oldest go first)
and one snapshot per worker.
"""

from __future__ import annotations

from collections import deque

from cluster.events import CompleteEvent, EngineLoadEvent
from controller.traffic import Traffic, TrafficShape

__all__ = ["LiveTraffic"]

MAX_COMPLETES = 65_536  # a window of 30 s at 2,000 req/s


class LiveTraffic:
    """Completions and prefill engines' loads, folded into one ``Traffic`` per tick."""

    def __init__(self, window_s: float = 30.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._done: deque[tuple[float, int, int, int]] = deque(maxlen=MAX_COMPLETES)
        self._prefill: dict[int, tuple[float, int]] = {}  # worker → (valid until, tokens)

    def complete(self, now: float, event: CompleteEvent) -> None:
        self._done.append((now, event.prompt_tokens, event.cached_tokens, event.output_tokens))

    def engine_load(self, now: float, event: EngineLoadEvent) -> None:
        if event.role == "prefill":
            self._prefill[event.worker_id] = (now + event.ttl_s, event.prefill_tokens)
        else:  # a worker that turned decode (a re-split) queues no prefill
            self._prefill.pop(event.worker_id, None)

    def reading(self, now: float, arrival_rate: float) -> Traffic:
        """This tick's traffic at the measured ``arrival_rate``."""
        while self._done and self._done[0][0] <= now - self.window_s:
            self._done.popleft()
        self._prefill = {w: v for w, v in self._prefill.items() if v[0] > now}
        shape = None
        if self._done:
            n = len(self._done)
            prompt = sum(d[1] for d in self._done)
            cached = sum(d[2] for d in self._done)
            output = sum(d[3] for d in self._done)
            reuse = cached / prompt if prompt else 0.0
            shape = TrafficShape(max(1.0, prompt / n), max(1.0, output / n), min(1.0, reuse))
        queued = float(sum(tokens for _, tokens in self._prefill.values()))
        return Traffic(arrival_rate, shape, queued)
