"""The event contracts (docs/design.md §5): strict models, bounded sizes, a decoder that refuses
anything off-contract with a counted reason and lets nothing else escape."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from cluster.events import (
    MAX_CANDIDATES,
    MAX_ID_CHARS,
    MAX_ITEMS,
    MAX_REASON_CHARS,
    AuctionEvent,
    Candidate,
    CompleteEvent,
    EngineLoadEvent,
    FirstTokenEvent,
    LoadEvent,
    PoolsEvent,
    PrefillRoute,
    RegimeEvent,
    RouteEvent,
    WorkerLoad,
    subject,
)
from cluster.wire import (
    BATCHED,
    DROP_REASONS,
    MAX_BATCH_EVENTS,
    MAX_MESSAGE_BYTES,
    MalformedEventError,
    decode,
    decode_all,
    encode,
    encode_batch,
)
from games.join import EventJoiner
from games.poa import CandidateLoad

CANDIDATE = Candidate(
    worker_id=3,
    overlap_blocks=2,
    uncached_tokens=16,
    active_prefill_tokens=48,
    prefill_blocks=4.0,
    decode_blocks=4,
    cost=5.0,
    probability=1.0,
)
ROUTE = RouteEvent(
    request_id="r1",
    t=1.5,
    user="alice",
    worker_id=3,
    candidates=(CANDIDATE,),
    tau=0.0,
    omega=1.0,
    regime="below",
    policy_version=7,
)
COMPLETE = CompleteEvent(
    request_id="r1",
    t=2.0,
    worker_id=3,
    prefill_worker_id=0,
    ttft_s=0.12,
    itl_s=0.011,
    e2e_s=3.0,
    prompt_tokens=128,
    cached_tokens=64,
    output_tokens=256,
    status="ok",
)
REGIME = RegimeEvent(t=3.0, regime="saturated", tau=0.8, omega=0.1, ttft_p99_smoothed_s=10.2)
AUCTION = AuctionEvent(
    batch_id=4, t=5.0, n=2, order=("a", "b"), payments={"alice": 1.5}, welfare=4.5
)
FIRST_TOKEN = FirstTokenEvent(request_id="r1", t=1.7, worker_id=3, prefill_worker_id=0, ttft_s=0.2)
POOLS = PoolsEvent(
    t=9.0, prefill_workers=(0, 1), decode_workers=(2, 3), action="resplit_start", reason="capacity"
)
LOAD = LoadEvent(
    replica="ingress-a", t=3.0, ttl_s=1.0, routed=5, retries=0,
    prefill=(WorkerLoad(worker_id=0, prefill_tokens=320, decode_blocks=20, requests=1),),
    decode=(WorkerLoad(worker_id=1, prefill_tokens=0, decode_blocks=20, requests=1, routed=5),),
)  # fmt: skip
ENGINE_LOAD = EngineLoadEvent(
    worker_id=1, role="decode", t=3.0, ttl_s=1.0, prefill_tokens=16, decode_blocks=42, requests=3
)


def _wire(event, **changes) -> bytes:
    """``event``'s message with ``changes``: an event's own fields changed in it (inside the
    batch on a batched subject), anything else on the message."""
    raw = json.loads(encode(event, "p1", 1))
    inner = raw["events"][0] if event.kind in BATCHED else raw
    for key, value in changes.items():
        (inner if key in type(event).model_fields and key != "v" else raw)[key] = value
    return json.dumps(raw).encode()


def _reason(kind: str, data: bytes) -> str:
    with pytest.raises(MalformedEventError) as err:
        decode(kind, data)
    assert err.value.reason in DROP_REASONS
    return err.value.reason


@pytest.mark.parametrize("event", [ROUTE, COMPLETE, REGIME, AUCTION, FIRST_TOKEN, POOLS])
def test_round_trip(event) -> None:
    decoded, publisher, seq = decode(event.kind, encode(event, "p1", 9))
    assert decoded == event and type(decoded) is type(event) and (publisher, seq) == ("p1", 9)


def test_route_event_becomes_a_join_record() -> None:
    record = ROUTE.to_record()
    assert (record.worker, dict(record.candidates)) == (3, {3: CandidateLoad(16, 48, 4)})
    assert (record.prefill_worker, record.prefill_candidates) == (None, None)
    assert COMPLETE.to_record().ttft_s == 0.12
    assert COMPLETE.to_record().prefill_worker == FIRST_TOKEN.to_record().prefill_worker == 0


PREFILL_LINE = CANDIDATE.model_copy(update={"worker_id": 0, "active_prefill_tokens": 640})
ROUTED_TO_PREFILL = ROUTE.model_copy(
    update={"prefill": PrefillRoute(worker_id=0, candidates=(PREFILL_LINE,))}
)


def test_a_route_names_the_prefill_router_decision_when_there_was_one() -> None:
    decoded, _, _ = decode("route", encode(ROUTED_TO_PREFILL, "p", 1))
    assert decoded == ROUTED_TO_PREFILL
    record = decoded.to_record()
    assert (record.worker, record.prefill_worker) == (3, 0)
    assert dict(record.prefill_candidates or {}) == {0: CandidateLoad(16, 640, 4)}
    joiner = EventJoiner()
    joiner.add_route(record)
    joined = joiner.add_completion(FIRST_TOKEN.to_record())  # prefilled on worker 0
    assert joined is not None and joined.worker == 0
    prefill = json.loads(encode(ROUTED_TO_PREFILL, "p", 1))["events"][0]["prefill"]
    for bad in (
        prefill | {"worker_id": 5},  # not among its candidates
        prefill | {"candidates": [prefill["candidates"][0]] * 2},
        prefill | {"extra": 1},
        "0",
    ):
        assert _reason("route", _wire(ROUTE, prefill=bad)) == "schema"
    assert decode("route", _wire(ROUTE, prefill=None))[0].prefill is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\x00", "malformed"),
        (b"", "malformed"),
        (b"[1, 2]", "malformed"),
        (b'{"v": 1', "malformed"),
        (json.dumps({"v": 2, "publisher": "p", "seq": 1}).encode(), "version"),
        (_wire(COMPLETE, v=2), "version"),
        (_wire(COMPLETE, v=True), "version"),
        (_wire(COMPLETE, v=1.0), "version"),
        (json.dumps({"v": 1, "publisher": "p"}).encode(), "schema"),
        (json.dumps({"v": 1, "publisher": "p", "seq": 1, "request_id": "x"}).encode(), "schema"),
        (_wire(COMPLETE, extra_field=1), "schema"),
        (_wire(COMPLETE, seq=-1), "schema"),
        (_wire(COMPLETE, seq=True), "schema"),
        (_wire(COMPLETE, publisher=""), "schema"),
    ],
)
def test_bad_messages_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    assert _reason("complete", data) == reason


def test_deep_nesting_is_malformed_not_a_recursion_error() -> None:
    # Regression: json.loads raised RecursionError straight through the subscription handler.
    depth = 200_000
    for data in (
        b"[" * depth + b"]" * depth,
        b'{"v": 1, "order": ' + b"[" * depth + b"]" * depth + b"}",
        b'{"a":' * (depth // 4) + b"1" + b"}" * (depth // 4),
    ):
        assert len(data) <= MAX_MESSAGE_BYTES
        assert _reason("auction", data) == "malformed"


def test_oversized_messages_are_refused_before_parsing() -> None:
    assert _reason("auction", b" " * (MAX_MESSAGE_BYTES + 1)) == "too_large"
    assert _reason("auction", b"[" * (MAX_MESSAGE_BYTES + 1)) == "too_large"
    assert _reason("nope", b"{}") == "unknown_subject"


@pytest.mark.parametrize(
    "changes",
    [
        {"order": "abc"},  # was ('a', 'b', 'c')
        {"order": ["a", "b"], "n": -5},  # was accepted
        {"order": ["a", "b"], "n": 3},  # n disagrees with the order
        {"order": ["a", "a"]},  # a request twice in one order
        {"order": ["a", 7]},
        {"welfare": "nan"},  # was NaN
        {"welfare": "4.5"},
        {"welfare": True},  # was 1.0
        {"payments": {"alice": True}},
        {"payments": {"alice": "nan"}},
        {"payments": {"alice": -1.0}},
        {"payments": [["alice", 1.0]]},
        {"batch_id": 4.0},
        {"batch_id": "4"},
        {"n": 2.0},
        {"t": -1.0},
        {"t": None},
        {"order": ["x" * (MAX_ID_CHARS + 1), "b"]},
        {"order": ["", "b"]},
    ],
)
def test_auction_events_are_not_coerced(changes: dict) -> None:
    assert _reason("auction", _wire(AUCTION, **changes)) == "schema"


def test_non_finite_numbers_are_refused() -> None:
    for raw in (b"NaN", b"Infinity", b"-Infinity", b"1e400"):
        data = _wire(COMPLETE).replace(b'"ttft_s": 0.12', b'"ttft_s": ' + raw)
        assert b'"ttft_s": ' + raw in data
        assert _reason("complete", data) == "schema"


def test_json_integers_are_fine_floats() -> None:
    event, _, _ = decode("auction", _wire(AUCTION, t=5, welfare=4))
    assert event.t == 5.0 and isinstance(event.t, float) and isinstance(event.welfare, float)
    assert event.order == ("a", "b") and isinstance(event.order, tuple)


def test_list_bounds() -> None:
    order = [f"r{i}" for i in range(MAX_ITEMS + 1)]
    data = _wire(AUCTION, order=order, n=len(order), payments={})
    assert len(data) <= MAX_MESSAGE_BYTES
    assert _reason("auction", data) == "schema"
    fits = order[:MAX_ITEMS]
    event, _, _ = decode("auction", _wire(AUCTION, order=fits, n=len(fits), payments={}))
    assert event.n == MAX_ITEMS


def test_route_and_complete_consistency() -> None:
    raw = json.loads(encode(ROUTE, "p", 1))
    candidate = raw["events"][0]["candidates"][0]
    candidate["uncached_tokens"] = "lots"
    with pytest.raises(MalformedEventError, match="uncached_tokens"):
        decode("route", json.dumps(raw).encode())
    twice = [candidate | {"uncached_tokens": 1}] * 2
    assert _reason("route", _wire(ROUTE, candidates=twice)) == "schema"
    assert _reason("route", _wire(ROUTE, worker_id=9)) == "schema"  # not among the candidates
    assert _reason("route", _wire(ROUTE, tau=-0.1)) == "schema"
    probability = [candidate | {"uncached_tokens": 1, "probability": 1.5}]
    assert _reason("route", _wire(ROUTE, candidates=probability)) == "schema"
    assert _reason("complete", _wire(COMPLETE, cached_tokens=129)) == "schema"
    assert _reason("complete", _wire(COMPLETE, worker_id=2**64)) == "schema"
    assert decode("complete", _wire(COMPLETE, prefill_worker_id=None))[0].prefill_worker_id is None


def test_python_construction_is_strict_too() -> None:
    with pytest.raises(ValidationError):
        AuctionEvent(batch_id=1, t=0.0, n=3, order="abc")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        AuctionEvent(batch_id=1, t=float("nan"), n=0, order=())
    with pytest.raises(ValidationError):
        RegimeEvent(t=1.0, regime="below", tau=True, omega=0.0, ttft_p99_smoothed_s=0.0)


def test_subjects() -> None:
    assert subject("prod", "route") == "disagg.prod.route"
    for bad in ("", "a.b", "x*", "a b"):
        with pytest.raises(ValueError):
            subject(bad, "route")
    with pytest.raises(ValueError):
        subject("prod", "everything")


def test_first_token_and_pools_subjects() -> None:
    assert subject("prod", "first_token") == "disagg.prod.first_token"
    assert subject("prod", "pools") == "disagg.prod.pools"


def test_first_token_joins_a_route_as_its_completion_half() -> None:
    joiner = EventJoiner()
    assert joiner.add_route(ROUTE.to_record()) is None
    joined = joiner.add_completion(FIRST_TOKEN.to_record())
    assert joined is not None and joined.latency == 0.2 and joined.worker == 3
    # prefill_worker_id is optional in Python and may be null on the wire.
    local = FirstTokenEvent(request_id="r2", t=1.0, worker_id=3, ttft_s=0.0)
    assert local.prefill_worker_id is None
    assert decode("first_token", encode(local, "p", 1))[0] == local


@pytest.mark.parametrize(
    ("kind", "event", "changes"),
    [
        ("first_token", FIRST_TOKEN, {"ttft_s": -0.1}),
        ("first_token", FIRST_TOKEN, {"ttft_s": "0.2"}),
        ("first_token", FIRST_TOKEN, {"request_id": ""}),
        ("first_token", FIRST_TOKEN, {"worker_id": 1.0}),
        ("first_token", FIRST_TOKEN, {"prefill_worker_id": -1}),
        ("first_token", FIRST_TOKEN, {"status": "ok"}),
        ("pools", POOLS, {"action": "explode"}),
        ("pools", POOLS, {"action": None}),
        ("pools", POOLS, {"prefill_workers": [0, 2]}),  # worker 2 is in both pools
        ("pools", POOLS, {"decode_workers": [2, 2]}),
        ("pools", POOLS, {"decode_workers": "23"}),
        ("pools", POOLS, {"decode_workers": list(range(4, 4 + MAX_CANDIDATES + 1))}),
        ("pools", POOLS, {"reason": "x" * (MAX_REASON_CHARS + 1)}),
        ("pools", POOLS, {"t": -1.0}),
    ],
)
def test_first_token_and_pools_are_strict(kind: str, event, changes: dict) -> None:
    assert _reason(kind, _wire(event, **changes)) == "schema"


def test_pools_actions_round_trip() -> None:
    for action in ("resplit_start", "drained", "warm"):
        event = PoolsEvent(t=0, prefill_workers=(), decode_workers=(1,), action=action)
        assert decode("pools", encode(event, "p", 1))[0] == event
    with pytest.raises(ValidationError):
        PoolsEvent(t=0.0, prefill_workers=[0], decode_workers=(1,), action="warm")  # type: ignore[arg-type]


def test_regime_changes_become_regime_events() -> None:
    from controller.controller import RegimeChange
    from controller.detector import Regime

    change = RegimeChange(12.0, Regime.SATURATED, 0.8, 0.1, 3.5, 4)
    event = RegimeEvent.from_change(change)
    assert event == RegimeEvent(
        t=12.0, regime="saturated", tau=0.8, omega=0.1, ttft_p99_smoothed_s=3.5, policy_version=4
    )
    assert decode("regime", encode(event, "ctl", 1))[0] == event


# -- properties: whatever arrives, decode answers an event or MalformedEventError ------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_valid = {
    "route": ROUTE,
    "complete": COMPLETE,
    "regime": REGIME,
    "auction": AUCTION,
    "first_token": FIRST_TOKEN,
    "pools": POOLS,
    "load": LOAD,
    "engine_load": ENGINE_LOAD,
}
_kinds = st.sampled_from(sorted(_valid))


@given(kind=_kinds, data=st.binary(max_size=256))
def test_any_bytes_are_an_event_or_a_reason(kind: str, data: bytes) -> None:
    try:
        decode(kind, data)
    except MalformedEventError as exc:
        assert exc.reason in DROP_REASONS


@given(kind=_kinds, field=st.integers(0, 20), new_key=st.text(max_size=8), value=_json)
def test_any_field_value_is_an_event_or_a_reason(
    kind: str, field: int, new_key: str, value: object
) -> None:
    raw = json.loads(encode(_valid[kind], "p", 1))
    # On a batched subject, odd draws change the event inside the batch, even ones the message.
    target = raw["events"][0] if kind in BATCHED and field % 2 else raw
    keys = sorted(target)
    # Most draws replace an existing field's value; the others add a key of their own.
    target[keys[field] if field < len(keys) else new_key] = value
    try:
        event, _, _ = decode(kind, json.dumps(raw).encode())
    except MalformedEventError as exc:
        assert exc.reason in DROP_REASONS
    else:
        assert encode(event, "p", 1)  # whatever was accepted re-encodes under the same model


@given(
    order=st.lists(st.text(min_size=1, max_size=12), unique=True, max_size=20),
    welfare=st.floats(allow_nan=False, allow_infinity=False),
    pay=st.floats(min_value=0, allow_infinity=False),
    seq=st.integers(min_value=0, max_value=2**63 - 1),
)
def test_valid_auction_events_round_trip(
    order: list[str], welfare: float, pay: float, seq: int
) -> None:
    event = AuctionEvent(
        batch_id=1, t=0.0, n=len(order), order=tuple(order), payments={"u": pay}, welfare=welfare
    )
    assert decode("auction", encode(event, "p", seq)) == (event, "p", seq)


# -- batches (cluster/wire.py) ---------------------------------------------------------------------


def test_a_batch_round_trips_and_is_refused_whole() -> None:
    batch = [COMPLETE.model_copy(update={"request_id": f"r{k}"}) for k in range(3)]
    events, publisher, seq = decode_all("complete", encode_batch(batch, "p", 4))
    assert list(events) == batch and (publisher, seq) == ("p", 4)
    with pytest.raises(MalformedEventError, match="a batch of 3"):
        decode("complete", encode_batch(batch, "p", 4))  # one event was asked for
    raw = json.loads(encode_batch(batch, "p", 4))
    raw["events"][1]["cached_tokens"] = 10**6  # above its prompt: the whole batch goes
    assert _reason("complete", json.dumps(raw).encode()) == "schema"
    for events_field in ([], [raw["events"][0]] * (MAX_BATCH_EVENTS + 1), "x"):
        raw["events"] = events_field
        assert _reason("complete", json.dumps(raw).encode()) == "schema"
    with pytest.raises(ValueError, match="one batched kind"):
        encode_batch([COMPLETE, FIRST_TOKEN], "p", 1)
    with pytest.raises(ValueError, match="one batched kind"):
        encode_batch([POOLS], "p", 1)  # the control plane's events go one per message
    assert "events" not in json.loads(encode(POOLS, "p", 1))


def test_an_engine_snapshot_is_strict_and_travels_in_batches() -> None:
    assert "engine_load" in BATCHED
    batch = [ENGINE_LOAD, ENGINE_LOAD.model_copy(update={"worker_id": 2, "requests": 0})]
    events, _, seq = decode_all("engine_load", encode_batch(batch, "w", 3))
    assert list(events) == batch and seq == 3
    for changes, field in (
        ({"role": "middle"}, "role"),
        ({"requests": -1}, "requests"),
        ({"ttl_s": 0.0}, "ttl_s"),
        ({"decode_blocks": float("inf")}, "decode_blocks"),
    ):
        with pytest.raises(ValidationError, match=field):
            EngineLoadEvent.model_validate({**ENGINE_LOAD.model_dump(), **changes})
