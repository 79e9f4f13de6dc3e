"""Which part of a trace is replayed, and how fast (docs/design.md §8 "Real traces").

:func:`trace_requests` turns a reader's rows into the requests of a replay, in arrival order,
streaming: rows may be out of order by up to ``reorder_s`` (Dynamo writes a request's row when it
ends, so its rows are ordered by end time) and are re-sorted within that horizon through a heap;
a row further out of order is an error naming its line. Time starts at the first request (its
``arrival_s`` is 0); ``start_s``/``duration_s`` cut a window of the trace's own seconds, which
then starts at 0; ``speedup`` divides every arrival time (×2: arrivals twice as dense, the same
requests); ``max_requests`` stops early. The transforms are deterministic, and the report
records them (``ReplayWindow.as_dict``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import Field

from cluster.models import StrictModel
from cluster.traces.reader import TraceLineError, TraceRow

__all__ = [
    "MAX_SPEEDUP",
    "ReplayWindow",
    "TraceRequest",
    "again",
    "parse_window",
    "trace_requests",
]

MAX_SPEEDUP: Final = 1000.0
MAX_TRACE_S: Final = 10.0 * 365 * 86400  # a window's bounds: ten years of trace time
MAX_REQUESTS: Final = 100_000_000
_LAP_IDS: Final = 1 << 40  # block ids of a lap: above Mooncake's (<2^20) and our requests'
_U64: Final = (1 << 64) - 1


class ReplayWindow(StrictModel):
    """The replayed part of a trace and its pace (module docstring)."""

    speedup: float = Field(default=1.0, gt=0.0, le=MAX_SPEEDUP)
    start_s: float = Field(default=0.0, ge=0.0, le=MAX_TRACE_S)
    duration_s: float | None = Field(default=None, gt=0.0, le=MAX_TRACE_S)
    max_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    reorder_s: float = Field(default=60.0, ge=0.0, le=86400.0)

    def as_dict(self) -> dict[str, float | int | None]:
        return self.model_dump()


def parse_window(text: str) -> tuple[float, float]:
    """``START:DURATION`` in trace seconds (``--window 600:120``); ``ValueError`` otherwise."""
    start, sep, duration = text.partition(":")
    try:
        values = float(start), float(duration)
    except ValueError:
        values = (math.nan, math.nan)
    if not sep or not all(math.isfinite(v) for v in values) or values[0] < 0 or values[1] <= 0:
        raise ValueError("must be START:DURATION in seconds, START >= 0 and DURATION > 0")
    return values


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a replay: the ``index``-th (from 0) in arrival order, arriving
    ``arrival_s`` after the replay starts (transforms applied), from line ``line`` of its file.
    ``block_ids``: one id per trace block of the prompt, None where the trace has none."""

    index: int
    line: int
    arrival_s: float
    input_length: int
    output_length: int
    block_ids: tuple[int, ...] | None


def _in_order(rows: Iterable[TraceRow], reorder_s: float) -> Iterator[TraceRow]:
    """``rows`` sorted by (timestamp, line) within a horizon of ``reorder_s`` seconds."""
    heap: list[tuple[float, int, TraceRow]] = []
    newest = -math.inf
    last = -math.inf
    for row in rows:
        if row.timestamp_s < last:
            raise TraceLineError(
                getattr(rows, "path", Path("trace")), row.line, "timestamp",
                f"arrives {last - row.timestamp_s:.3f} s before a row already replayed, more "
                f"than the reorder horizon of {reorder_s:g} s; sort the trace by arrival",
            )  # fmt: skip
        heapq.heappush(heap, (row.timestamp_s, row.line, row))
        newest = max(newest, row.timestamp_s)
        while heap and heap[0][0] < newest - reorder_s:
            last = heap[0][0]
            yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]


def trace_requests(
    rows: Iterable[TraceRow], window: ReplayWindow | None = None
) -> Iterator[TraceRequest]:
    """The requests of a replay of ``rows`` through ``window`` (module docstring)."""
    w = window or ReplayWindow()
    end = math.inf if w.duration_s is None else w.start_s + w.duration_s
    origin: float | None = None
    index = 0
    for row in _in_order(rows, w.reorder_s):
        if origin is None:
            origin = row.timestamp_s
        t = row.timestamp_s - origin
        if t < w.start_s:
            continue
        if t >= end:
            return
        yield TraceRequest(
            index, row.line, (t - w.start_s) / w.speedup, row.input_length, row.output_length,
            row.block_ids,
        )  # fmt: skip
        index += 1
        if w.max_requests is not None and index >= w.max_requests:
            return


def again(request: TraceRequest, lap: int) -> TraceRequest:
    """``request`` sent once more, on its ``lap``-th round, as a request of its own: its index
    moved on by ``lap`` · MAX_REQUESTS (a row without ids gets a prompt of its own) and its block
    ids by ``lap`` · 2^40, modulo 2^64 (its prefixes are new). A closed loop that sends a trace's
    first requests in turn would otherwise find its earlier laps in the KV caches and measure a
    capacity, or a calm latency, that the trace's own sharing never gives."""
    if lap == 0:
        return request
    ids = request.block_ids
    return TraceRequest(
        request.index + lap * MAX_REQUESTS, request.line, request.arrival_s, request.input_length,
        request.output_length,
        None if ids is None else tuple((i + lap * _LAP_IDS) & _U64 for i in ids),
    )  # fmt: skip
