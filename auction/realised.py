"""Realised welfare of live auction batches (docs/design.md §1 "Realised welfare"), in serve mode.

A batch's planned welfare is known when it is auctioned; its realised welfare only when every
request in it has its first token: rank them by TTFT (``auction.welfare.realised_welfare``) and
apply the welfare formula. A request that ended without a first token (its client left, a worker
failed) had the worst service of its batch: it ranks last, tied with any other such request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from auction.welfare import realised_welfare

MAX_OPEN_BATCHES = 4096  # batches awaiting first tokens; the oldest is dropped past this


@dataclass(frozen=True)
class RealisedBatch:
    """A batch whose requests all have their outcome: ``welfare`` planned and realised."""

    number: int
    planned: float
    realised: float


@dataclass
class _Open:
    number: int
    planned: float
    bids: dict[str, float]
    arrived: dict[str, float]
    ttft: dict[str, float | None] = field(default_factory=dict)


class RealisedWelfare:
    """Batches waiting for their requests' first tokens; ``first_token`` / ``ended`` return the
    batch they complete, if any. Memory is bounded by ``max_open`` batches."""

    def __init__(self, max_open: int = MAX_OPEN_BATCHES) -> None:
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be an integer >= 1, got {max_open!r}")
        self.max_open = max_open
        self._open: OrderedDict[int, _Open] = OrderedDict()
        self._batch_of: dict[str, int] = {}
        self.dropped = 0  # batches forgotten before they completed (past max_open)

    def batch(
        self,
        number: int,
        order: Sequence[str],
        bids: Mapping[str, float],
        arrived: Mapping[str, float],
        planned: float,
    ) -> None:
        """Batch ``number`` was auctioned: its requests, their bids and arrival times."""
        missing = [r for r in order if r not in bids or r not in arrived]
        if missing:
            raise ValueError(f"batch {number}: no bid or arrival for {missing[:3]}")
        self._open[number] = _Open(
            number, planned, {r: bids[r] for r in order}, {r: arrived[r] for r in order}
        )
        for request_id in order:
            self._batch_of[request_id] = number
        while len(self._open) > self.max_open:
            _, old = self._open.popitem(last=False)
            for request_id in old.bids:
                self._batch_of.pop(request_id, None)
            self.dropped += 1

    def first_token(self, request_id: str, t: float) -> RealisedBatch | None:
        """``request_id`` got its first token at time ``t`` (the clock of ``arrived``)."""
        open_ = self._of(request_id)
        if open_ is None:
            return None
        open_.ttft.setdefault(request_id, max(0.0, t - open_.arrived[request_id]))
        return self._complete(open_)

    def ended(self, request_id: str) -> RealisedBatch | None:
        """``request_id`` ended; without a first token before, it ranks last in its batch."""
        open_ = self._of(request_id)
        if open_ is None:
            return None
        open_.ttft.setdefault(request_id, None)
        return self._complete(open_)

    def _of(self, request_id: str) -> _Open | None:
        number = self._batch_of.get(request_id)
        return None if number is None else self._open.get(number)

    def _complete(self, open_: _Open) -> RealisedBatch | None:
        if len(open_.ttft) < len(open_.bids):
            return None
        del self._open[open_.number]
        for request_id in open_.bids:
            self._batch_of.pop(request_id, None)
        served = [t for t in open_.ttft.values() if t is not None]
        last = (max(served) if served else 0.0) + 1.0  # after everyone who was served
        ids = list(open_.bids)
        ttft = [t if (t := open_.ttft[r]) is not None else last for r in ids]
        realised = realised_welfare([open_.bids[r] for r in ids], ttft)
        return RealisedBatch(open_.number, open_.planned, realised)
