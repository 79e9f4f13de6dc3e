"""The controller's view of who waits: routed requests still without a first token, and those
still in flight (``controller.drain`` in serve mode, docs/design.md §4 "Recency").

The controller reads the ``route`` and ``first_token`` events anyway (the arrival rate, the
TTFTs), and ``complete`` for this. A route opens a request, stamped on the controller's own clock
when it arrives (the ingress replicas may run on other hosts, whose clocks can differ by
seconds); its first token closes its wait, and its ``complete`` event ends it (and its wait, if
it ended without a first token). ``oldest_wait_s`` is how long the longest-waiting open request
has waited since its routing, the service's counterpart of ``SimCluster.start_wait``; ``idle``
says nothing is in flight.

A request whose end never comes (a lost event) must not hold either reading up for good: one
older than ``horizon_s`` is forgotten. The horizon is twice the estimator's window age (60 s): a
saturated 70B 1P/5D shows TTFTs near 10 s and answers of a few seconds more, so nothing real is
that old. At most ``max_open`` requests are held, the oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict

from cluster.actor_bus import BATCH_PERIOD_S
from games.poa import MAX_AGE_S

__all__ = ["EVENT_SLACK_S", "PendingRoutes"]

HORIZON_S = 2 * MAX_AGE_S
MAX_OPEN = 100_000
# A route and its first token each wait up to one event batch at their publisher: a wait read
# here can be that much longer than the request's own.
EVENT_SLACK_S = 2 * BATCH_PERIOD_S


class PendingRoutes:
    """Routed requests without a first token, and in flight, by arrival here (module doc)."""

    def __init__(self, horizon_s: float = HORIZON_S, max_open: int = MAX_OPEN) -> None:
        if not horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {horizon_s!r}")
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be an integer >= 1, got {max_open!r}")
        self.horizon_s = horizon_s
        self.max_open = max_open
        self.forgotten = 0  # past the horizon or beyond max_open
        self._waiting: OrderedDict[str, float] = OrderedDict()  # request id → routed (here)
        self._flying: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        """Requests waiting for a first token."""
        return len(self._waiting)

    def routed(self, request_id: str, now: float) -> None:
        for book in (self._waiting, self._flying):
            book[request_id] = now
            book.move_to_end(request_id)
            while len(book) > self.max_open:
                book.popitem(last=False)
                self.forgotten += 1

    def answered(self, request_id: str) -> None:
        """Its first token came."""
        self._waiting.pop(request_id, None)

    def ended(self, request_id: str) -> None:
        """It completed, or failed (with or without a first token)."""
        self._waiting.pop(request_id, None)
        self._flying.pop(request_id, None)

    def oldest_wait_s(self, now: float) -> float:
        """How long the longest-waiting open request has waited (0 when none waits)."""
        oldest = self._expire(self._waiting, now)
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def idle(self, now: float) -> bool:
        """Nothing in flight."""
        return self._expire(self._flying, now) is None

    def _expire(self, book: OrderedDict[str, float], now: float) -> float | None:
        """The oldest entry's time, after forgetting those past the horizon."""
        while book:
            request_id, since = next(iter(book.items()))
            if now - since <= self.horizon_s:
                return since
            del book[request_id]
            self.forgotten += 1
        return None
