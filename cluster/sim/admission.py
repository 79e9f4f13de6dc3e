"""The admission stage in front of the simulated workers: the service's own queue, in virtual time.

``AuctionAdmission`` runs ``auction.AdmissionQueue``, the queue the live service's auction runs
(``cluster.ray.auction_actor``), fed by the simulator's events as the service feeds it by its
own: an arrival enqueues the request, its first token frees its prefill slot, and the
controller's regime (``set_regime``, when one runs) switches it between FCFS and auctions. The
simulator and the service therefore release by one rule and price by one rule
(``auction/admission.py``): at most ``max_in_prefill`` released requests without a first token;
arrival order while the regime is ``below`` and fewer than ``queue_threshold`` wait; otherwise
batches cut paying requests first and auctioned, each user's VCG price split over its requests
in proportion to their bids.

``FcfsAdmission`` is the stage's absence: every request is released on arrival and the engines'
own queues hold what waits, as engines without an auction in front do.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Protocol

from auction.admission import AdmissionQueue, AuctionSettings, derived_max_in_prefill
from cluster.sim.loop import EventLoop
from cluster.sim.records import RequestRecord
from cluster.sim.request import SimRequest
from cluster.sim.views import RouterViews
from telemetry import metrics


class AdmissionHost(Protocol):
    """What an admission stage sees of the simulated cluster it fronts (``SimCluster``)."""

    @property
    def now(self) -> float: ...

    loop: EventLoop
    views: RouterViews
    first_token_listeners: list[Callable[[RequestRecord], None]]

    def release(
        self, request: SimRequest, batch_id: int | None = None, payment: float = 0.0
    ) -> None: ...


class Admission(ABC):
    def attach(self, cluster: AdmissionHost) -> None:
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

    def set_regime(self, regime: str) -> None:  # noqa: B027  (a stage without modes ignores it)
        """The controller's regime label (``Regime.label``)."""


class FcfsAdmission(Admission):
    """No admission stage: each request is routed the moment it arrives."""

    def __init__(self) -> None:
        self.waiting: deque[SimRequest] = deque()

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def enqueue(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def on_progress(self, now: float) -> None:
        while self.waiting:
            self.cluster.release(self.waiting.popleft())


class AuctionAdmission(Admission):
    """``auction.AdmissionQueue`` under ``settings`` (the service's defaults unless given),
    driven by the simulator (module docstring). Batch k of the bid-blind schedulers draws its
    neutral ties from ``auction.batch_seed(seed, k)``.

    With ``slots_per_prefill_worker`` (``auction.prefill_slots_per_worker`` of the profile's
    batch, as the service derives it) ``max_in_prefill`` is that many per serving prefill
    worker, following re-splits (at least 1); without, ``settings.max_in_prefill`` holds.

    ``planned`` lists the request ids in the order the auctions put them, batch after batch;
    ``revenue`` sums the users' VCG prices; each record's ``batch_id`` is its batch's number.
    """

    def __init__(
        self,
        settings: AuctionSettings | None = None,
        *,
        seed: int = 0,
        slots_per_prefill_worker: int | None = None,
    ) -> None:
        if slots_per_prefill_worker is not None and (
            type(slots_per_prefill_worker) is not int or slots_per_prefill_worker < 1
        ):
            raise ValueError(
                f"slots_per_prefill_worker must be an int >= 1, got {slots_per_prefill_worker!r}"
            )
        self.per_worker = slots_per_prefill_worker
        self.queue = AdmissionQueue(settings or AuctionSettings(), seed=seed)
        self._requests: dict[str, SimRequest] = {}
        self._wake_at: float | None = None
        self._numbers: dict[str, int] = {}  # batch id -> its number (records carry the number)
        self.planned: list[str] = []
        self.revenue = 0.0

    def attach(self, cluster: AdmissionHost) -> None:
        super().attach(cluster)
        cluster.first_token_listeners.append(self._first_token)

    @property
    def depth(self) -> int:
        return self.queue.depth

    @property
    def batches(self) -> int:
        return self.queue.batches

    def enqueue(self, request: SimRequest) -> None:
        self.queue.enqueue(
            request.request_id, request.user, request.bid, request.tokens, self.cluster.now
        )
        self._requests[request.request_id] = request

    def set_regime(self, regime: str) -> None:
        if regime != self.queue.regime:
            self.queue.set_regime(regime)
            self.on_progress(self.cluster.now)

    @property
    def settings(self) -> AuctionSettings:
        return self.queue.settings

    def on_progress(self, now: float) -> None:
        self._follow_prefill_pool()
        releases = self.queue.releasable(now)
        for outcome in self.queue.pop_batches():
            self._numbers[outcome.batch_id] = outcome.number
            self.planned.extend(outcome.order)
            self.revenue += outcome.revenue
            metrics.AUCTION_WELFARE.set(outcome.welfare)
            metrics.AUCTION_REVENUE.inc(outcome.revenue)
        for release in releases:
            request = self._requests.pop(release.request_id)
            batch = None if release.batch_id is None else self._numbers[release.batch_id]
            self.cluster.release(request, batch_id=batch, payment=release.payment)
        deadline = self.queue.next_deadline()
        if deadline is not None:
            self._wake(deadline)

    def _follow_prefill_pool(self) -> None:
        if self.per_worker is None:
            return
        serving = len(self.cluster.views.workers("prefill"))
        bound = derived_max_in_prefill(self.per_worker, serving)
        if bound != self.queue.settings.max_in_prefill:
            self.queue.settings = dataclasses.replace(self.queue.settings, max_in_prefill=bound)

    def _first_token(self, record: RequestRecord) -> None:
        self.queue.slot_freed(record.request_id)

    def _wake(self, at: float) -> None:
        """Call ``on_progress`` when the oldest request's window ends (once per deadline)."""
        if self._wake_at is not None and self._wake_at <= at:
            return
        self._wake_at = at

        def wake() -> None:
            if self._wake_at == at:
                self._wake_at = None
                self.on_progress(self.cluster.now)

        self.cluster.loop.after(max(at - self.cluster.now, 0.0), wake)
