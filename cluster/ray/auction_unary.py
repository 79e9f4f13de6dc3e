"""Unary admission, mixed into ``AuctionActor`` (cluster/ray/auction_actor.py, which owns the
state below): one request's ``admit`` → ``started`` → ``finished`` as three actor calls, for a
caller that is not an ingress replica under a lease (those hand their queued requests in batches,
cluster/ray/auction_exchange.py).

One request's money: ``admit`` reserves its bid b_r as a hold FIRST (``BudgetExceeded`` → the
ingress answers 402, ``UnknownAccountError`` → 401, ``QueueFull`` → 503, ``ValueError`` →
400), then waits in the queue until the release rule lets it go. ``finished(answered=True)``
captures its payment share p_r ≤ b_r from the hold (auctioned requests) or releases the hold
(FCFS requests pay nothing; so does a request not answered). A caller cancelled while queued
leaves the queue and its hold is released. Anonymous traffic (user "" or "anonymous") has no
account: it may only bid 0 and holds nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from auction.admission import QueueFull, Release
from auction.request import Request
from cluster.ledger.sqlite import BudgetExceeded, LedgerError
from cluster.ray.auction_exchange import AuctionCore, Entry
from telemetry import metrics

__all__ = ["ANONYMOUS", "AdmissionCancelledError", "UnaryAdmission"]

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
_REMEMBER_FINISHED = 10_000  # finished() answers repeats for this many recent requests


class AdmissionCancelledError(Exception):
    """The request left the queue before its release (finished while queued, or shutdown)."""


class UnaryAdmission(AuctionCore):
    """``admit``, ``started`` and ``finished`` (module docstring)."""

    _waiters: dict[str, asyncio.Future[Release]]
    _settled: OrderedDict[str, asyncio.Future[float]]
    _holds: int

    async def admit(
        self, request_id: str, user: str, bid: float, tokens: list[int],
        lease_id: str | None = None,
    ) -> Release:  # fmt: skip
        """Reserve ``bid``, wait for the release (its position, price, batch and mode; module
        docstring for the errors). ``lease_id``: the caller's replica
        ran over its leased share (cluster/dataplane/admission.py); its slots come back now."""
        if lease_id is not None:
            self._leases.revoke(lease_id)
            self._lend()
        anonymous = user in ("", ANONYMOUS)
        user = ANONYMOUS if anonymous else user
        Request(request_id, user, tokens, bid)  # ValueError for a bad id, bid or prompt, early
        if request_id in self._entries:
            raise ValueError(f"request {request_id!r} is already admitted")
        if request_id in self._settled:  # finished() came first (its caller gave up already)
            raise AdmissionCancelledError(f"request {request_id!r} already finished")
        if anonymous and bid > 0:
            raise BudgetExceeded(ANONYMOUS, float(bid), 0.0)  # no account: nothing to bid with
        if self._queue.depth >= self.settings.max_queue:  # before the ledger is touched
            raise QueueFull(f"the admission queue is full ({self._queue.depth} wait)")
        self._holds += 1
        hold_id = None if anonymous else f"{request_id}@{self._instance}.{self._holds}"
        loop = asyncio.get_running_loop()
        entry = self._entries[request_id] = Entry(user, float(bid), hold_id, loop.time())
        reserving = held = False
        # Registered before the reserve, so that finished() or shutdown() can refuse it anytime.
        waiter: asyncio.Future[Release] = loop.create_future()
        self._waiters[request_id] = waiter
        try:
            if hold_id is not None:
                reserving = True
                await self._ledger_call(self._ledger.reserve, hold_id, user, bid)
                held = True
            if not waiter.done():
                self._queue.enqueue(request_id, user, bid, tokens, now=loop.time())
                self._pump()
            release = await waiter
        except BaseException as exc:
            # Cancelled mid-reserve, the reserve may still commit: the release queued behind
            # it on the ledger thread undoes it either way.
            cancelled = isinstance(exc, asyncio.CancelledError)
            self._abandon(request_id, held or (reserving and cancelled))
            raise
        finally:
            self._waiters.pop(request_id, None)
        entry.release = release
        return release

    def _abandon(self, request_id: str, release_hold: bool) -> None:
        entry = self._entries.pop(request_id, None)
        if not self._queue.cancel(request_id):
            self._queue.slot_freed(request_id)  # released just as its caller gave up
        if entry is not None and entry.hold_id is not None and release_hold:
            try:
                self._exec.submit(self._release_quietly, entry.hold_id)
            except RuntimeError:  # shut down: the next start releases every open hold
                log.debug("hold %r left for the next start to release", entry.hold_id)
        self._pump()

    def _release_quietly(self, hold_id: str) -> None:
        try:
            self._ledger.release(hold_id)
        except LedgerError as exc:  # unknown: the reserve failed; else the next start releases it
            log.debug("release of hold %r: %s", hold_id, exc)

    async def started(self, request_id: str) -> None:
        """First token: the request's prefill slot is free."""
        self._queue.slot_freed(request_id)
        self._realised(self.realised.first_token(request_id, asyncio.get_running_loop().time()))
        self._pump()

    async def finished(self, request_id: str, answered: bool) -> float:
        """Capture the request's share (answered, auctioned) or release its hold; idempotent.
        What was charged.
        A request still queued leaves the queue (its ``admit`` raises AdmissionCancelledError)."""
        self._realised(self.realised.ended(request_id))
        settled = self._settled.get(request_id)
        if settled is None:
            entry = self._entries.get(request_id)
            if entry is not None and entry.release is None:  # still queued (or reserving)
                waiter = self._waiters.get(request_id)
                if waiter is not None and not waiter.done():
                    waiter.set_exception(AdmissionCancelledError(f"{request_id!r} finished"))
            if entry is None or entry.release is None:
                # A tombstone: nothing to settle here, and a late admit of this id is refused.
                settled = asyncio.get_running_loop().create_future()
                settled.set_result(0.0)
            else:
                del self._entries[request_id]
                self._queue.slot_freed(request_id)
                self._pump()
                settled = asyncio.get_running_loop().create_task(self._settle(entry, answered))
            self._settled[request_id] = settled
            while len(self._settled) > _REMEMBER_FINISHED:
                self._settled.popitem(last=False)
        return await asyncio.shield(settled)

    async def _settle(self, entry: Entry, answered: bool) -> float:
        release = entry.release
        assert release is not None
        if entry.hold_id is None:
            return 0.0
        if answered and release.mode == "auction" and release.batch_id is not None:
            charge = await self._ledger_call(
                self._ledger.capture, entry.hold_id, release.batch_id, release.payment
            )
            self.revenue += charge.amount
            metrics.AUCTION_REVENUE.inc(charge.amount)
            return charge.amount
        await self._ledger_call(self._ledger.release, entry.hold_id)
        return 0.0
