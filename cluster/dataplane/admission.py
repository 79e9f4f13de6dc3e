"""Admission without an actor call below saturation: the auction's lease and the replica's gate
(docs/design.md "Data flow (serve mode)", "Admission lease").

The auction actor grants each ingress replica a :class:`Lease`: a share of the release slots
(``max_in_prefill`` split over the live leases), the regime, whether requests may pass first
come first served (``fcfs``: the regime is ``below`` and fewer than ``queue_threshold`` wait),
and each user's available budget. The replica renews it by heartbeat (every third of its TTL).

While its lease is valid and ``fcfs``, a replica admits a request in-process, with no actor
call and no ledger write, as long as it holds fewer than ``slots`` requests still without a
first token and the bid fits the user's available budget (FCFS charges nothing, so nothing is
held: the budget check only refuses what the auction would refuse). Everything else goes to the
auction actor as before: a bid above the budget or an unknown user (the actor answers 402 or
401), a full share of slots (the request queues there, where bids order it), an expired or
revoked lease. A replica whose share ran over, or that hears the controller announce a regime
other than ``below``, stops admitting locally until its next lease, so requests that arrive
after one it sent to the queue do not overtake it.

A replica that dies stops renewing: its slots return to the auction when its lease expires.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cluster.dataplane.settings import LEASE_TTL_S

__all__ = [
    "ANONYMOUS",
    "ANONYMOUS_USERS",
    "LEASE_TTL_S",
    "AdmissionGate",
    "Lease",
    "LeaseBook",
    "LocalAdmission",
]

ANONYMOUS = "anonymous"  # the ledger name of unauthenticated requests; no file entry may take it
ANONYMOUS_USERS = frozenset({"", ANONYMOUS})


@dataclass(frozen=True, slots=True)
class Lease:
    """What the auction actor grants one replica until ``ttl_s`` after it is received."""

    lease_id: str
    replica: str
    slots: int
    regime: str
    fcfs: bool
    budgets: Mapping[str, float] = field(default_factory=dict)
    ttl_s: float = LEASE_TTL_S

    def __post_init__(self) -> None:
        if type(self.slots) is not int or self.slots < 0:
            raise ValueError(f"slots must be an int >= 0, got {self.slots!r}")
        if not (isinstance(self.ttl_s, float | int) and 0 < self.ttl_s <= 600):
            raise ValueError(f"ttl_s must be in (0, 600], got {self.ttl_s!r}")


@dataclass(frozen=True, slots=True)
class LocalAdmission:
    """A request the replica admitted under its lease: FCFS, position 0, nothing charged."""

    request_id: str
    lease_id: str


class AdmissionGate:
    """The replica's side of the lease: local FCFS admission within its share of slots."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lease: Lease | None = None
        self.expires = -math.inf
        self.overflowed = False
        self._in_prefill: set[str] = set()
        self._local: set[str] = set()
        self.admitted = 0  # locally, since start
        self.refused = 0  # sent to the auction actor instead

    def grant(self, lease: Lease) -> None:
        """A new or renewed lease, valid ``ttl_s`` from now on this replica's clock."""
        self.lease = lease
        self.expires = self.clock() + lease.ttl_s
        self.overflowed = False

    def on_regime(self, regime: str) -> None:
        """The controller announced ``regime``: out of ``below``, stop admitting locally at
        once rather than at the next renewal (whose lease will say so too)."""
        if regime != "below":
            self.overflowed = True

    def valid(self) -> bool:
        return self.lease is not None and self.clock() < self.expires

    def try_admit(self, request_id: str, user: str, bid: float) -> LocalAdmission | None:
        """Admit locally, or None: ask the auction actor (module docstring)."""
        lease = self.lease
        if lease is None or not lease.fcfs or self.overflowed or self.clock() >= self.expires:
            self.refused += 1
            return None
        if user not in ANONYMOUS_USERS:
            available = lease.budgets.get(user)
            if available is None or not bid <= available:  # unknown, or over: the actor says
                self.refused += 1
                return None
        elif bid != 0:
            self.refused += 1
            return None
        if len(self._in_prefill) >= lease.slots:
            self.overflowed = True  # this one queues at the auction; so do the next ones
            self.refused += 1
            return None
        self._in_prefill.add(request_id)
        self._local.add(request_id)
        self.admitted += 1
        return LocalAdmission(request_id, lease.lease_id)

    def is_local(self, request_id: str) -> bool:
        return request_id in self._local

    def started(self, request_id: str) -> None:
        """First token: the request's slot is free (idempotent)."""
        self._in_prefill.discard(request_id)

    def finished(self, request_id: str) -> None:
        """The request ended, any way (idempotent)."""
        self._in_prefill.discard(request_id)
        self._local.discard(request_id)

    @property
    def in_prefill(self) -> int:
        return len(self._in_prefill)

    @property
    def in_flight(self) -> int:
        return len(self._local)


@dataclass
class _Held:
    lease_id: str
    slots: int
    expires: float


class LeaseBook:
    """The auction's side of the leases: which replica holds how many slots until when. A
    plain object: the caller passes ``now`` (its loop's clock) and lends ``lent`` slots to
    no one else."""

    def __init__(
        self, *, max_in_prefill: int, ttl_s: float = LEASE_TTL_S, prefix: str = ""
    ) -> None:
        if not (isinstance(ttl_s, float | int) and 0 < ttl_s <= 600):
            raise ValueError(f"lease_ttl_s must be in (0, 600], got {ttl_s!r}")
        self.max_in_prefill = max_in_prefill
        self.ttl_s = float(ttl_s)
        self.prefix = prefix
        self._held: dict[str, _Held] = {}  # by replica
        self._seq = 0

    def grant(self, replica: str, now: float, fcfs: bool) -> tuple[str, int]:
        """(lease id, slots) for ``replica``: an even share of the slots over the live leases
        while ``fcfs``, else none."""
        if type(replica) is not str or not 0 < len(replica) <= 256:
            raise ValueError("replica must be a str of 1 to 256 characters")
        self.expire(now)
        live = len(self._held) + (replica not in self._held)
        slots = self.max_in_prefill // live if fcfs else 0
        self._seq += 1
        lease_id = f"{replica}#{self.prefix}.{self._seq}"
        self._held[replica] = _Held(lease_id, slots, now + self.ttl_s)
        return lease_id, slots

    def seen(self, replica: str, now: float) -> None:
        """``replica`` is alive (it exchanged): its lease lives on, and a replica without one
        gets one of no slots, so that its requests are dropped should it die."""
        held = self._held.get(replica)
        if held is None:
            self.grant(replica, now, fcfs=False)
        else:
            held.expires = now + self.ttl_s

    def revoke(self, lease_id: object) -> None:
        """Take the slots of lease ``lease_id`` back (it ran over, or FCFS ended)."""
        for held in self._held.values():
            if held.lease_id == lease_id:
                held.slots = 0

    def revoke_all(self) -> None:
        for held in self._held.values():
            held.slots = 0

    def expire(self, now: float) -> list[str]:
        """Forget the leases past their TTL (their replicas stopped renewing): those replicas."""
        gone = [r for r, h in self._held.items() if h.expires <= now]
        for replica in gone:
            del self._held[replica]
        return gone

    @property
    def lent(self) -> int:
        return sum(h.slots for h in self._held.values())

    def next_expiry(self) -> float | None:
        return min((h.expires for h in self._held.values()), default=None)

    def slots(self) -> dict[str, int]:
        return {r: h.slots for r, h in self._held.items()}
