"""KV events in Dynamo's shape, parsed from plain dicts into typed records (docs/design.md §5, §6).

Accepted payloads (msgpack/JSON already decoded by the caller):

- Dynamo's ``RouterEvent``: ``{"worker_id": w, "event": {"event_id": n, "data": D, "dp_rank": r}}``
- the flattened form: ``{"worker_id": w, "data": D}``

with ``D`` one of ``{"stored": {"parent_hash": p | None, "blocks": [{"block_hash": b,
"tokens_hash": t}, ...]}}``, ``{"removed": {"block_hashes": [b, ...]}}``, ``"cleared"`` or
``{"cleared": ...}`` (serde's two spellings of a unit variant). Extra fields (``event_id``,
``mm_extra_info``, ...) are ignored; ``dp_rank`` is ignored too, so the data-parallel ranks of
one worker share its state.

Hashes are u64; engines that speak i64 (Dynamo accepts both, reinterpreting the bits) are
mapped onto the same u64.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from router.hashing import U64_MASK

_I64_MIN: Final = -(1 << 63)


class MalformedEventError(ValueError):
    """A KV event payload that does not have Dynamo's shape."""


@dataclass(frozen=True, slots=True)
class Stored:
    """``blocks`` are (block_hash, tokens_hash) pairs, parent first."""

    worker: int
    parent_hash: int | None
    blocks: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Removed:
    worker: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    worker: int


KvEvent = Stored | Removed | Cleared


def parse_hash(value: object, what: str) -> int:
    """A u64 hash from the wire; i64 values keep their bits."""
    if type(value) is not int or not _I64_MIN <= value <= U64_MASK:
        raise MalformedEventError(f"{what} must be a 64-bit integer, got {value!r}")
    return value & U64_MASK


def parse_worker_id(value: object) -> int:
    if type(value) is not int or not 0 <= value <= U64_MASK:
        raise MalformedEventError(f"worker_id must be a u64, got {value!r}")
    return value


def _field(mapping: Mapping[object, object], key: str) -> object:
    if key not in mapping:
        raise MalformedEventError(f"missing {key!r}")
    return mapping[key]


def _as_mapping(value: object, what: str) -> Mapping[object, object]:
    if not isinstance(value, Mapping):
        raise MalformedEventError(f"{what} must be a mapping, got {type(value).__name__}")
    return value


def _as_list(value: object, what: str) -> list[object] | tuple[object, ...]:
    if not isinstance(value, list | tuple):
        raise MalformedEventError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _parse_stored(worker: int, body: object) -> Stored:
    store = _as_mapping(body, "stored")
    raw_parent = store.get("parent_hash")
    parent = None if raw_parent is None else parse_hash(raw_parent, "parent_hash")
    blocks: list[tuple[int, int]] = []
    for raw in _as_list(_field(store, "blocks"), "blocks"):
        block = _as_mapping(raw, "block")
        blocks.append(
            (
                parse_hash(_field(block, "block_hash"), "block_hash"),
                parse_hash(_field(block, "tokens_hash"), "tokens_hash"),
            )
        )
    return Stored(worker, parent, tuple(blocks))


def _parse_removed(worker: int, body: object) -> Removed:
    removed = _as_mapping(body, "removed")
    hashes = _as_list(_field(removed, "block_hashes"), "block_hashes")
    return Removed(worker, tuple(parse_hash(h, "block_hash") for h in hashes))


def parse_kv_event(payload: object) -> KvEvent:
    """The typed event in ``payload``; raises MalformedEventError for anything else."""
    outer = _as_mapping(payload, "event")
    worker = parse_worker_id(_field(outer, "worker_id"))
    if "event" in outer:
        data = _field(_as_mapping(outer["event"], "event"), "data")
    else:
        data = _field(outer, "data")
    if isinstance(data, str):
        if data == "cleared":
            return Cleared(worker)
        raise MalformedEventError(f"unknown event type {data!r}")
    variants = _as_mapping(data, "data")
    if len(variants) != 1:
        raise MalformedEventError(f"data must hold exactly one variant, got {list(variants)}")
    ((kind, body),) = variants.items()
    if kind == "stored":
        return _parse_stored(worker, body)
    if kind == "removed":
        return _parse_removed(worker, body)
    if kind == "cleared":
        return Cleared(worker)
    raise MalformedEventError(f"unknown event type {kind!r}")


def to_payload(event: KvEvent) -> dict[str, object]:
    """The flattened Dynamo payload of a typed event (the inverse of ``parse_kv_event``)."""
    data: object
    if isinstance(event, Stored):
        blocks = [{"block_hash": b, "tokens_hash": t} for b, t in event.blocks]
        data = {"stored": {"parent_hash": event.parent_hash, "blocks": blocks}}
    elif isinstance(event, Removed):
        data = {"removed": {"block_hashes": list(event.block_hashes)}}
    else:
        data = "cleared"
    return {"worker_id": event.worker, "data": data}
