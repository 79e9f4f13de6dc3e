"""Dynamo's KV-event wire format: msgpack envelopes on ``namespace.<ns>.component.<c>.endpoint.
<e>.kv-events`` (docs/design.md §6, checked against ai-dynamo 1.6.1).

Envelope: ``{publisher_id, sequence, published_at, topic, payload}``; the payload holds Dynamo
``RouterEvent``s, ``{"worker_id": w, "event": {"event_id", "data", "dp_rank"}}``, one or a list,
msgpack-encoded again or inline. Simulated engines publish the same bytes, so one indexer serves
both backends. Decoding never raises: it returns the payload dicts for ``router.KvIndex`` (which
validates each one) and a reason when the envelope itself is unusable: ``too_large`` for more
than :data:`MAX_KV_MESSAGE_BYTES` (refused before unpacking), ``malformed`` for anything msgpack
cannot read (including nesting past its fixed stack) or an envelope without a payload.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import msgpack

MAX_KV_MESSAGE_BYTES = 1 << 20  # NATS's default max_payload, as for disagg events


def kv_subject(namespace: str, component: str = "backend", endpoint: str = "generate") -> str:
    return f"namespace.{namespace}.component.{component}.endpoint.{endpoint}.kv-events"


def encode_kv_events(
    events: Sequence[Mapping[str, object]],
    publisher_id: int,
    sequence: int,
    topic: str = "kv-events",
) -> bytes:
    """One envelope carrying ``events`` (flattened payloads as ``router.to_payload`` gives)."""
    router_events = [
        {
            "worker_id": e["worker_id"],
            "event": {"event_id": sequence * 1000 + i, "data": e["data"], "dp_rank": 0},
        }
        for i, e in enumerate(events)
    ]
    envelope = {
        "publisher_id": publisher_id,
        "sequence": sequence,
        "published_at": int(time.time() * 1000),
        "topic": topic,
        "payload": msgpack.packb(router_events),
    }
    return msgpack.packb(envelope)  # type: ignore[no-any-return]


def decode_kv_events(
    data: bytes,
) -> tuple[list[object], dict[str, object] | None, str | None]:
    """(router event payloads, envelope, reason the envelope was unusable or None)."""
    if len(data) > MAX_KV_MESSAGE_BYTES:
        return [], None, "too_large"
    try:
        envelope = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types on garbage
        return [], None, "malformed"
    if not isinstance(envelope, dict) or "payload" not in envelope:
        return [], None, "malformed"
    payload = envelope["payload"]
    if isinstance(payload, bytes | bytearray):
        try:
            payload = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception:
            return [], envelope, "malformed"
    events = payload if isinstance(payload, list) else [payload]
    return events, envelope, None
