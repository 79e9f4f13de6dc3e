"""Parsing KV events in Dynamo's shape from plain dicts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import Cleared, KvIndex, MalformedEventError, Removed, Stored, parse_kv_event


def test_router_event_shape() -> None:
    # Dynamo's RouterEvent {worker_id, event: KvCacheEvent {event_id, data, dp_rank}}.
    payload = {
        "worker_id": 7,
        "event": {
            "event_id": 3,
            "dp_rank": 0,
            "data": {
                "stored": {
                    "parent_hash": 11,
                    "blocks": [
                        {"block_hash": 12, "tokens_hash": 100, "mm_extra_info": None},
                        {"block_hash": 13, "tokens_hash": 101},
                    ],
                }
            },
        },
    }
    assert parse_kv_event(payload) == Stored(7, 11, ((12, 100), (13, 101)))


def test_flat_shape_and_variants() -> None:
    stored = {"worker_id": 1, "data": {"stored": {"parent_hash": None, "blocks": []}}}
    assert parse_kv_event(stored) == Stored(1, None, ())
    no_parent = {
        "worker_id": 1,
        "data": {"stored": {"blocks": [{"block_hash": 1, "tokens_hash": 2}]}},
    }
    assert parse_kv_event(no_parent) == Stored(1, None, ((1, 2),))
    removed = {"worker_id": 2, "data": {"removed": {"block_hashes": [5, 6]}}}
    assert parse_kv_event(removed) == Removed(2, (5, 6))
    assert parse_kv_event({"worker_id": 3, "data": "cleared"}) == Cleared(3)
    assert parse_kv_event({"worker_id": 3, "data": {"cleared": None}}) == Cleared(3)


def test_i64_hashes_keep_their_bits() -> None:
    removed = {"worker_id": 2, "data": {"removed": {"block_hashes": [-1, -(2**63)]}}}
    assert parse_kv_event(removed) == Removed(2, (2**64 - 1, 2**63))


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        "cleared",
        {},
        {"worker_id": 1},
        {"worker_id": -1, "data": "cleared"},
        {"worker_id": True, "data": "cleared"},
        {"worker_id": "1", "data": "cleared"},
        {"worker_id": 1, "data": "stored"},
        {"worker_id": 1, "data": {"evicted": {}}},
        {"worker_id": 1, "data": {"stored": {}, "removed": {}}},
        {"worker_id": 1, "data": {"stored": {"parent_hash": None}}},
        {"worker_id": 1, "data": {"stored": {"parent_hash": "x", "blocks": []}}},
        {"worker_id": 1, "data": {"stored": {"blocks": [{"block_hash": 1}]}}},
        {"worker_id": 1, "data": {"stored": {"blocks": [{"block_hash": 1.0, "tokens_hash": 2}]}}},
        {"worker_id": 1, "data": {"stored": {"blocks": [{"block_hash": 2**64, "tokens_hash": 2}]}}},
        {"worker_id": 1, "data": {"stored": {"blocks": {"block_hash": 1, "tokens_hash": 2}}}},
        {"worker_id": 1, "data": {"removed": {"block_hashes": 5}}},
        {"worker_id": 1, "data": {"removed": {"block_hashes": [None]}}},
        {"worker_id": 1, "event": {"data": None}},
        {"worker_id": 1, "event": []},
    ],
)
def test_malformed_payloads_raise_malformed_event_error(payload: object) -> None:
    with pytest.raises(MalformedEventError):
        parse_kv_event(payload)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "worker_id",
                    "event",
                    "data",
                    "stored",
                    "removed",
                    "cleared",
                    "parent_hash",
                    "blocks",
                    "block_hash",
                    "tokens_hash",
                    "block_hashes",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=150)
@given(JSONISH)
def test_arbitrary_payloads_never_raise_into_the_index_caller(payload: object) -> None:
    index = KvIndex()
    index.add_worker(0)
    index.add_worker(1)
    applied = index.apply_event(payload)  # anything but MalformedEventError would escape
    assert applied == (sum(index.applied.values()) == 1)
    assert applied != (sum(index.dropped.values()) >= 1) or index.dropped.keys() == {
        "unknown_block"
    }


def test_to_payload_is_the_inverse_of_parsing() -> None:
    from router.events import Cleared, Removed, Stored, parse_kv_event, to_payload

    for event in (
        Stored(4, None, ((11, 12), (13, 14))),
        Stored(4, 11, ((15, 16),)),
        Removed(9, (11, 13)),
        Cleared(2),
    ):
        assert parse_kv_event(to_payload(event)) == event
