"""The event contracts on NATS (docs/design.md §5): one JSON model per subject, each with a version ``v``.

Subjects are ``disagg.<ns>.route``, ``.complete``, ``.regime`` and ``.auction``. Every message also
carries ``publisher`` (an id that is new each time a publisher starts) and ``seq`` (1, 2, ...
per publisher and subject), so a subscriber can count what it missed. ``decode`` never trusts the
wire: anything that does not fit its model raises ``MalformedEventError`` with a reason the bus
counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from games.join import CompletionRecord, RouteRecord

VERSION = 1
KINDS = ("route", "complete", "regime", "auction")


class MalformedEventError(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def subject(namespace: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(KINDS)}")
    if not namespace or any(c in namespace for c in ".*> "):
        raise ValueError(f"namespace must be a plain NATS token, got {namespace!r}")
    return f"disagg.{namespace}.{kind}"


@dataclass(frozen=True)
class Candidate:
    worker_id: int
    overlap_blocks: int
    uncached_tokens: int
    prefill_blocks: float
    decode_blocks: int
    cost: float
    probability: float


@dataclass(frozen=True)
class RouteEvent:
    kind: ClassVar[str] = "route"
    request_id: str
    t: float
    user: str
    worker_id: int
    candidates: tuple[Candidate, ...]
    tau: float
    omega: float
    regime: str
    policy_version: int

    @classmethod
    def from_decision(cls, decision: Any, t: float, user: str, regime: str) -> RouteEvent:
        """From a ``router.Decision``."""
        return cls(
            request_id=decision.request_id,
            t=t,
            user=user,
            worker_id=decision.worker,
            candidates=tuple(
                Candidate(
                    c.worker,
                    c.overlap_blocks,
                    c.uncached_tokens,
                    c.prefill_blocks,
                    c.decode_blocks,
                    c.cost,
                    c.probability,
                )
                for c in decision.candidates
            ),
            tau=decision.tau,
            omega=decision.omega,
            regime=regime,
            policy_version=decision.policy_version,
        )

    def to_record(self) -> RouteRecord:
        uncached = {c.worker_id: c.uncached_tokens for c in self.candidates}
        return RouteRecord(self.request_id, self.t, self.worker_id, uncached)


@dataclass(frozen=True)
class CompleteEvent:
    kind: ClassVar[str] = "complete"
    request_id: str
    t: float
    worker_id: int
    prefill_worker_id: int | None
    ttft_s: float
    itl_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    status: str

    def to_record(self) -> CompletionRecord:
        return CompletionRecord(self.request_id, self.t, self.worker_id, self.ttft_s, self.status)


@dataclass(frozen=True)
class RegimeEvent:
    kind: ClassVar[str] = "regime"
    t: float
    regime: str
    tau: float
    omega: float
    ttft_p99_smoothed_s: float

    @classmethod
    def from_change(cls, change: Any) -> RegimeEvent:
        """From a ``controller.RegimeChange``."""
        return cls(
            change.t, change.regime.label, change.tau, change.omega, change.ttft_p99_smoothed_s
        )


@dataclass(frozen=True)
class AuctionEvent:
    kind: ClassVar[str] = "auction"
    batch_id: int
    t: float
    n: int
    order: tuple[str, ...]
    payments: dict[str, float] = field(default_factory=dict)
    welfare: float = 0.0


Event = RouteEvent | CompleteEvent | RegimeEvent | AuctionEvent
MODELS: dict[str, type[Any]] = {
    m.kind: m for m in (RouteEvent, CompleteEvent, RegimeEvent, AuctionEvent)
}


def encode(event: Event, publisher: str, seq: int) -> bytes:
    body = asdict(event)
    return json.dumps({"v": VERSION, "publisher": publisher, "seq": seq, **body}).encode()


def decode(kind: str, data: bytes) -> tuple[Event, str, int]:
    """(event, publisher, seq) from a message on the ``kind`` subject."""
    model = MODELS.get(kind)
    if model is None:
        raise MalformedEventError("unknown_subject", kind)
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedEventError("malformed", f"not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise MalformedEventError("malformed", "not a JSON object")
    if raw.get("v") != VERSION:
        raise MalformedEventError("version", f"expected v={VERSION}, got {raw.get('v')!r}")
    publisher, seq = raw.get("publisher"), raw.get("seq")
    if not isinstance(publisher, str) or type(seq) is not int or seq < 1:
        raise MalformedEventError("malformed", "missing publisher or seq")
    values = {}
    for spec in fields(model):
        if spec.name not in raw:
            raise MalformedEventError("malformed", f"{kind}: missing {spec.name}")
        values[spec.name] = raw[spec.name]
    try:
        event = _typed(model, values)
    except (TypeError, ValueError) as exc:
        raise MalformedEventError("malformed", f"{kind}: {exc}") from None
    return event, publisher, seq


def _candidate(raw: dict[str, Any]) -> Candidate:
    for key in ("worker_id", "overlap_blocks", "uncached_tokens", "decode_blocks"):
        if type(raw.get(key)) is not int or raw[key] < 0:
            raise ValueError(f"candidate {key} must be a non-negative integer")
    for key in ("prefill_blocks", "cost", "probability"):
        value = raw.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"candidate {key} must be a finite number")
    return Candidate(**raw)


def _typed(model: type[Any], values: dict[str, Any]) -> Event:
    for key in ("t", "ttft_s", "itl_s", "e2e_s", "tau", "omega", "welfare", "ttft_p99_smoothed_s"):
        if key in values:
            value = values[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number")
            if not math.isfinite(value):
                raise ValueError(f"{key} must be finite")
            values[key] = float(value)
    for key in ("request_id", "user", "regime", "status"):
        if key in values and not isinstance(values[key], str):
            raise ValueError(f"{key} must be a string")
    for key in (
        "worker_id",
        "policy_version",
        "prompt_tokens",
        "cached_tokens",
        "output_tokens",
        "batch_id",
        "n",
    ):
        if key in values and (type(values[key]) is not int):
            raise ValueError(f"{key} must be an integer")
    if model is RouteEvent:
        candidates = values["candidates"]
        if not isinstance(candidates, list) or not all(isinstance(c, dict) for c in candidates):
            raise ValueError("candidates must be a list of objects")
        values["candidates"] = tuple(_candidate(c) for c in candidates)
    if model is CompleteEvent:
        p = values["prefill_worker_id"]
        if p is not None and type(p) is not int:
            raise ValueError("prefill_worker_id must be an integer or null")
    if model is AuctionEvent:
        values["order"] = tuple(str(x) for x in values["order"])
        values["payments"] = {str(k): float(v) for k, v in dict(values["payments"]).items()}
    return model(**values)  # type: ignore[no-any-return]


def completion_event(record: Any) -> CompleteEvent:
    """The ``complete`` event of a finished ``cluster.sim.records.RequestRecord``."""
    return CompleteEvent(
        request_id=record.request_id,
        t=record.finished,
        worker_id=record.decode_worker,
        prefill_worker_id=record.prefill_worker,
        ttft_s=record.ttft,
        itl_s=record.mean_itl or 0.0,
        e2e_s=record.e2e,
        prompt_tokens=record.prompt_tokens,
        cached_tokens=record.cached_tokens,
        output_tokens=record.output_tokens,
        status=record.status,
    )


def run_events(records: Iterable[Any], regime: str = "below") -> list[Event]:
    """Route and completion events of a simulated run, in the order they happened."""
    timed: list[tuple[float, Event]] = []
    for record in records:
        if record.decision is not None and record.routed is not None:
            route = RouteEvent.from_decision(record.decision, record.routed, record.user, regime)
            timed.append((record.routed, route))
        if record.finished is not None:
            timed.append((record.finished, completion_event(record)))
    timed.sort(key=lambda pair: pair[0])
    return [event for _, event in timed]
