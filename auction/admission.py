"""Admission in serve mode: FCFS pass-through below saturation, auctioned batches when requests
queue (docs/design.md §1 and "Serve runtime"). A plain object: the caller passes ``now`` (wall
seconds, any monotonic origin) and tells it when prefill slots free; it never reads a clock.

Release rule. At most ``max_in_prefill`` requests are released and still without a first token
(their prefill "slots"), less the slots lent to ingress replicas that admit FCFS on their own
(``set_leased``). While the regime is ``below`` and fewer than ``queue_threshold``
requests queue, requests leave in arrival order as slots free (FCFS: position 0, payment 0, no
batch). Otherwise the queue is cut into batches: when no batch is pending and a slot is free, a
batch forms as soon as ``batch_size`` have queued or the oldest has waited ``batch_window_ms``:
the oldest ``batch_size`` by (``engine_priority``, arrival), so paying requests first
(``auction.priority.batch_members``: a zero bid gains nothing from its place). A batch is
ordered by ``scheduler`` (``dfs-bid``: the welfare-maximal DFS order of the prompts' radix tree)
and leaves in that order as slots free; a pending batch always leaves before anything else, so a
position once given is kept.

Payments. For ``dfs-bid``, user i pays its VCG price p_i (``auction.vcg``), split over its
requests R_i in the batch in proportion to their bids:

    p_r = p_i · b_r / Σ_{r'∈R_i} b_r'      (p_r = 0 when Σ_{r'∈R_i} b_r' = 0)

Since p_i ≤ V_i(σ*) ≤ Σ_{r∈R_i} b_r, each p_r ≤ b_r (clamped against float rounding), so a hold
of b_r always covers the request's share. The other schedulers charge nothing.

The live service (``cluster.ray.auction_actor``) and the virtual-time simulator
(``cluster.sim.admission.AuctionAdmission``) both run this queue: they release and price alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from auction.priority import take_batch
from auction.request import Request
from auction.run import run_auction
from auction.schedulers import SCHEDULERS
from auction.welfare import user_values

__all__ = [
    "REGIMES",
    "SETTING_BOUNDS",
    "AdmissionQueue",
    "AuctionSettings",
    "BatchOutcome",
    "QueueFull",
    "Release",
    "batch_seed",
    "derived_max_in_prefill",
    "prefill_slots_per_worker",
    "split_payments",
]

REGIMES: Final = ("below", "transition", "saturated")
"""The controller's regimes (controller/detector.py ``Regime`` labels)."""

Mode = Literal["fcfs", "auction"]

# (low, high) of every numeric setting: one table for this dataclass and the pydantic edge model.
SETTING_BOUNDS: Final[Mapping[str, tuple[float, float]]] = {
    "batch_size": (1, 4096),  # VCG and the tree are fast far beyond; positions stay meaningful
    "batch_window_ms": (0.0, 60_000.0),
    "queue_threshold": (0, 1_000_000),  # 0: never FCFS, every request is auctioned
    "max_in_prefill": (1, 1_000_000),
    "max_queue": (1, 10_000_000),
}


class QueueFull(Exception):  # noqa: N818  (the name the ingress maps to 503)
    """``max_queue`` requests already wait: the caller should answer 503 (try again later)."""


@dataclass(frozen=True)
class AuctionSettings:
    """The admission stage's knobs (validated; the service's YAML edge is
    ``cluster.ray.auction_actor.AuctionSettingsModel``)."""

    batch_size: int = 32
    batch_window_ms: float = 50.0
    queue_threshold: int = 8
    max_in_prefill: int = 64
    scheduler: str = "dfs-bid"
    max_queue: int = 10_000

    def __post_init__(self) -> None:
        for name, (low, high) in SETTING_BOUNDS.items():
            value: object = getattr(self, name)
            integral = name != "batch_window_ms"
            if isinstance(value, bool) or not isinstance(value, int if integral else int | float):
                kind = "an integer" if integral else "a number"
                raise ValueError(f"{name} must be {kind}, got {value!r}")
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value!r}")
        if self.scheduler not in SCHEDULERS:
            known = ", ".join(sorted(SCHEDULERS))
            raise ValueError(f"unknown scheduler {self.scheduler!r}; known: {known}")

    @property
    def batch_window_s(self) -> float:
        return self.batch_window_ms / 1000.0


@dataclass(frozen=True)
class Release:
    """A request allowed to proceed: its 1-based ``position`` in its batch (0 for FCFS), its
    payment share p_r (≤ its bid) and ``batch_id`` (None for FCFS)."""

    request_id: str
    position: int
    payment: float
    batch_id: str | None
    mode: Mode


@dataclass(frozen=True)
class BatchOutcome:
    """One auctioned batch: ``number`` counts batches from 0 (``AuctionEvent.batch_id``),
    ``payments`` are the users' VCG prices p_i, ``shares`` the requests' p_r."""

    number: int
    batch_id: str
    t: float
    order: tuple[str, ...]
    payments: Mapping[str, float]
    shares: Mapping[str, float]
    welfare: float
    user_welfare: Mapping[str, float] = field(default_factory=dict)  # V_i (docs/design.md §1)

    @property
    def revenue(self) -> float:
        return float(sum(self.payments.values()))


def batch_seed(seed: int, batch: int) -> int:
    """Batch ``batch``'s own seed for the neutral ties of the bid-blind schedulers, from
    (``seed``, ``batch``): no two batches of a run share a tie order, and a run replays from its
    seed."""
    return int(np.random.SeedSequence([seed, batch]).generate_state(1)[0])


def prefill_slots_per_worker(requests_per_iteration: int) -> int:
    """The share of ``max_in_prefill`` one prefill worker warrants: twice what one of its
    iterations takes, the batch running and the next one waiting. Fewer and the engine idles
    between iterations (a batch forms only from what was released before it starts); more and
    the queue leaves the auction for the engine, where only paying versus non-paying counts
    (docs/design.md §1, "Priority reaches the engine")."""
    if type(requests_per_iteration) is not int or requests_per_iteration < 1:
        raise ValueError(
            f"requests_per_iteration must be an int >= 1, got {requests_per_iteration!r}"
        )
    return 2 * requests_per_iteration


def derived_max_in_prefill(slots_per_worker: int, prefill_workers: int) -> int:
    """``max_in_prefill`` for ``prefill_workers`` workers of ``slots_per_worker`` each, within
    its bounds (at least 1: a pool a re-split emptied still lets one request through)."""
    low, high = SETTING_BOUNDS["max_in_prefill"]
    return int(min(max(slots_per_worker * prefill_workers, low), high))


@dataclass(frozen=True)
class _Queued:
    request: Request
    arrived: float


def split_payments(payments: Mapping[str, float], requests: Iterable[Request]) -> dict[str, float]:
    """Each request's share p_r of its user's payment p_i (module docstring), by request id.

    >>> reqs = [Request("a", "u", [1], 3.0), Request("b", "u", [2], 1.0), Request("c", "v", [3], 0)]
    >>> split_payments({"u": 2.0, "v": 0.0}, reqs)
    {'a': 1.5, 'b': 0.5, 'c': 0.0}
    """
    batch = list(requests)
    bids: dict[str, float] = {}
    for r in batch:
        bids[r.user] = bids.get(r.user, 0.0) + r.bid
    shares = {}
    for r in batch:
        total, paid = bids[r.user], payments.get(r.user, 0.0)
        share = paid * r.bid / total if total > 0 else 0.0
        shares[r.id] = min(max(share, 0.0), r.bid)  # p_i ≤ Σ b_r: clamp only float rounding
    return shares


class AdmissionQueue:
    """The queue in front of the router (module docstring). Not thread-safe: one owner."""

    def __init__(
        self, settings: AuctionSettings, *, batch_prefix: str = "batch", seed: int = 0
    ) -> None:
        """``seed`` seeds the bid-blind schedulers' neutral ties: batch k draws from
        ``batch_seed(seed, k)``."""
        if not isinstance(batch_prefix, str) or not batch_prefix:
            raise ValueError(f"batch_prefix must be a non-empty string, got {batch_prefix!r}")
        if type(seed) is not int or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.seed = seed
        self.settings = settings
        self.batch_prefix = batch_prefix
        self.regime: str = "below"
        self.batches = 0
        self._waiting: dict[str, _Queued] = {}  # arrival order (dicts keep insertion order)
        self._ordered: dict[str, Release] = {}  # the pending batch, in auction order
        self._in_prefill: set[str] = set()
        self.leased = 0  # slots lent to ingress replicas that admit FCFS on their own
        self._arrivals = 0
        self._formed: list[BatchOutcome] = []

    # -- state ---------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests admitted to the queue and not yet released."""
        return len(self._waiting) + len(self._ordered)

    @property
    def in_prefill(self) -> int:
        """Released requests without a first token (slots taken)."""
        return len(self._in_prefill)

    @property
    def slots(self) -> int:
        """The slots this queue releases into: ``max_in_prefill`` less the leased ones."""
        return self.settings.max_in_prefill - self.leased

    def set_leased(self, slots: int) -> None:
        """Lend ``slots`` of ``max_in_prefill`` to admission elsewhere (capped at all of them);
        releases from this queue then stay within the rest."""
        if type(slots) is not int or slots < 0:
            raise ValueError(f"leased slots must be an int >= 0, got {slots!r}")
        self.leased = min(slots, self.settings.max_in_prefill)

    @property
    def fcfs(self) -> bool:
        """Whether requests pass in arrival order now (regime below, short queue)."""
        return self.regime == "below" and self.depth < self.settings.queue_threshold

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting or request_id in self._ordered

    # -- events --------------------------------------------------------------------------------

    def enqueue(
        self,
        request_id: str,
        user: str,
        bid: float,
        tokens: Sequence[int] | npt.NDArray[np.integer[Any]],
        now: float,
    ) -> None:
        """Queue a request. Raises ``QueueFull`` at ``max_queue``, ``ValueError`` for a bad
        bid, user or prompt (``auction.Request``'s checks) or an id already queued or in
        prefill."""
        if request_id in self or request_id in self._in_prefill:
            raise ValueError(f"request {request_id!r} is already admitted")
        request = Request(request_id, user, tokens, bid, arrival=self._arrivals)
        if self.depth >= self.settings.max_queue:
            raise QueueFull(
                f"the admission queue is full ({self.settings.max_queue} requests wait)"
            )
        self._arrivals += 1
        self._waiting[request_id] = _Queued(request, float(now))

    def cancel(self, request_id: str) -> bool:
        """Take a request out of the queue (its caller gave up); False if it was not queued.
        The others in its batch keep their positions."""
        if self._waiting.pop(request_id, None) is not None:
            return True
        return self._ordered.pop(request_id, None) is not None

    def slot_freed(self, request_id: str) -> None:
        """The request's prefill slot is free (first token, end, or failure); idempotent."""
        self._in_prefill.discard(request_id)

    def set_regime(self, regime: str) -> None:
        if regime not in REGIMES:
            raise ValueError(f"unknown regime {regime!r}; known: {', '.join(REGIMES)}")
        self.regime = regime

    # -- releasing -----------------------------------------------------------------------------

    def releasable(self, now: float) -> list[Release]:
        """What may leave now under the release rule, in order; each one takes a slot."""
        out: list[Release] = []
        while len(self._in_prefill) < self.slots:
            if self._ordered:
                release = self._ordered.pop(next(iter(self._ordered)))
            elif not self._waiting:
                break
            elif self.fcfs:
                queued = self._waiting.pop(next(iter(self._waiting)))
                release = Release(queued.request.id, 0, 0.0, None, "fcfs")
            elif self._batch_due(now):
                self._form_batch(now)
                continue
            else:
                break
            self._in_prefill.add(release.request_id)
            out.append(release)
        return out

    def next_deadline(self) -> float | None:
        """When the oldest request's batch window ends, if that is what the next release waits
        for (slots free, no batch pending, auction mode); else None: the next release then
        waits for an event (an arrival, a freed slot, a regime change)."""
        if (
            self._ordered
            or not self._waiting
            or self.fcfs
            or self.in_prefill >= self.slots
        ):
            return None
        return next(iter(self._waiting.values())).arrived + self.settings.batch_window_s

    def pop_batches(self) -> list[BatchOutcome]:
        """The batches formed since the last call (for events and metrics)."""
        formed, self._formed = self._formed, []
        return formed

    def _batch_due(self, now: float) -> bool:
        oldest = next(iter(self._waiting.values()))
        # The same sum as next_deadline's: a wake-up at that deadline must find the batch due
        # (now - arrived can round below the window and leave a caller waking forever).
        return (
            len(self._waiting) >= self.settings.batch_size
            or now >= oldest.arrived + self.settings.batch_window_s
        )

    def _form_batch(self, now: float) -> None:
        taken, _ = take_batch(
            list(self._waiting.values()), lambda q: q.request.bid, self.settings.batch_size
        )
        batch = [self._waiting.pop(q.request.id).request for q in taken]
        result = run_auction(
            batch, self.settings.scheduler, seed=batch_seed(self.seed, self.batches)
        )
        shares = split_payments(result.payments, batch)
        number = self.batches
        self.batches += 1
        batch_id = f"{self.batch_prefix}-{number}"
        index = {r.id: i for i, r in enumerate(batch)}
        names = sorted({r.user for r in batch})
        values = user_values(
            [index[rid] for rid in result.order],
            [r.bid for r in batch],
            np.array([names.index(r.user) for r in batch], dtype=np.int64),
        )
        for position, rid in enumerate(result.order, start=1):
            self._ordered[rid] = Release(rid, position, shares[rid], batch_id, "auction")
        self._formed.append(
            BatchOutcome(
                number=number,
                batch_id=batch_id,
                t=float(now),
                order=result.order,
                payments={u: float(p) for u, p in result.payments.items()},
                shares=shares,
                welfare=float(result.welfare),
                user_welfare={u: float(v) for u, v in zip(names, values, strict=False)},
            )
        )
