"""The auction actor's side of the replicas: their leases and their batched exchanges
(``cluster.dataplane.admission``, ``cluster.dataplane.exchange``; docs/design.md "Data flow
(serve mode)").

A request handed in by a replica is owned by it: its hold is reserved for the replica (the
hold's owner) with an expiry that each lease renewal pushes forward, its release goes into the
replica's box and leaves with the replica's next exchange. One exchange's holds are reserved in
one ledger transaction and its settlements committed in another. A replica whose lease expires
(it died) loses its entries: its queued requests leave the queue, its released ones free their
slots, and its holds are released; should it come back, its next exchange learns that its
queued requests were refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from auction.admission import AdmissionQueue, AuctionSettings, QueueFull, Release
from auction.realised import RealisedBatch, RealisedWelfare
from auction.request import Request
from cluster.dataplane.admission import ANONYMOUS_USERS, Lease, LeaseBook
from cluster.dataplane.exchange import Bid, ExchangeIn, ExchangeOut, Refused, Settled, Settlement
from cluster.ledger.book import LedgerBook
from cluster.ledger.sqlite import (
    BudgetExceeded,
    Charge,
    Hold,
    LedgerError,
    UnknownAccountError,
)
from telemetry import metrics

__all__ = ["AuctionCore", "ReplicaExchange"]

log = logging.getLogger(__name__)

T = TypeVar("T")
BOX_KEEP_S = 60.0  # a silent replica's undelivered answers are kept this long


@dataclass
class Box:
    """What happened to a replica's requests since its last exchange."""

    seen: float
    released: list[Release] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    settled: list[Settled] = field(default_factory=list)

    def drain(self, instance: str, depth: int) -> ExchangeOut:
        out = ExchangeOut(instance, tuple(self.released), tuple(self.refused),
                          tuple(self.settled), depth)  # fmt: skip
        self.released, self.refused, self.settled = [], [], []
        return out


@dataclass
class Entry:
    """A request the auction admitted and has not settled."""

    user: str
    bid: float
    hold_id: str | None  # None: anonymous, nothing held
    owner: str  # the replica that handed it in
    arrived: float = 0.0  # admission time, on the actor's loop clock (for the realised TTFT)
    release: Release | None = None


def refusal_of(request_id: str, exc: BaseException) -> Refused:
    """A ledger or queue error as the refusal a client reads."""
    status, code = {
        BudgetExceeded: (402, "budget_exceeded"),
        UnknownAccountError: (401, "unknown_user"),
        QueueFull: (503, "queue_full"),
        ValueError: (400, "invalid_request"),
    }.get(type(exc), (409, "hold_conflict"))
    return Refused(request_id, status, code, str(exc).splitlines()[0] if str(exc) else code)


class AuctionCore:
    """What the auction actor's mixins share: the actor's state (``AuctionActor`` owns it) and
    the helpers it defines. Below both mixins in the order of bases, so that no stub here
    shadows a mixin's method."""

    settings: AuctionSettings
    revenue: float
    realised: RealisedWelfare
    _instance: str
    _leases: LeaseBook
    _queue: AdmissionQueue
    _ledger: LedgerBook
    _exec: ThreadPoolExecutor
    _entries: dict[str, Entry]
    _closed: bool
    hold_grace_s: float
    _unreleased: set[str]  # holds whose release failed: retried on the ledger thread

    def _hold_expiry(self) -> float:
        """When a hold reserved or renewed now expires: its owner's lease, and the grace."""
        return time.time() + self._leases.ttl_s + self.hold_grace_s

    def _release_later(self, hold_id: str) -> None:
        """Release ``hold_id`` on the ledger thread, off the caller's path; a release that
        fails is kept and retried with the next lease renewal (``_retry_releases``)."""
        self._exec.submit(self._release_or_keep, hold_id)

    def _release_or_keep(self, hold_id: str) -> None:
        try:
            self._ledger.release(hold_id)
        except Exception as exc:  # a stalled or failing ledger: the hold must still close
            log.warning("releasing hold %s failed, will retry: %r", hold_id, exc)
            self._unreleased.add(hold_id)
        else:
            self._unreleased.discard(hold_id)

    def _retry_releases(self) -> None:
        for hold_id in sorted(self._unreleased):
            self._release_or_keep(hold_id)

    async def _ledger_call(self, fn: Callable[..., T], *args: object) -> T:
        raise NotImplementedError

    def _pump(self) -> None:
        raise NotImplementedError

    def _realised(self, batch: RealisedBatch | None) -> None:
        raise NotImplementedError

    def _lend(self) -> None:
        raise NotImplementedError


class LedgerBusyError(RuntimeError):
    """A replica's previous call of the same kind still waits for the ledger: this one is
    refused untouched (the replica sends its contents again), so a ledger that stalls does not
    pile up one queued transaction per period and replica, to be worked off when it resumes."""


class ReplicaExchange(AuctionCore):
    """Leases and exchanges, mixed into ``AuctionActor``."""

    _boxes: dict[str, Box]
    _in_flight: set[tuple[str, str]]

    @contextlib.contextmanager
    def _one_at_a_time(self, call: str, replica: str) -> Iterator[None]:
        key = (call, replica)
        if key in self._in_flight:
            raise LedgerBusyError(f"{replica}: its previous {call} still waits for the ledger")
        self._in_flight.add(key)
        try:
            yield
        finally:
            self._in_flight.discard(key)

    # -- leases --------------------------------------------------------------------------------

    async def lease(self, replica: str) -> Lease:
        """Grant or renew ``replica``'s lease (``LeaseBook.grant``: an even share of the release
        slots while requests pass first come first served and none waits here, else none) with
        the users' available budgets (budget − spent − held). The replica's holds live as long."""
        with self._one_at_a_time("lease", replica):
            now = asyncio.get_running_loop().time()
            fcfs = self._queue.fcfs and self._queue.depth == 0 and not self._closed
            lease_id, slots = self._leases.grant(replica, now, fcfs)
            self._lend()
            budgets = await self._ledger_call(self._lease_books, replica, self._hold_expiry())
            self._pump()
        return Lease(
            lease_id, replica, slots, self._queue.regime, fcfs, budgets, self._leases.ttl_s
        )

    def _lease_books(self, replica: str, until: float) -> dict[str, float]:
        self._ledger.renew_holds(replica, until)
        self._retry_releases()
        # Owners that stopped renewing for longer than their lease and the grace: dead.
        self._ledger.release_expired_holds(time.time())
        return self._ledger.available_all()

    def _lend(self) -> None:
        self._queue.set_leased(self._leases.lent)

    def _drop_replicas(self, gone: Sequence[str], now: float) -> None:
        """Leases expired: their replicas' requests go, their holds are released."""
        for rid, entry in list(self._entries.items()):
            if entry.owner in gone:
                del self._entries[rid]
                if self._queue.cancel(rid):
                    self._box(entry.owner, now).refused.append(
                        Refused(rid, 503, "lease_expired", "the replica's lease expired")
                    )
                else:
                    self._queue.slot_freed(rid)
        # Their holds stay until they expire (the lease and the grace): a replica that was
        # only slow comes back and settles them; a dead one's are released then.
        owners = {e.owner for e in self._entries.values()}
        for replica, box in list(self._boxes.items()):
            if now - box.seen > BOX_KEEP_S and replica not in owners:
                del self._boxes[replica]

    def _box(self, replica: str, now: float) -> Box:
        """``replica``'s box (a new one if it was dropped: answers wait there for its return)."""
        return self._boxes.setdefault(replica, Box(now))

    # -- exchanges -----------------------------------------------------------------------------

    async def exchange(self, message: ExchangeIn) -> ExchangeOut:
        """One replica's exchange (``cluster.dataplane.exchange``): its withdrawals, first
        tokens and settlements applied, its bids queued, then what happened to its requests."""
        if not isinstance(message, ExchangeIn):
            raise TypeError(f"an exchange takes an ExchangeIn, not {type(message).__name__}")
        with self._one_at_a_time("exchange", message.replica):
            return await self._exchange(message)

    async def _exchange(self, message: ExchangeIn) -> ExchangeOut:
        loop = asyncio.get_running_loop()
        replica = message.replica
        box = self._box(replica, loop.time())
        box.seen = loop.time()
        self._leases.seen(replica, loop.time())
        if message.overflowed_lease is not None:
            self._leases.revoke(message.overflowed_lease)
            self._lend()
        for rid in message.withdrawn:
            entry = self._entries.get(rid)
            if self._forget(rid, replica) and entry is not None and entry.hold_id is not None:
                self._release_later(entry.hold_id)
        for rid in message.started:
            self._queue.slot_freed(rid)
            self._realised(self.realised.first_token(rid, loop.time()))
        first = {s.request_id for s in message.settlements if self._forget(s.request_id, replica)}
        bids = self._new_bids(message.bids, replica, box)
        reserved, settled = await self._ledger_call(
            self._exchange_books, bids, message.settlements, replica,
            self._hold_expiry(),
        )  # fmt: skip
        for bid, hold in zip(bids, reserved, strict=True):
            self._queue_bid(bid, hold, replica, box)
        for settlement, result in zip(message.settlements, settled, strict=True):
            charged = result.amount if isinstance(result, Charge) else 0.0
            if charged and settlement.request_id in first:  # counted once, not on a resend
                self.revenue += charged
                metrics.AUCTION_REVENUE.inc(charged)
            box.settled.append(Settled(settlement.request_id, charged))
        self._pump()
        return box.drain(self._instance, self._queue.depth)

    def _forget(self, request_id: str, replica: str) -> bool:
        """The request left (withdrawn or settled): out of the queue, its slot free."""
        self._realised(self.realised.ended(request_id))
        entry = self._entries.get(request_id)
        if entry is None or entry.owner != replica:
            return False
        del self._entries[request_id]
        if not self._queue.cancel(request_id):
            self._queue.slot_freed(request_id)
        return True

    def _new_bids(self, bids: Sequence[Bid], replica: str, box: Box) -> list[Bid]:
        """The bids to reserve: a resend of one already here is answered from what is known."""
        out: list[Bid] = []
        for bid in bids:
            entry = self._entries.get(bid.request_id)
            if entry is not None:
                if entry.owner != replica:
                    box.refused.append(refusal_of(bid.request_id, ValueError(
                        f"request {bid.request_id!r} is already admitted")))  # fmt: skip
                elif entry.release is not None:  # its release was in an answer that got lost
                    box.released.append(entry.release)
                continue
            try:
                Request(bid.request_id, bid.user, list(bid.tokens), bid.bid)
                if bid.user in ANONYMOUS_USERS and bid.bid > 0:
                    raise BudgetExceeded("anonymous", bid.bid, 0.0)
                if self._queue.depth + len(out) >= self._queue.settings.max_queue:
                    raise QueueFull(f"the admission queue is full ({self._queue.depth} wait)")
            except (ValueError, BudgetExceeded, QueueFull) as exc:
                box.refused.append(refusal_of(bid.request_id, exc))
                continue
            out.append(bid)
        return out

    def _exchange_books(
        self, bids: Sequence[Bid], settlements: Sequence[Settlement], owner: str, until: float
    ) -> tuple[list[Hold | LedgerError | None], list[Charge | Hold | LedgerError | None]]:
        """One transaction for the bids' holds, one for the settlements (the ledger thread)."""
        paying = [b for b in bids if b.user not in ANONYMOUS_USERS]
        held = iter(self._ledger.reserve_many(
            [(b.hold_id, b.user, b.bid) for b in paying], owner=owner, expires=until,
        ) if paying else [])  # fmt: skip
        reserved = [None if b.user in ANONYMOUS_USERS else next(held) for b in bids]
        closing = [s for s in settlements if s.hold_id is not None]
        done = iter(self._ledger.settle_many([
            (str(s.hold_id), s.batch_id if s.capture else None, s.payment) for s in closing
        ]) if closing else [])  # fmt: skip
        settled = [None if s.hold_id is None else next(done) for s in settlements]
        return reserved, settled

    def _queue_bid(self, bid: Bid, hold: Hold | LedgerError | None, replica: str,
                   box: Box) -> None:  # fmt: skip
        if isinstance(hold, LedgerError):
            box.refused.append(refusal_of(bid.request_id, hold))
            return
        if hold is not None and hold.state != "open":  # a resend after the hold was closed
            box.refused.append(Refused(bid.request_id, 503, "hold_closed",
                                       "the request's hold was closed; retry"))  # fmt: skip
            return
        anonymous = bid.user in ANONYMOUS_USERS
        user = "anonymous" if anonymous else bid.user
        now = asyncio.get_running_loop().time()
        try:  # other exchanges may have filled the queue while the ledger worked
            self._queue.enqueue(bid.request_id, user, bid.bid, bid.tokens, now=now)
        except (QueueFull, ValueError) as exc:
            box.refused.append(refusal_of(bid.request_id, exc))
            if hold is not None:
                self._release_later(hold.hold_id)
            return
        self._entries[bid.request_id] = Entry(
            user, bid.bid, None if anonymous else bid.hold_id, replica, now
        )
