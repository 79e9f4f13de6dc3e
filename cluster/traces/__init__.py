"""Production traces as workloads (docs/design.md §8 "Real traces"): one strict model per line
shape (``lines``), a streaming reader that sniffs the format and names every bad line
(``reader``), the replayed window and its pace (``window``), and prompts made from the trace's
block ids (``prompts``)."""

from cluster.traces.prompts import PrefixGroups, TracePrompts, parse_sharing
from cluster.traces.reader import (
    FORMATS,
    MOONCAKE_BLOCK_TOKENS,
    TraceFormat,
    TraceLineError,
    TraceReader,
    TraceRow,
    TraceStats,
    sniff_format,
)
from cluster.traces.window import (
    ReplayWindow,
    TraceRequest,
    again,
    parse_window,
    trace_requests,
)

__all__ = [
    "FORMATS",
    "MOONCAKE_BLOCK_TOKENS",
    "PrefixGroups",
    "ReplayWindow",
    "TraceFormat",
    "TraceLineError",
    "TracePrompts",
    "TraceReader",
    "TraceRequest",
    "TraceRow",
    "TraceStats",
    "again",
    "parse_sharing",
    "parse_window",
    "sniff_format",
    "trace_requests",
]
