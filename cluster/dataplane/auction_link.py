"""A replica's link to the auction for the requests its lease does not cover: their bids, first
tokens and settlements gathered and sent in one call per exchange period
(``cluster.dataplane.exchange``; docs/design.md "Admission at saturation").

One call carries every request that queued, started or ended on this replica during the last
period, so the unary calls per request at saturation are about 1 / (period × the replica's
requests per second) instead of three. The price is latency where it is cheap: a queued request
reaches the auction, learns its release and frees its slot up to one period later, against a
queue wait that at saturation is seconds.

An exchange carries at most ``MAX_ITEMS`` of each kind, the oldest first; what is left rides
the next one, so a backlog (the settlements an outage left) drains in as many exchanges as it
takes instead of making one message the auction must refuse.

Failures. A lost call's bids are sent again (the hold id makes the resend reserve nothing
twice); its settlements too (a capture is exactly once). A restarted auction (a new instance id)
gets the requests that were waiting there again. After ``give_up_s`` without an answer the
waiting requests are refused with a 503 and their holds are released once the auction answers
again; settlements keep being sent until the auction takes them, and those still unanswered
resolve with the amount owed.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from auction.admission import Release
from cluster.actor_ref import ActorRef
from cluster.dataplane.calls import FailureCount, ask, detached_task
from cluster.dataplane.exchange import (
    MAX_ITEMS,
    Bid,
    ExchangeIn,
    ExchangeOut,
    Refusal,
    Settlement,
)
from cluster.dataplane.refs import AuctionCalls
from cluster.dataplane.settings import EXCHANGE_PERIOD_S

__all__ = ["AuctionLink"]

log = logging.getLogger(__name__)


@dataclass
class _Waiting:
    bid: Bid
    release: asyncio.Future[Release]


class AuctionLink:
    """The replica's side of the exchange with the auction actor ``auction``."""

    def __init__(
        self,
        auction: ActorRef,
        replica: str,
        *,
        period_s: float = EXCHANGE_PERIOD_S,
        give_up_s: float = 5.0,
        calls: collections.Counter[str] | None = None,
        lease_id: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.auction, self.replica = AuctionCalls(auction), replica
        self.period_s, self.give_up_s = period_s, give_up_s
        self.calls = calls if calls is not None else collections.Counter()
        self.overflowed_lease = lease_id  # the gate's lease when its share ran over, else None
        self.clock = clock
        self.instance = ""  # the auction instance last heard from
        self._unsent: dict[str, _Waiting] = {}
        self._sent: dict[str, _Waiting] = {}  # handed in, not yet released or refused
        self._released: dict[str, tuple[str, Release]] = {}  # request id → (hold id, release)
        self._started: list[str] = []
        self._withdrawn: list[str] = []
        self._settling: dict[str, tuple[Settlement, asyncio.Future[float]]] = {}
        self._failures = FailureCount("auction exchange")
        self._failing_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    # -- what the path asks ------------------------------------------------------------------

    async def admit(self, request_id: str, user: str, bid: float, tokens: Sequence[int]) -> Release:
        """Queue at the auction; the release (position, price, batch) when it comes, or the
        ``Refusal``. Cancelled (the client left), the request is withdrawn."""
        waiting = _Waiting(
            Bid(request_id, user, float(bid), tuple(tokens), f"{request_id}@{self.replica}"),
            asyncio.get_running_loop().create_future(),
        )
        self._unsent[request_id] = waiting
        self._wake()
        try:
            return await asyncio.shield(waiting.release)
        except asyncio.CancelledError:
            self._withdraw(request_id)
            raise

    def started(self, request_id: str) -> None:
        """First token: the request's prefill slot at the auction is free."""
        if request_id in self._released:
            self._started.append(request_id)
            self._wake()

    async def settle(self, request_id: str, answered: bool) -> float:
        """Close the request's hold: capture its price if ``answered`` and auctioned, else
        release it. What was charged (module docstring for an auction that does not answer)."""
        hold_id, release = self._released.pop(request_id, (None, None))
        if release is None:
            return 0.0
        settlement = Settlement(
            request_id, hold_id, release.batch_id if release.mode == "auction" else None,
            release.payment, answered,
        )  # fmt: skip
        charged: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._settling[request_id] = (settlement, charged)
        self._wake()
        return await asyncio.shield(charged)

    def _withdraw(self, request_id: str) -> None:
        waiting = self._unsent.pop(request_id, None) or self._sent.pop(request_id, None)
        if waiting is not None and not waiting.release.done():
            waiting.release.cancel()
        if request_id in self._released:  # released just as its client left: release the hold
            hold_id, _ = self._released.pop(request_id)
            self._settling[request_id] = (
                Settlement(request_id, hold_id, None, 0.0, False),
                asyncio.get_running_loop().create_future(),
            )
        else:
            self._withdrawn.append(request_id)
        self._wake()

    # -- the exchange ------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not (self._unsent or self._sent or self._started or self._withdrawn
                    or self._settling)  # fmt: skip

    def _wake(self) -> None:
        if self._task is None or self._task.done():
            self._task = detached_task(self._run(), name="exchange")

    async def _run(self) -> None:
        while not self.idle:
            await asyncio.sleep(self.period_s)  # what arrives meanwhile rides the same call
            await self.exchange_once()

    async def exchange_once(self) -> bool:
        """One exchange of what is pending, at most ``MAX_ITEMS`` of each kind (the oldest
        first; the rest rides the next exchange); False if the auction did not answer."""
        bids = list(itertools.islice(self._unsent.values(), MAX_ITEMS))
        started, self._started = self._started[:MAX_ITEMS], self._started[MAX_ITEMS:]
        withdrawn, self._withdrawn = self._withdrawn[:MAX_ITEMS], self._withdrawn[MAX_ITEMS:]
        settlements = [s for s, _ in itertools.islice(self._settling.values(), MAX_ITEMS)]
        for waiting in bids:
            self._sent[waiting.bid.request_id] = self._unsent.pop(waiting.bid.request_id)
        message = ExchangeIn(
            self.replica, tuple(w.bid for w in bids), tuple(started), tuple(settlements),
            tuple(withdrawn), self.overflowed_lease() if bids else None,
        )  # fmt: skip
        self.calls["exchange"] += 1
        timeout_s = 10 * self.period_s + 2.0
        reply = await ask(lambda: self.auction.exchange(message), timeout_s, self._failures)
        if reply is None:
            self._on_failure(bids, started, withdrawn)
            return False
        self._failing_since = None
        self._on_reply(reply)
        return True

    def _on_reply(self, reply: ExchangeOut) -> None:
        if self.instance and reply.instance != self.instance:  # a restarted auction
            log.warning("the auction restarted: %d waiting requests handed in again",
                        len(self._sent))  # fmt: skip
            self._unsent.update(self._sent)
            self._sent.clear()
        self.instance = reply.instance
        for release in reply.released:
            waiting = self._sent.pop(release.request_id, None)
            if waiting is None or waiting.release.done():  # withdrawn meanwhile
                self._settling[release.request_id] = (
                    Settlement(release.request_id, None if waiting is None else
                               waiting.bid.hold_id, None, 0.0, False),
                    asyncio.get_running_loop().create_future(),
                )  # fmt: skip
                continue
            self._released[release.request_id] = (waiting.bid.hold_id, release)
            waiting.release.set_result(release)
        for refused in reply.refused:
            waiting = self._sent.pop(refused.request_id, None)
            if waiting is not None and not waiting.release.done():
                waiting.release.set_exception(refused.error())
        for settled in reply.settled:
            entry = self._settling.pop(settled.request_id, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(settled.charged)

    def _on_failure(self, bids: list[_Waiting], started: list[str], withdrawn: list[str]) -> None:
        # The call may or may not have reached the auction: send it all again, first (the
        # settlements are still in ``_settling``; a first token told twice frees one slot).
        for waiting in bids:
            if self._sent.pop(waiting.bid.request_id, None) is not None:
                self._unsent[waiting.bid.request_id] = waiting
        self._started[:0] = started
        self._withdrawn[:0] = withdrawn
        now = self.clock()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since < self.give_up_s:
            return
        refusal = Refusal(503, "auction_unavailable", "the auction is restarting; retry shortly")
        for waiting in [*self._unsent.values(), *self._sent.values()]:
            if not waiting.release.done():
                waiting.release.set_exception(refusal)
            # Its hold, if the lost call reserved one, is released when the auction answers.
            rid = waiting.bid.request_id
            self._settling[rid] = (
                Settlement(rid, waiting.bid.hold_id, None, 0.0, False),
                asyncio.get_running_loop().create_future(),
            )
        self._unsent.clear()
        self._sent.clear()
        for settlement, charged in self._settling.values():
            if not charged.done():  # owed; it is captured when the auction takes it
                charged.set_result(settlement.payment if settlement.capture else 0.0)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
            self._task = None
