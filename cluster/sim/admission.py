"""The admission stage in front of the workers: FCFS pass-through, or auctioned batches.

Both stages release a request to the router only while the cluster's backlog (requests routed
but not yet started by any worker) is below ``release_while_backlog_below``:

- ``None`` releases everything at once: the workers' own queues hold the requests, in the order
  admission released them (``FcfsAdmission``'s default: today's engines).
- ``1`` (``AuctionAdmission``'s default) releases a request only when no routed request waits
  unstarted, so the workers start requests exactly in auction order and the queue (not the
  workers) holds everything that waits: a later arrival with a higher bid can still be auctioned
  ahead of every request that has not left the queue. It also admits at most one new request
  per worker iteration (each start frees the slot for the next release), which a saturated
  queue pays for in TTFT.
- k > 1 keeps up to k routed requests waiting at the workers: they can start several per
  iteration, and the queue keeps the rest.

For a queue that is all there at once (``cluster.sim.auction_queue``) ``None`` is the engine's
behaviour: a batch's order is handed to the worker, which starts its requests in that order as
memory frees.

``AuctionAdmission`` holds the queue, auctions it in batches of up to n (paying requests first,
then arrival order: ``auction.priority.batch_members``, as the service cuts its batches) and
releases each batch in auction order; for ``dfs-bid`` each request carries its user's VCG payment
share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from auction import Request, get_scheduler, run_auction
from auction.priority import take_batch
from telemetry import metrics

if TYPE_CHECKING:
    from cluster.sim.cluster import SimCluster, SimRequest

DEFAULT_AUCTION_RELEASE_WHILE_BACKLOG_BELOW = 1


def backlog_limit(value: int | None) -> int | None:
    """``release_while_backlog_below``, checked: an integer >= 1, or None (no limit)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            "release_while_backlog_below must be an integer >= 1 (or None: no limit), "
            f"got {value!r}"
        )
    return value


def batch_seed(seed: int, batch: int) -> int:
    """A batch's own seed for the neutral ties of the bid-blind schedulers, from (seed, batch):
    no two batches of a run share a tie order, and a run replays from its seed."""
    return int(np.random.SeedSequence([seed, batch]).generate_state(1)[0])


class Admission(ABC):
    def attach(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    @abstractmethod
    def enqueue(self, request: SimRequest) -> None:
        """A request joins the queue; ``on_progress`` decides when it leaves."""

    @abstractmethod
    def on_progress(self, now: float) -> None:
        """Release what may leave now (called on arrivals and whenever workers make progress)."""

    @property
    @abstractmethod
    def depth(self) -> int:
        """Requests waiting in the admission queue."""


class FcfsAdmission(Admission):
    """Arrival order; ``release_while_backlog_below`` (default ``None``: no limit) as above."""

    def __init__(self, release_while_backlog_below: int | None = None) -> None:
        self.release_while_backlog_below = backlog_limit(release_while_backlog_below)
        self.waiting: deque[SimRequest] = deque()

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def enqueue(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def on_progress(self, now: float) -> None:
        limit = self.release_while_backlog_below
        while self.waiting and (limit is None or self.cluster.backlog < limit):
            self.cluster.release(self.waiting.popleft())


class AuctionAdmission(Admission):
    """Auctioned batches of up to ``batch_size``, released in auction order.

    When the current batch is used up and requests wait, the next ``batch_size`` of them (paying
    ones first, then by arrival: ``batch_members``) are ordered by ``scheduler``; its requests
    then leave one at a time while the backlog is below ``release_while_backlog_below`` (default
    1: the workers start the batch in auction order, one new request per iteration; ``None``:
    the whole batch at once). Below saturation
    nothing waits and a batch is a single request: FCFS pass-through. Batch k of the bid-blind
    schedulers draws its neutral ties from ``batch_seed(seed, k)``.

    ``batch_window_s`` (default 0: a batch forms as soon as one may) is the service's
    ``batch_window_ms`` (``auction.AuctionSettings``): a batch forms once ``batch_size`` requests
    wait or the oldest has waited that long, so requests that arrive close together compete in
    one auction even when each could leave at once.

    ``planned`` lists the request ids in the order the auctions put them, batch after batch.
    """

    def __init__(
        self,
        batch_size: int,
        scheduler: str = "dfs-bid",
        release_while_backlog_below: int | None = DEFAULT_AUCTION_RELEASE_WHILE_BACKLOG_BELOW,
        *,
        seed: int = 0,
        batch_window_s: float = 0.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 <= batch_window_s <= 60.0:  # the service's bound on batch_window_ms
            raise ValueError(f"batch_window_s must be in [0, 60], got {batch_window_s!r}")
        self.batch_window_s = float(batch_window_s)
        self._arrived: deque[float] = deque()  # the waiting requests' arrival times
        self._wake_at: float | None = None
        get_scheduler(scheduler)  # an unknown name fails here, not mid-run
        self.release_while_backlog_below = backlog_limit(release_while_backlog_below)
        self.batch_size = batch_size
        self.scheduler = scheduler
        self.seed = seed
        self.waiting: deque[SimRequest] = deque()
        self.ordered: deque[tuple[SimRequest, int, float]] = deque()
        self.planned: list[str] = []
        self.batches = 0
        self.revenue = 0.0
        self._arrivals = 0

    @property
    def depth(self) -> int:
        return len(self.waiting) + len(self.ordered)

    def enqueue(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self._arrived.append(self.cluster.now)

    def on_progress(self, now: float) -> None:
        limit = self.release_while_backlog_below
        while limit is None or self.cluster.backlog < limit:
            if not self.ordered:
                if not self.waiting:
                    return
                due = self._arrived[0] + self.batch_window_s
                if len(self.waiting) < self.batch_size and now < due:
                    self._wake(due)
                    return
                self._auction_next_batch()
            request, batch_id, payment = self.ordered.popleft()
            self.cluster.release(request, batch_id=batch_id, payment=payment)

    def _wake(self, at: float) -> None:
        """Call ``on_progress`` when the oldest request's window ends (once per deadline)."""
        if self._wake_at is not None and self._wake_at <= at:
            return
        self._wake_at = at

        def wake() -> None:
            if self._wake_at == at:
                self._wake_at = None
                self.on_progress(self.cluster.now)

        self.cluster.loop.after(at - self.cluster.now, wake)

    def _auction_next_batch(self) -> None:
        taken, kept = take_batch(
            list(zip(self.waiting, self._arrived, strict=True)), lambda w: w[0].bid,
            self.batch_size,
        )  # fmt: skip
        take = [r for r, _ in taken]
        self.waiting = deque(r for r, _ in kept)
        self._arrived = deque(t for _, t in kept)
        batch = [
            Request(r.request_id, r.user, r.tokens, r.bid, arrival=self._arrivals + k)
            for k, r in enumerate(take)
        ]
        self._arrivals += len(take)
        batch_id = self.batches
        result = run_auction(batch, self.scheduler, seed=batch_seed(self.seed, batch_id))
        by_id = {r.request_id: r for r in take}
        owned: dict[str, int] = {}
        for r in take:
            owned[r.user] = owned.get(r.user, 0) + 1
        self.batches += 1
        self.revenue += result.revenue
        self.planned.extend(result.order)
        metrics.AUCTION_WELFARE.set(result.welfare)
        metrics.AUCTION_REVENUE.inc(result.revenue)
        for rid in result.order:
            r = by_id[rid]
            # A user's payment is split evenly over its requests in the batch, for per-request
            # accounting; the user's total is exactly its VCG payment.
            self.ordered.append((r, batch_id, result.payments.get(r.user, 0.0) / owned[r.user]))
