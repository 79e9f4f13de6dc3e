from __future__ import annotations

import random

import pytest

from games.join import CompletionRecord, EventJoiner, RouteRecord
from games.poa import CandidateLoad

CANDIDATES = {0: CandidateLoad(16, 0, 4), 1: CandidateLoad(0, 32, 8)}


def _route(i: int, t: float = 0.0, worker: int = 1) -> RouteRecord:
    return RouteRecord(f"r{i}", t, worker, CANDIDATES)


def _done(i: int, t: float = 1.0, worker: int = 1, status: str = "ok") -> CompletionRecord:
    return CompletionRecord(f"r{i}", t, worker, ttft_s=0.25, status=status)


def test_joins_in_either_order() -> None:
    joiner = EventJoiner()
    assert joiner.add_route(_route(1)) is None
    joined = joiner.add_completion(_done(1))
    assert joined is not None and joined.worker == 1 and joined.latency == 0.25
    # The window request carries the route's whole breakdown, keyed by the route's time.
    assert joined.candidates == CANDIDATES and (joined.routed_at, joined.first_token_at) == (0, 1)
    assert joiner.add_completion(_done(2)) is None
    assert joiner.add_route(_route(2)).request_id == "r2"
    assert joiner.pending == 0 and joiner.attribution_rate == 1.0


def test_shuffled_duplicated_and_lossy_streams() -> None:
    rng = random.Random(4)
    events = []
    for i in range(300):
        if i % 10 != 3:  # every tenth route is lost
            events.append(("route", _route(i, t=float(i))))
        events.append(("done", _done(i, t=float(i) + 1)))
    events += rng.sample(events, 60)  # duplicates
    rng.shuffle(events)
    joiner = EventJoiner(ttl_s=1000.0)
    joined = set()
    for kind, record in events:
        out = joiner.add_route(record) if kind == "route" else joiner.add_completion(record)
        if out is not None:
            assert out.request_id not in joined
            joined.add(out.request_id)
    assert len(joined) == 270
    assert joiner.counts["duplicate_route"] + joiner.counts["duplicate_completion"] == 60
    joiner.expire(now=5000.0)
    assert joiner.counts["expired_completion"] == 30 and joiner.pending == 0
    assert joiner.attribution_rate == pytest.approx(270 / 300)


def test_failed_and_migrated_requests_are_counted_not_attributed() -> None:
    joiner = EventJoiner()
    joiner.add_route(_route(1))
    assert joiner.add_completion(_done(1, status="error")) is None
    joiner.add_route(_route(2, worker=1))
    assert joiner.add_completion(_done(2, worker=0)) is None
    assert joiner.counts["failed"] == 1 and joiner.counts["worker_mismatch"] == 1
    assert joiner.attribution_rate == 0.0


def test_expiry_keeps_fresh_halves() -> None:
    joiner = EventJoiner(ttl_s=10.0)
    joiner.add_route(_route(1, t=0.0))
    joiner.add_route(_route(2, t=8.0))
    assert joiner.expire(now=12.0) == 1
    assert joiner.add_completion(_done(2, t=12.0)) is not None
    with pytest.raises(ValueError):
        EventJoiner(ttl_s=0)


def test_has_completion_covers_held_and_joined_halves() -> None:
    joiner = EventJoiner()
    assert not joiner.has_completion("a")
    joiner.add_completion(CompletionRecord("a", 1.0, 0, 0.1))
    assert joiner.has_completion("a")  # held, waiting for its route
    joiner.add_route(RouteRecord("b", 0.0, 0, {0: CandidateLoad(1, 0, 0)}))
    assert not joiner.has_completion("b")  # only the route half
    assert joiner.add_completion(CompletionRecord("b", 1.0, 0, 0.1)) is not None
    assert joiner.has_completion("b")  # joined: a second completion half would be a duplicate
    assert joiner.counts["duplicate_completion"] == 0


PREFILL_LINES = {7: CandidateLoad(64, 640, 0), 8: CandidateLoad(64, 0, 0)}


def _routed_to_prefill(i: int) -> RouteRecord:
    return RouteRecord(
        f"r{i}", 0.0, 1, CANDIDATES, prefill_worker=8, prefill_candidates=PREFILL_LINES
    )


def test_the_window_request_is_the_decision_that_placed_the_prefill() -> None:
    """A prefill worker's queue is what a remotely prefilled request's TTFT waits in: its
    window request is the prefill router's decision. A local prefill, or a completion that does
    not say, keeps the decode router's."""
    joiner = EventJoiner()
    joiner.add_route(_routed_to_prefill(1))
    remote = joiner.add_completion(CompletionRecord("r1", 1.0, 1, 0.25, prefill_worker=8))
    assert remote is not None and (remote.worker, remote.candidates) == (8, PREFILL_LINES)
    joiner.add_route(_routed_to_prefill(2))
    local = joiner.add_completion(CompletionRecord("r2", 1.0, 1, 0.25))
    assert local is not None and (local.worker, local.candidates) == (1, CANDIDATES)
    # The engines routed the prefill themselves (Dynamo): the decode decision is all there is.
    joiner.add_route(_route(3))
    theirs = joiner.add_completion(CompletionRecord("r3", 1.0, 1, 0.25, prefill_worker=8))
    assert theirs is not None and theirs.worker == 1
    # Prefilled elsewhere than routed: not attributed.
    joiner.add_route(_routed_to_prefill(4))
    assert joiner.add_completion(CompletionRecord("r4", 1.0, 1, 0.25, prefill_worker=7)) is None
    assert joiner.counts["worker_mismatch"] == 1 and joiner.counts["joined"] == 3
