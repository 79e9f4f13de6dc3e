"""The wire: the messages events travel in on NATS, and how a message is refused (docs/design.md
§5).

Every message carries ``v``, ``publisher`` (an id that is new each time a publisher starts) and
``seq`` (1, 2, ... per publisher and subject), so a subscriber can count what it missed
(``cluster.sequence``). The control plane's events (``regime``, ``auction``, ``pools``) go one per
message, the event's fields beside those three. The data plane's (:data:`BATCHED`: ``route``,
``first_token``, ``complete``, ``load``, ``engine_load``) go in batches: ``{"v", "publisher",
"seq", "events": [...]}``, one message per publisher and subject every few tens of milliseconds
(``cluster.actor_bus.ActorBus``), validated once per message, at most
:data:`MAX_BATCH_EVENTS` events and :data:`MAX_MESSAGE_BYTES` bytes, one ``seq`` per batch.

:func:`decode_all` never trusts the wire and never lets anything but :class:`MalformedEventError`
out: a message over :data:`MAX_MESSAGE_BYTES` is refused before a byte of it is parsed (so its size
cannot cost memory or time), and bad UTF-8, bad JSON, nesting too deep, wrong types, unknown keys
and values out of range each become one of the :data:`DROP_REASONS` the bus counts in
``disagg_events_dropped_total{reason}``. A batch is refused whole: one bad event in it means a
publisher that does not speak this contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field, ValidationError, create_model

from cluster.events import (
    KINDS,
    MAX_LABEL_CHARS,
    MODELS,
    Count,
    Event,
    EventModel,
    Id,
    Version,
)
from cluster.models import StrictModel

__all__ = [
    "BATCHED", "BATCH_ORDER", "DROP_REASONS", "MAX_BATCH_EVENTS", "MAX_MESSAGE_BYTES",
    "MalformedEventError", "decode", "decode_all", "encode", "encode_batch",
]  # fmt: skip

# The data plane's subjects, in the order one period's batches leave (a request's route before
# its first token before its completion: the order its events were published in).
BATCH_ORDER = ("route", "first_token", "complete", "load", "engine_load")
BATCHED = frozenset(BATCH_ORDER)
MAX_BATCH_EVENTS = 512  # a period's events from one publisher; a full one is sent at once

MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB: NATS's default max_payload, so nothing larger is sendable

# Every label ``disagg_events_dropped_total{reason}`` may carry: a fixed set, so a hostile or
# buggy peer cannot grow the metric's cardinality.
DROP_REASONS = frozenset(
    {
        "too_large",  # over MAX_MESSAGE_BYTES, refused unread (or not sent)
        "malformed",  # not UTF-8, not JSON, nested too deep, not an object
        "schema",  # JSON, but not this subject's model (types, ranges, keys, consistency)
        "version",  # a ``v`` this build does not speak
        "unknown_subject",
        "duplicate",  # a seq already delivered (cluster.sequence)
        "gap",  # messages a subscriber can prove it missed
        "handler_error",  # the subscriber's callback raised; the next message still flows
        "buffer_full",  # published during an outage with the outbound buffer full
        "publish_error",  # the client refused a message while connected
        "closed",  # still buffered when the bus was closed
        "kv_malformed",  # an undecodable Dynamo KV envelope
        "kv_too_large",
        # Well-formed, impossible for the deployment (cluster/plausibility.py):
        "implausible_unrouted",  # a first token for a request no route announced
        "implausible_worker",  # a worker id outside the deployment
        "implausible_time",  # a future time, or a TTFT the request's times rule out
        "implausible_idle",  # a long TTFT while the engines said every worker was idle
    }
)


class MalformedEventError(ValueError):
    """A message refused at the edge; ``reason`` is one of :data:`DROP_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in DROP_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _message_model(model: type[EventModel]) -> type[StrictModel]:
    # The wire shape of a subject: the event (or a batch of them) plus who sent it and its
    # number. ``v`` is required on the wire even though Python callers may leave it to its
    # default.
    # Any: pydantic's create_model field definitions, (type, default) pairs of any type.
    envelope: dict[str, Any] = {"v": (Version, ...), "publisher": (Id, ...), "seq": (Count, ...)}
    if model.kind in BATCHED:
        events = Annotated[
            tuple[model, ...],  # type: ignore[valid-type]
            Field(min_length=1, max_length=MAX_BATCH_EVENTS),
        ]
        return create_model(f"{model.__name__}Batch", __base__=StrictModel,
                            events=(events, ...), **envelope)  # fmt: skip
    return create_model(f"{model.__name__}Message", __base__=model, **envelope)


_MESSAGES: dict[str, type[StrictModel]] = {kind: _message_model(m) for kind, m in MODELS.items()}
assert set(KINDS) >= BATCHED


def encode(event: Event, publisher: str, seq: int) -> bytes:
    """The JSON message of ``event`` (a batch of one on a batched subject); validated by the
    same model :func:`decode_all` uses."""
    if event.kind in BATCHED:
        return encode_batch([event], publisher, seq)
    body = {name: getattr(event, name) for name in type(event).model_fields}
    message = _MESSAGES[event.kind].model_validate({**body, "publisher": publisher, "seq": seq})
    return message.model_dump_json().encode()


def encode_batch(events: Sequence[Event], publisher: str, seq: int) -> bytes:
    """One message of 1 to :data:`MAX_BATCH_EVENTS` events of one batched kind."""
    kinds = {e.kind for e in events}
    if len(kinds) != 1 or not kinds <= BATCHED:
        raise ValueError(f"a batch holds events of one batched kind ({sorted(BATCHED)})")
    (kind,) = kinds
    message = _MESSAGES[kind].model_validate(
        {"v": events[0].v, "publisher": publisher, "seq": seq, "events": tuple(events)}
    )
    return message.model_dump_json().encode()


def decode(kind: str, data: bytes | bytearray | memoryview) -> tuple[Event, str, int]:
    """(event, publisher, seq) of a message holding one event (a batch of one on a batched
    subject); :class:`MalformedEventError` otherwise."""
    events, publisher, seq = decode_all(kind, data)
    if len(events) != 1:
        raise MalformedEventError("schema", f"{kind}: a batch of {len(events)}, not one event")
    return events[0], publisher, seq


def decode_all(
    kind: str, data: bytes | bytearray | memoryview
) -> tuple[tuple[Event, ...], str, int]:
    """(events, publisher, seq) from a message on the ``kind`` subject (module docstring).

    Raises :class:`MalformedEventError` and nothing else, whatever ``data`` holds.
    """
    message = _MESSAGES.get(kind)
    if message is None:
        raise MalformedEventError("unknown_subject", repr(kind)[:MAX_LABEL_CHARS])
    size = len(data)  # before any parsing: a huge message costs nothing to refuse
    if size > MAX_MESSAGE_BYTES:
        raise MalformedEventError("too_large", f"{size} bytes > {MAX_MESSAGE_BYTES}")
    try:
        parsed: Any = message.model_validate_json(bytes(data))  # the subject's own model
    except ValidationError as exc:
        raise MalformedEventError(_reason(exc), _detail(kind, exc)) from None
    except (RecursionError, ValueError, UnicodeError, MemoryError) as exc:
        # pydantic's parser reports depth and encoding as ValidationError; these are the
        # belt to its braces, should a parser version ever raise them directly.
        raise MalformedEventError("malformed", f"{kind}: {type(exc).__name__}") from None
    if kind in BATCHED:
        return tuple(parsed.events), parsed.publisher, parsed.seq
    model = MODELS[kind]
    # Already validated as a whole; build the plain event without validating it twice.
    event = model.model_construct(**{name: getattr(parsed, name) for name in model.model_fields})
    return (event,), parsed.publisher, parsed.seq  # type: ignore[return-value]


def _reason(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    if any(e["type"] in ("json_invalid", "json_type") for e in errors):
        return "malformed"
    if any(e["type"] == "model_type" and not e["loc"] for e in errors):
        return "malformed"  # valid JSON, but not an object
    if any(tuple(e["loc"][:1]) == ("v",) for e in errors):
        return "version"
    return "schema"


def _detail(kind: str, exc: ValidationError, shown: int = 3) -> str:
    # A hostile message can fail on thousands of fields; the log line names a few.
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in errors[:shown]
    ]
    more = f" (and {len(errors) - shown} more)" if len(errors) > shown else ""
    return f"{kind}: " + "; ".join(parts) + more
