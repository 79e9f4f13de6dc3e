"""The event contracts on NATS (docs/design.md §5): one strict pydantic model per subject.

Subjects are ``disagg.<ns>.route``, ``.complete``, ``.regime``, ``.auction``, ``.first_token``
and ``.pools``. Each event is a
:class:`~cluster.models.StrictModel` with a version field ``v``; on the wire every message also
carries ``publisher`` (an id that is new each time a publisher starts) and ``seq`` (1, 2, ... per
publisher and subject), so a subscriber can count what it missed (``cluster.sequence``).

Every field is bounded, so a message that validates is also one the consumers can afford: ids are
at most :data:`MAX_ID_CHARS` characters, lists at most :data:`MAX_ITEMS` long, numbers finite and
in range, counts consistent with each other (``n == len(order)``, ``cached <= prompt``). Nothing is
coerced: ``"abc"`` is not a list of ids, ``"nan"`` and ``true`` are not numbers, ``1.0`` is not an
integer.

The messages these events travel in, and how a message is refused, are ``cluster/wire.py``.

Python callers build events with keyword arguments; tuple fields take tuples (strict mode refuses
a list where a tuple is declared, exactly as it refuses ``"1"`` for ``1``).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from cluster.models import StrictModel
from controller.controller import RegimeChange
from games.join import CompletionRecord, RouteRecord
from games.poa import CandidateLoad
from router import Decision, Policy

VERSION = 1
KINDS = (
    "route", "complete", "regime", "auction", "first_token", "pools", "load", "engine_load",
)  # fmt: skip

MAX_ID_CHARS = 256  # request ids, users, publisher ids, auction order entries
MAX_LABEL_CHARS = 64  # regime names, statuses
MAX_REASON_CHARS = 1_024  # free-text reasons (pool re-splits): a sentence, not a document
MAX_ITEMS = 65_536  # auction order and payments; far above any batch the auction runs
MAX_CANDIDATES = 4_096  # workers in one routing decision
MAX_WORKER_ID = 2**64 - 1  # Dynamo worker ids are u64
MAX_COUNT = 2**63 - 1  # tokens, blocks, versions, batch ids, seq: what an i64 holds

Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
User = Annotated[str, Field(max_length=MAX_ID_CHARS)]  # "" is anonymous traffic
Label = Annotated[str, Field(max_length=MAX_LABEL_CHARS)]  # "" when the caller has none
WorkerId = Annotated[int, Field(ge=0, le=MAX_WORKER_ID)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
# Strict floats accept JSON integers (2 is a fine time) but never strings, booleans, NaN or inf.
Seconds = Annotated[float, Field(ge=0.0)]
NonNegative = Annotated[float, Field(ge=0.0)]
Finite = float  # allow_inf_nan=False on the base already refuses NaN and ±inf
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Version = Annotated[int, Field(ge=VERSION, le=VERSION)]


def subject(namespace: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(KINDS)}")
    if not namespace or any(c in namespace for c in ".*> \t\r\n"):
        raise ValueError(f"namespace must be a plain NATS token, got {namespace!r}")
    return f"disagg.{namespace}.{kind}"


class EventModel(StrictModel):
    """The common base: the version ``v`` (docs/design.md §5) and the subject kind."""

    kind: ClassVar[str]
    v: Version = VERSION


class Candidate(StrictModel):
    """One worker's line of a routing decision's breakdown (``router.CandidateCost``, plus the
    prefill tokens active on the worker before this request: the queue the PoA model reads,
    which ``prefill_blocks`` = (active + uncached) / block size holds only with the block size)."""

    worker_id: WorkerId
    overlap_blocks: Count
    uncached_tokens: Count
    active_prefill_tokens: Count
    prefill_blocks: NonNegative
    decode_blocks: Count
    cost: Finite
    probability: Probability


def _candidates(decision: Decision) -> tuple[Candidate, ...]:
    """A ``router.Decision``'s breakdown; numpy scalars become plain ints and floats here."""
    return tuple(
        Candidate(
            worker_id=operator.index(c.worker),
            overlap_blocks=operator.index(c.overlap_blocks),
            uncached_tokens=operator.index(c.uncached_tokens),
            active_prefill_tokens=operator.index(active),
            prefill_blocks=float(c.prefill_blocks),
            decode_blocks=operator.index(c.decode_blocks),
            cost=float(c.cost),
            probability=float(c.probability),
        )
        for c, active in zip(decision.candidates, decision.active_prefill_tokens, strict=True)
    )


def _lines(candidates: Iterable[Candidate]) -> dict[int, CandidateLoad]:
    """The PoA model's features of each candidate (games/poa.py)."""
    return {
        c.worker_id: CandidateLoad(c.uncached_tokens, c.active_prefill_tokens, c.decode_blocks)
        for c in candidates
    }


def _one_line_each(worker_id: int, candidates: tuple[Candidate, ...]) -> None:
    # to_record keys u(r, w) by worker: a repeated worker would silently lose a line.
    ids = [c.worker_id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidates name a worker more than once")
    if ids and worker_id not in ids:
        raise ValueError(f"worker_id {worker_id} is not among the candidates")


class PrefillRoute(StrictModel):
    """The prefill router's decision for a request a prefill worker runs: the worker and its
    breakdown (absent when the decode worker prefills locally, or the engines route prefill
    themselves, as Dynamo's frontend does)."""

    worker_id: WorkerId
    candidates: Annotated[tuple[Candidate, ...], Field(max_length=MAX_CANDIDATES)]

    @model_validator(mode="after")
    def _consistent(self) -> PrefillRoute:
        _one_line_each(self.worker_id, self.candidates)
        return self


class RouteEvent(EventModel):
    kind: ClassVar[str] = "route"
    request_id: Id
    t: Seconds
    user: User
    worker_id: WorkerId  # the decode worker
    candidates: Annotated[tuple[Candidate, ...], Field(max_length=MAX_CANDIDATES)]
    tau: NonNegative
    omega: NonNegative
    regime: Label
    policy_version: Count
    prefill: PrefillRoute | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RouteEvent:
        _one_line_each(self.worker_id, self.candidates)
        return self

    @classmethod
    def from_decision(
        cls,
        decision: Decision,
        t: float,
        user: str,
        regime: str,
        prefill: Decision | None = None,
    ) -> RouteEvent:
        """From the decode router's ``router.Decision`` and, when a prefill worker was chosen,
        the prefill router's."""
        return cls(
            request_id=decision.request_id,
            t=float(t),
            user=user,
            worker_id=operator.index(decision.worker),
            candidates=_candidates(decision),
            tau=float(decision.tau),
            omega=float(decision.omega),
            regime=regime,
            policy_version=operator.index(decision.policy_version),
            prefill=None
            if prefill is None
            else PrefillRoute(
                worker_id=operator.index(prefill.worker), candidates=_candidates(prefill)
            ),
        )

    def to_record(self) -> RouteRecord:
        """The joiner's route half: every candidate's uncached tokens, active prefill tokens and
        decode blocks, the PoA model's features (games/poa.py), for each router that chose."""
        prefill = self.prefill
        return RouteRecord(
            self.request_id,
            self.t,
            self.worker_id,
            _lines(self.candidates),
            None if prefill is None else prefill.worker_id,
            None if prefill is None else _lines(prefill.candidates),
        )


class CompleteEvent(EventModel):
    kind: ClassVar[str] = "complete"
    request_id: Id
    t: Seconds
    worker_id: WorkerId
    prefill_worker_id: WorkerId | None
    ttft_s: Seconds
    itl_s: Seconds
    e2e_s: Seconds
    prompt_tokens: Count
    cached_tokens: Count
    output_tokens: Count
    status: Label

    @model_validator(mode="after")
    def _consistent(self) -> CompleteEvent:
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError(
                f"cached_tokens {self.cached_tokens} > prompt_tokens {self.prompt_tokens}"
            )
        return self

    def to_record(self) -> CompletionRecord:
        return CompletionRecord(
            self.request_id, self.t, self.worker_id, self.ttft_s, self.status,
            self.prefill_worker_id,
        )  # fmt: skip


class RegimeEvent(EventModel):
    kind: ClassVar[str] = "regime"
    t: Seconds
    regime: Label
    tau: NonNegative
    omega: NonNegative
    ttft_p99_smoothed_s: Seconds
    # The version the controller gave (τ, ω): an ingress replica applies a policy only when it
    # is newer than the one it routes with (0: a publisher that does not say).
    policy_version: Count = 0

    @classmethod
    def from_change(cls, change: RegimeChange) -> RegimeEvent:
        """From a ``controller.RegimeChange``."""
        return cls(
            t=float(change.t),
            regime=change.regime.label,
            tau=float(change.tau),
            omega=float(change.omega),
            ttft_p99_smoothed_s=float(change.ttft_p99_smoothed_s),
            policy_version=int(getattr(change, "version", 0)),
        )

    def policy(self) -> Policy:
        """The policy this event carries, as every router takes it."""
        return Policy(self.tau, self.omega, self.policy_version, self.regime)


class AuctionEvent(EventModel):
    kind: ClassVar[str] = "auction"
    batch_id: Count
    t: Seconds
    n: Count
    order: Annotated[tuple[Id, ...], Field(max_length=MAX_ITEMS)]
    payments: Annotated[dict[Id, NonNegative], Field(max_length=MAX_ITEMS)] = Field(
        default_factory=dict
    )
    welfare: Finite = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> AuctionEvent:
        # n is the batch size and the order is the whole batch's order: they must agree, and
        # an order that names a request twice is not an order.
        if self.n != len(self.order):
            raise ValueError(f"n = {self.n} but the order holds {len(self.order)} requests")
        if len(set(self.order)) != len(self.order):
            raise ValueError("the order names a request more than once")
        return self


class FirstTokenEvent(EventModel):
    """A request's first token, published by the ingress the moment it streams it.

    TTFT is known here, long before the ``complete`` event: the detector and the PoA window take
    it from this event (docs/design.md §3 property 2, "Timely"; §5).
    """

    kind: ClassVar[str] = "first_token"
    request_id: Id
    t: Seconds
    worker_id: WorkerId  # the decode worker, as in the route event
    prefill_worker_id: WorkerId | None = None  # None: prefilled on the decode worker
    ttft_s: Seconds

    def to_record(self) -> CompletionRecord:
        # The joiner's completion half: TTFT is all the PoA estimator needs of a completion, and
        # a request that produced a token is not a failure.
        return CompletionRecord(
            self.request_id, self.t, self.worker_id, self.ttft_s, "ok", self.prefill_worker_id
        )


# "abandoned": a re-split given up (its drain timed out); "cancelled": called off while its worker
# drained (the overload was over). Either way the worker serves its old role again.
PoolAction = Literal["resplit_start", "drained", "warm", "abandoned", "cancelled"]
WorkerIds = Annotated[tuple[WorkerId, ...], Field(max_length=MAX_CANDIDATES)]


class PoolsEvent(EventModel):
    """The prefill/decode pools after a step of a re-split (docs/design.md §4 "Two levers")."""

    kind: ClassVar[str] = "pools"
    t: Seconds
    prefill_workers: WorkerIds
    decode_workers: WorkerIds
    action: PoolAction
    reason: Annotated[str, Field(max_length=MAX_REASON_CHARS)] = ""

    @model_validator(mode="after")
    def _consistent(self) -> PoolsEvent:
        # A worker serves one role at a time: listed twice, the pool sizes would be wrong.
        workers = self.prefill_workers + self.decode_workers
        if len(set(workers)) != len(workers):
            raise ValueError("a worker is listed more than once across the pools")
        return self


MAX_TTL_S = 60.0


class WorkerLoad(StrictModel):
    """What one replica's in-flight requests hold on one worker (``router.LoadView``), and how
    many it has routed there so far."""

    worker_id: WorkerId
    prefill_tokens: Count
    decode_blocks: Count
    requests: Count
    routed: Count = 0


WorkerLoads = Annotated[tuple[WorkerLoad, ...], Field(max_length=MAX_CANDIDATES)]


class LoadEvent(EventModel):
    """An ingress replica's absolute load report (docs/design.md "Data flow"): every worker of
    each pool, valid for ``ttl_s`` after it arrives. The other replicas add it to their view;
    the router actor sums the reports into the fleet's view (``stats``)."""

    kind: ClassVar[str] = "load"
    replica: Id
    t: Seconds
    ttl_s: Annotated[float, Field(gt=0.0, le=MAX_TTL_S)]
    prefill: WorkerLoads
    decode: WorkerLoads
    routed: Count
    retries: Count

    @model_validator(mode="after")
    def _consistent(self) -> LoadEvent:
        for role in ("prefill", "decode"):
            ids = [w.worker_id for w in getattr(self, role)]
            if len(set(ids)) != len(ids):
                raise ValueError(f"{role} names a worker more than once")
        return self


class EngineLoadEvent(EventModel):
    """One worker's load as its engine holds it (docs/design.md "Data flow"): the requests it
    runs or queues and what they hold, valid for ``ttl_s`` after it arrives. The replicas' own
    bookkeeping cannot see requests whose router is gone (a killed replica's keep running); this
    snapshot can, and corrects their views."""

    kind: ClassVar[str] = "engine_load"
    worker_id: WorkerId
    role: Literal["prefill", "decode"]
    t: Seconds
    ttl_s: Annotated[float, Field(gt=0.0, le=MAX_TTL_S)]
    prefill_tokens: Count
    decode_blocks: Count
    requests: Count


Event = (
    RouteEvent
    | CompleteEvent
    | RegimeEvent
    | AuctionEvent
    | FirstTokenEvent
    | PoolsEvent
    | LoadEvent
    | EngineLoadEvent
)
MODELS: dict[str, type[EventModel]] = {
    m.kind: m
    for m in (
        RouteEvent,
        CompleteEvent,
        RegimeEvent,
        AuctionEvent,
        FirstTokenEvent,
        PoolsEvent,
        LoadEvent,
        EngineLoadEvent,
    )
}
assert tuple(MODELS) == KINDS  # one model per subject, in the order subject() lists them
