"""What an ingress replica and the auction actor exchange when requests queue: one call per
replica per exchange period carrying every request's admission, first token and settlement
(docs/design.md "Data flow (serve mode)", "Admission at saturation").

The replica sends an :class:`ExchangeIn`:

- ``bids``: requests it could not admit under its lease, each with the hold id the replica
  chose (``{request_id}@{replica}``), so that a resend after a lost reply reserves nothing
  twice;
- ``started``: requests that produced their first token (their prefill slots are free);
- ``settlements``: requests that ended, answered or not, with what the replica was told at
  release, so the actor captures or releases their holds without remembering them (a restarted
  auction settles a request the previous one released);
- ``withdrawn``: requests whose clients left before their release.

The actor answers an :class:`ExchangeOut` with what happened to this replica's requests since
its last answer: releases (position, price, batch), refusals (status, code, message: a bid
above the budget is 402, an unknown user 401, a full queue 503) and settlements (what was
captured), plus its instance id, which changes when the auction restarts (the replica then
hands in again the requests that were waiting there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from auction.admission import Release

__all__ = [
    "MAX_ITEMS",
    "Bid",
    "ExchangeIn",
    "ExchangeOut",
    "Refusal",
    "Refused",
    "Settled",
    "Settlement",
]

MAX_ITEMS = 4096  # per list of one exchange: a replica sends what queued in one period


class Refusal(Exception):  # noqa: N818  (what it is, not what went wrong)
    """A request refused where it was decided: ``status`` is its HTTP status, ``code`` a stable
    machine-readable reason, ``message`` the sentence a client reads."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, code, message)
        self.status, self.code, self.message = status, code, message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class Bid:
    """A request handed to the auction's queue."""

    request_id: str
    user: str
    bid: float
    tokens: tuple[int, ...]
    hold_id: str

    def __post_init__(self) -> None:
        if not (isinstance(self.bid, float | int) and math.isfinite(self.bid) and self.bid >= 0):
            raise ValueError(f"bid must be a finite number >= 0, got {self.bid!r}")


@dataclass(frozen=True, slots=True)
class Settlement:
    """A request that ended: capture ``payment`` from ``hold_id`` for ``batch_id`` if it was
    ``answered`` and auctioned, else release the hold (``hold_id`` None: nothing was held)."""

    request_id: str
    hold_id: str | None
    batch_id: str | None
    payment: float
    answered: bool

    @property
    def capture(self) -> bool:
        return self.answered and self.batch_id is not None and self.hold_id is not None


@dataclass(frozen=True, slots=True)
class ExchangeIn:
    replica: str
    bids: tuple[Bid, ...] = ()
    started: tuple[str, ...] = ()
    settlements: tuple[Settlement, ...] = ()
    withdrawn: tuple[str, ...] = ()
    overflowed_lease: str | None = None  # the lease whose share ran over: its slots come back

    def __post_init__(self) -> None:
        for name in ("bids", "started", "settlements", "withdrawn"):
            if len(getattr(self, name)) > MAX_ITEMS:
                raise ValueError(f"{name}: at most {MAX_ITEMS} per exchange")

    @property
    def empty(self) -> bool:
        return not (self.bids or self.started or self.settlements or self.withdrawn)


@dataclass(frozen=True, slots=True)
class Refused:
    request_id: str
    status: int
    code: str
    message: str

    def error(self) -> Refusal:
        return Refusal(self.status, self.code, self.message)


@dataclass(frozen=True, slots=True)
class Settled:
    request_id: str
    charged: float


@dataclass(frozen=True, slots=True)
class ExchangeOut:
    instance: str
    released: tuple[Release, ...] = ()
    refused: tuple[Refused, ...] = ()
    settled: tuple[Settled, ...] = ()
    queue_depth: int = 0
