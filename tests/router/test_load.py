"""LoadTracker: reported + reserved load, released exactly (no drift)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import LoadTracker, LoadView, Reservation


def tracker(*workers: int) -> LoadTracker:
    loads = LoadTracker()
    for w in workers:
        loads.add_worker(w)
    return loads


def test_reserve_finish_release_by_hand() -> None:
    loads = tracker(1, 2)
    loads.report(1, active_prefill_tokens=100, active_decode_blocks=10, active_requests=2)
    loads.reserve("a", 1, prefill_tokens=48, decode_blocks=4)
    loads.reserve("b", 2, prefill_tokens=16, decode_blocks=1)
    assert loads.view(1) == LoadView(148, 14, 3)
    assert loads.view(2) == LoadView(16, 1, 1)
    assert loads.reservation("a") == Reservation(1, 48, 4)
    assert "a" in loads and len(loads) == 2
    assert loads.finish_prefill("a")
    assert not loads.finish_prefill("a")  # already returned
    assert loads.view(1) == LoadView(100, 14, 3)
    assert loads.release("a")
    assert not loads.release("a")  # a duplicate completion
    assert loads.view(1) == LoadView(100, 10, 2)
    assert loads.prefill_tokens == [100, 16] and loads.decode_blocks == [10, 1]
    loads.reserve("c", 2, prefill_tokens=0, decode_blocks=2)  # a fully cached prompt
    assert loads.finish_prefill("c") and not loads.finish_prefill("c")
    assert not loads.finish_prefill("zzz")


def test_report_replaces_the_previous_report() -> None:
    loads = tracker(1)
    loads.reserve("a", 1, 5, 1)
    loads.report(1, 50, 3)
    loads.report(1, 20, 7, 1)
    assert loads.view(1) == LoadView(25, 8, 2)


def test_columns_follow_ascending_worker_order_across_changes() -> None:
    loads = tracker(5, 1)
    loads.reserve("a", 5, 7, 1)
    loads.add_worker(3)
    assert loads.workers == (1, 3, 5)
    assert loads.prefill_tokens == [0, 0, 7]
    loads.remove_worker(5)
    assert list(loads.workers) == [1, 3] and loads.prefill_tokens == [0, 0]
    assert "a" not in loads  # reservations on a removed worker go with it


def test_caller_mistakes_raise_value_error() -> None:
    loads = tracker(1)
    with pytest.raises(ValueError):
        loads.report(2, 1, 1)
    with pytest.raises(ValueError):
        loads.report(1, -1, 1)
    with pytest.raises(ValueError):
        loads.report(1, 1, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        loads.reserve("a", 2, 1, 1)
    with pytest.raises(ValueError):
        loads.reserve("a", 1, -1, 1)
    with pytest.raises(ValueError):
        loads.reserve("a", 1, 1, True)  # a bool is an int to mypy, not to us
    loads.reserve("a", 1, 1, 1)
    with pytest.raises(ValueError):
        loads.reserve("a", 1, 1, 1)
    with pytest.raises(ValueError):
        loads.view(9)
    with pytest.raises(ValueError):
        loads.remove_worker(9)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_no_drift_after_many_requests(seed: int) -> None:
    rng = random.Random(seed)
    loads = tracker(1, 2, 3)
    reported = {
        w: LoadView(rng.randrange(500), rng.randrange(50), rng.randrange(5)) for w in (1, 2, 3)
    }
    for w, v in reported.items():
        loads.report(w, v.active_prefill_tokens, v.active_decode_blocks, v.active_requests)
    held: dict[str, tuple[int, int, int]] = {}
    for i in range(600):
        action = rng.random()
        if action < 0.5 or not held:
            w = rng.choice((1, 2, 3))
            p, d = rng.randrange(4096), rng.randrange(256)
            loads.reserve(f"r{i}", w, p, d)
            held[f"r{i}"] = (w, p, d)
        elif action < 0.7:
            rid = rng.choice(sorted(held))
            w, p, d = held[rid]
            loads.finish_prefill(rid)
            held[rid] = (w, 0, d)
        else:
            rid = rng.choice(sorted(held))
            assert loads.release(rid)
            del held[rid]
        for w in (1, 2, 3):
            mine = [v for v in held.values() if v[0] == w]
            assert loads.view(w) == LoadView(
                reported[w].active_prefill_tokens + sum(v[1] for v in mine),
                reported[w].active_decode_blocks + sum(v[2] for v in mine),
                reported[w].active_requests + len(mine),
            )
    for rid in list(held):
        assert loads.release(rid)
    assert {w: loads.view(w) for w in (1, 2, 3)} == reported
    assert len(loads) == 0
