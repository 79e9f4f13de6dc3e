"""The replayed window of a trace (cluster/traces/window.py): order, origin, window, pace."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from cluster.traces import ReplayWindow, TraceLineError, TraceRow, parse_window, trace_requests


def _rows(times: list[float]) -> list[TraceRow]:
    return [TraceRow(k + 1, t, 100, 10, (k,)) for k, t in enumerate(times)]


def test_time_starts_at_the_first_request_and_keeps_its_gaps() -> None:
    got = list(trace_requests(_rows([50.0, 50.0, 51.5, 60.0])))
    assert [(r.index, r.line, r.arrival_s) for r in got] == [
        (0, 1, 0.0), (1, 2, 0.0), (2, 3, 1.5), (3, 4, 10.0),
    ]


def test_window_speedup_and_cap() -> None:
    rows = _rows([0.0, 5.0, 10.0, 15.0, 20.0, 25.0])
    window = ReplayWindow(start_s=5.0, duration_s=15.0, speedup=2.0)
    got = list(trace_requests(rows, window))
    assert [(r.line, r.arrival_s, r.index) for r in got] == [(2, 0.0, 0), (3, 2.5, 1), (4, 5.0, 2)]
    capped = list(trace_requests(rows, ReplayWindow(max_requests=2)))
    assert [r.line for r in capped] == [1, 2]


def test_rows_out_of_order_within_the_horizon_are_sorted() -> None:
    rows = _rows([10.0, 4.0, 12.0, 11.0, 90.0, 95.0])  # Dynamo writes rows at each request's end
    got = list(trace_requests(rows, ReplayWindow(reorder_s=30.0)))
    assert [r.line for r in got] == [2, 1, 4, 3, 5, 6]
    assert [r.arrival_s for r in got] == [0.0, 6.0, 7.0, 8.0, 86.0, 91.0]


def test_a_row_beyond_the_horizon_is_an_error_naming_its_line() -> None:
    rows = _rows([10.0, 100.0, 200.0, 50.0])
    with pytest.raises(TraceLineError, match=r"4: timestamp: arrives 50\.000 s before a row"):
        list(trace_requests(rows, ReplayWindow(reorder_s=60.0)))


def test_the_window_is_validated() -> None:
    assert parse_window("600:120") == (600.0, 120.0)
    for bad in ("600", "a:b", "-1:5", "5:0", "5:nan", "inf:5"):
        with pytest.raises(ValueError, match="START:DURATION"):
            parse_window(bad)
    for field, value in (("speedup", 0.0), ("speedup", 1e9), ("max_requests", 0),
                         ("duration_s", -1.0), ("reorder_s", float("nan"))):
        with pytest.raises(ValidationError, match=field):
            ReplayWindow.model_validate({field: value})
    assert ReplayWindow().as_dict()["speedup"] == 1.0


@given(
    gaps=st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=1, max_size=40),
    speedup=st.floats(0.1, 100.0),
)
def test_speedup_divides_every_arrival_and_keeps_the_order(
    gaps: list[float], speedup: float
) -> None:
    times = [sum(gaps[: k + 1]) for k in range(len(gaps))]
    plain = list(trace_requests(_rows(times)))
    fast = list(trace_requests(_rows(times), ReplayWindow(speedup=speedup)))
    assert [r.line for r in fast] == [r.line for r in plain]
    for f, p in zip(fast, plain, strict=True):
        assert f.arrival_s == pytest.approx(p.arrival_s / speedup)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(fast))


def test_a_reader_is_streamed_not_loaded(tmp_path: Path) -> None:
    """Requests come as they are read: the first arrives before the file is read to its end."""
    from cluster.traces import TraceReader

    path = tmp_path / "t.jsonl"
    path.write_text("".join(
        f'{{"timestamp": {k}, "input_length": 10, "output_length": 1, "hash_ids": [{k}]}}\n'
        for k in range(1000)
    ))  # fmt: skip
    reader = TraceReader(path)
    stream = trace_requests(reader, ReplayWindow(reorder_s=0.0))
    first = next(stream)
    assert first.line == 1 and reader.stats.lines < 10


def test_a_request_sent_again_is_a_request_of_its_own() -> None:
    from cluster.traces import TracePrompts, TraceRequest, again

    first = TraceRequest(3, 4, 1.5, 1200, 40, (7, 8, 9))
    assert again(first, 0) is first
    later = again(first, 2)
    assert (later.line, later.arrival_s, later.input_length) == (4, 1.5, 1200)
    assert later.index != first.index and set(later.block_ids or ()).isdisjoint((7, 8, 9))
    prompts = TracePrompts(512)
    a, b = prompts.tokens(first), prompts.tokens(later)
    assert not (a[:16] == b[:16]).all()  # no prefix in common: no lap hits another's cache
    bare = TraceRequest(3, 4, 0.0, 600, 5, None)  # a row without ids: a new index, a new prompt
    unique = TracePrompts(None)
    assert not (unique.tokens(bare)[:16] == unique.tokens(again(bare, 1))[:16]).all()
    wrapped = again(TraceRequest(0, 1, 0.0, 10, 1, (2**64 - 1,)), 1)
    assert wrapped.block_ids is not None and 0 <= wrapped.block_ids[0] < 2**64
