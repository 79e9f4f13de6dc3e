from __future__ import annotations

import json

import pytest

from cluster.events import (
    AuctionEvent,
    Candidate,
    CompleteEvent,
    MalformedEventError,
    RegimeEvent,
    RouteEvent,
    decode,
    encode,
    subject,
)

ROUTE = RouteEvent(
    "r1", 1.5, "alice", 3, (Candidate(3, 2, 16, 1.0, 4, 5.0, 1.0),), 0.0, 1.0, "below", 7
)
COMPLETE = CompleteEvent("r1", 2.0, 3, 0, 0.12, 0.011, 3.0, 128, 64, 256, "ok")


@pytest.mark.parametrize(
    "event",
    [
        ROUTE,
        COMPLETE,
        RegimeEvent(3.0, "saturated", 0.8, 0.1, 10.2),
        AuctionEvent(4, 5.0, 2, ("a", "b"), {"alice": 1.5}, 4.5),
    ],
)
def test_round_trip(event) -> None:
    decoded, publisher, seq = decode(event.kind, encode(event, "p1", 9))
    assert decoded == event and (publisher, seq) == ("p1", 9)


def test_route_event_becomes_a_join_record() -> None:
    record = ROUTE.to_record()
    assert (record.worker, dict(record.uncached)) == (3, {3: 16})
    assert COMPLETE.to_record().ttft_s == 0.12


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\x00", "malformed"),
        (b"[1, 2]", "malformed"),
        (json.dumps({"v": 2, "publisher": "p", "seq": 1}).encode(), "version"),
        (json.dumps({"v": 1, "publisher": "p"}).encode(), "malformed"),
        (json.dumps({"v": 1, "publisher": "p", "seq": 1, "request_id": "x"}).encode(), "malformed"),
    ],
)
def test_bad_messages_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedEventError) as err:
        decode("complete", data)
    assert err.value.reason == reason


def test_wrongly_typed_fields_are_malformed() -> None:
    raw = json.loads(encode(ROUTE, "p", 1))
    raw["candidates"][0]["uncached_tokens"] = "lots"
    with pytest.raises(MalformedEventError, match="uncached_tokens"):
        decode("route", json.dumps(raw).encode())
    raw = json.loads(encode(COMPLETE, "p", 1))
    raw["ttft_s"] = float("nan")
    with pytest.raises(MalformedEventError):
        decode("complete", json.dumps(raw).encode())


def test_subjects() -> None:
    assert subject("prod", "route") == "disagg.prod.route"
    for bad in ("", "a.b", "x*"):
        with pytest.raises(ValueError):
            subject(bad, "route")
    with pytest.raises(ValueError):
        subject("prod", "everything")


def test_regime_changes_become_regime_events() -> None:
    from controller.controller import RegimeChange
    from controller.detector import Regime

    change = RegimeChange(12.0, Regime.SATURATED, 0.8, 0.1, 3.5, 4)
    event = RegimeEvent.from_change(change)
    assert event == RegimeEvent(12.0, "saturated", 0.8, 0.1, 3.5)
    assert decode("regime", encode(event, "ctl", 1))[0] == event
