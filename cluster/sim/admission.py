"""The admission stage in front of the workers: FCFS pass-through, or auctioned batches.

``FcfsAdmission`` releases requests in arrival order as soon as the cluster's backlog (requests
routed but not started by any worker) is below ``max_backlog`` (unbounded by default: today's
engines). ``AuctionAdmission`` holds the queue, auctions it in batches of up to n (arrival
order) and releases each batch in auction order as the workers' backlog drains; for ``dfs-bid``
each request carries its user's VCG payment share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING

from auction import Request, get_scheduler, run_auction
from controller import metrics

if TYPE_CHECKING:
    from cluster.sim.cluster import SimCluster, SimRequest


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
    def __init__(self, max_backlog: int | None = None) -> None:
        if max_backlog is not None and max_backlog < 1:
            raise ValueError(f"max_backlog must be >= 1, got {max_backlog}")
        self.max_backlog = max_backlog
        self.waiting: deque[SimRequest] = deque()

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def enqueue(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def on_progress(self, now: float) -> None:
        limit = self.max_backlog
        while self.waiting and (limit is None or self.cluster.backlog < limit):
            self.cluster.release(self.waiting.popleft())


class AuctionAdmission(Admission):
    """Auctioned batches of up to ``batch_size``, released in auction order.

    When the current batch is used up and requests wait, the next ``batch_size`` of them (arrival
    order) are ordered by ``scheduler``; its requests then leave one at a time whenever fewer than
    ``max_backlog`` routed requests wait at the workers, so the order of the batch is the order in
    which the workers see it. Below saturation nothing waits and a batch is a single request:
    FCFS pass-through.
    """

    def __init__(self, batch_size: int, scheduler: str = "dfs-bid", max_backlog: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_backlog < 1:
            raise ValueError(f"max_backlog must be >= 1, got {max_backlog}")
        get_scheduler(scheduler)  # an unknown name fails here, not mid-run
        self.batch_size = batch_size
        self.scheduler = scheduler
        self.max_backlog = max_backlog
        self.waiting: deque[SimRequest] = deque()
        self.ordered: deque[tuple[SimRequest, int, float]] = deque()
        self.batches = 0
        self.revenue = 0.0
        self._arrivals = 0

    @property
    def depth(self) -> int:
        return len(self.waiting) + len(self.ordered)

    def enqueue(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def on_progress(self, now: float) -> None:
        while self.cluster.backlog < self.max_backlog:
            if not self.ordered:
                if not self.waiting:
                    return
                self._auction_next_batch()
            request, batch_id, payment = self.ordered.popleft()
            self.cluster.release(request, batch_id=batch_id, payment=payment)

    def _auction_next_batch(self) -> None:
        take = [self.waiting.popleft() for _ in range(min(self.batch_size, len(self.waiting)))]
        batch = [
            Request(r.request_id, r.user, r.tokens, r.bid, arrival=self._arrivals + k)
            for k, r in enumerate(take)
        ]
        self._arrivals += len(take)
        result = run_auction(batch, self.scheduler)
        by_id = {r.request_id: r for r in take}
        owned: dict[str, int] = {}
        for r in take:
            owned[r.user] = owned.get(r.user, 0) + 1
        batch_id = self.batches
        self.batches += 1
        self.revenue += result.revenue
        metrics.AUCTION_WELFARE.set(result.welfare)
        metrics.AUCTION_REVENUE.inc(result.revenue)
        for rid in result.order:
            r = by_id[rid]
            # A user's payment is split evenly over its requests in the batch, for per-request
            # accounting; the user's total is exactly its VCG payment.
            self.ordered.append((r, batch_id, result.payments.get(r.user, 0.0) / owned[r.user]))
