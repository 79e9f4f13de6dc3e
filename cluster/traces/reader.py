"""Reading a trace file as a stream of requests (docs/design.md §8 "Real traces").

``TraceReader(path)`` yields one :class:`TraceRow` per request line, in file order, reading one
line at a time (plain or gzip), so a trace of millions of lines never sits in memory. Every line
is checked by its shape's model (:mod:`cluster.traces.lines`) and then against the trace itself:
a Mooncake or Dynamo line names exactly ⌈input_length / block_tokens⌉ blocks, and, when the
model's context is given, its prompt and output fit in it. A bad line raises
:class:`TraceLineError`, which names the file, the line number and the field; with
``skip_bad_lines`` it is counted in :class:`TraceStats` instead (with the first few messages).

``--format auto`` sniffs: a ``.csv`` name or a ``TIMESTAMP,`` header is Azure's CSV; a JSON
object whose ``schema`` (or ``event.schema``) is Dynamo's is a Dynamo request trace; one with
``timestamp``, ``input_length`` and ``output_length`` is Mooncake's.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, Literal

from pydantic import ValidationError

from cluster.traces.lines import (
    DYNAMO_SCHEMA,
    MAX_BLOCK_TOKENS,
    AzureLine,
    MooncakeLine,
    dynamo_event,
)

__all__ = [
    "FORMATS",
    "MAX_LINE_BYTES",
    "MOONCAKE_BLOCK_TOKENS",
    "TraceFormat",
    "TraceLineError",
    "TraceReader",
    "TraceRow",
    "TraceStats",
    "sniff_format",
]

TraceFormat = Literal["mooncake", "azure", "dynamo"]
FORMATS: Final = ("mooncake", "azure", "dynamo")
MOONCAKE_BLOCK_TOKENS: Final = 512  # Mooncake's traces hash 512-token blocks
# One line: a Mooncake row of a 1M-token prompt in 512-token blocks is ~15 KB; a Dynamo row of
# 16-token blocks with 20-digit hashes ~1.4 MB. Longer lines are refused before parsing.
MAX_LINE_BYTES: Final = 4 << 20
_KEPT_MESSAGES: Final = 5
_AZURE_COLUMNS: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceLineError(ValueError):
    """A line the trace may not contain: ``path:line: field: message``."""

    def __init__(self, path: Path, line: int, field: str, message: str) -> None:
        self.path, self.line, self.field = path, line, field
        super().__init__(f"{path}:{line}: {field}: {message}")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request as the file states it: ``timestamp_s`` on the trace's own clock (seconds;
    only differences mean anything), ``block_ids`` one id per ``block_tokens`` block of the
    prompt (None where the format carries no prefix information)."""

    line: int
    timestamp_s: float
    input_length: int
    output_length: int
    block_ids: tuple[int, ...] | None


@dataclass
class TraceStats:
    """What a read found: lines read, requests yielded, rows that are no request (a Dynamo
    ``tool_end``), bad lines skipped (with the first few messages)."""

    lines: int = 0
    requests: int = 0
    not_requests: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "lines": self.lines,
            "requests": self.requests,
            "not_requests": self.not_requests,
            "bad_lines": self.bad_lines,
            "bad_examples": list(self.bad_examples),
        }


@contextmanager
def _open_text(path: Path) -> Iterator[IO[str]]:
    """The file as text lines, gunzipped when it is gzip (by its magic bytes, not its name)."""
    with path.open("rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        with (
            gzip.GzipFile(fileobj=raw, mode="rb") if gz else nullcontext(raw) as data,
            io.TextIOWrapper(data, encoding="utf-8", newline="") as text,
        ):
            yield text


def sniff_format(path: Path) -> TraceFormat:
    """The format of ``path`` from its name and first non-empty line (module docstring)."""
    if path.suffix.lower() == ".csv" or path.name.lower().endswith(".csv.gz"):
        return "azure"
    try:
        with _open_text(path) as text:
            first = next((line for line in text if line.strip()), "")
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ValueError(f"{path}: cannot read the trace ({exc})") from None
    if first.startswith("TIMESTAMP,"):
        return "azure"
    try:
        row = json.loads(first)
    except ValueError:
        raise ValueError(
            f"{path}:1: not a trace this reader knows (neither CSV with a TIMESTAMP header nor "
            "a JSON object); name the format with --format"
        ) from None
    if isinstance(row, dict):
        event = row.get("event", row)
        if isinstance(event, dict) and event.get("schema") == DYNAMO_SCHEMA:
            return "dynamo"
        if {"timestamp", "input_length", "output_length"} <= row.keys():
            return "mooncake"
    raise ValueError(
        f"{path}: the first row is neither a Mooncake row (timestamp, input_length, "
        f"output_length, hash_ids) nor a {DYNAMO_SCHEMA} row; name the format with --format"
    )


def _first_error(exc: ValidationError) -> tuple[str, str]:
    """(dotted field path, message) of a validation error's first complaint."""
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "(line)"
    got = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.60})"
    return where.replace("schema_", "schema"), f"{err['msg']}{got}"


class TraceReader:
    """Stream the rows of one trace file (module docstring).

    ``block_tokens``: the tokens each Mooncake id stands for (512 in Mooncake's own traces; a
    Dynamo trace states its own). ``max_context_tokens``: refuse a row whose prompt plus output
    exceed it (the model's context). ``skip_bad_lines``: count bad lines instead of raising.
    ``stats`` fills in as the rows are read."""

    def __init__(
        self,
        path: str | Path,
        fmt: TraceFormat | Literal["auto"] = "auto",
        *,
        block_tokens: int = MOONCAKE_BLOCK_TOKENS,
        max_context_tokens: int | None = None,
        skip_bad_lines: bool = False,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"{self.path}: no such trace file")
        if not 1 <= block_tokens <= MAX_BLOCK_TOKENS:
            raise ValueError(
                f"block_tokens must lie in [1, {MAX_BLOCK_TOKENS}], got {block_tokens}"
            )
        if max_context_tokens is not None and max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {max_context_tokens}")
        self.format: TraceFormat = sniff_format(self.path) if fmt == "auto" else fmt
        if self.format not in FORMATS:
            raise ValueError(f"unknown trace format {fmt!r}; known: auto, {', '.join(FORMATS)}")
        self.block_tokens: int | None = None if self.format == "azure" else block_tokens
        self.max_context_tokens = max_context_tokens
        self.skip_bad_lines = skip_bad_lines
        self.stats = TraceStats()

    def __iter__(self) -> Iterator[TraceRow]:
        self.stats = TraceStats()
        try:
            with _open_text(self.path) as text:
                if self.format == "azure":
                    yield from self._azure(text)
                else:
                    yield from self._jsonl(text)
        except (OSError, UnicodeDecodeError, EOFError) as exc:
            raise ValueError(f"{self.path}: cannot read the trace ({exc})") from None

    # -- formats -----------------------------------------------------------------------------

    def _jsonl(self, text: IO[str]) -> Iterator[TraceRow]:
        dynamo = self.format == "dynamo"
        for number, line in enumerate(text, 1):
            self.stats.lines += 1
            if not line.strip():
                continue
            try:
                if len(line) > MAX_LINE_BYTES:
                    raise TraceLineError(
                        self.path, number, "(line)", f"longer than {MAX_LINE_BYTES} bytes"
                    )
                row = self._dynamo_row(number, line) if dynamo else self._mooncake_row(number, line)
            except TraceLineError as exc:
                self._bad(exc)
                continue
            if row is not None:
                self.stats.requests += 1
                yield row

    def _mooncake_row(self, number: int, line: str) -> TraceRow:
        try:
            m = MooncakeLine.model_validate_json(line)
        except ValidationError as exc:
            raise TraceLineError(self.path, number, *_first_error(exc)) from None
        return self._row(
            number, m.timestamp / 1000.0, m.input_length, m.output_length, m.hash_ids, "hash_ids"
        )

    def _dynamo_row(self, number: int, line: str) -> TraceRow | None:
        try:
            event = dynamo_event(json.loads(line))
        except ValueError as exc:  # ValidationError is one
            if isinstance(exc, ValidationError):
                raise TraceLineError(self.path, number, *_first_error(exc)) from None
            raise TraceLineError(self.path, number, "(line)", f"not JSON ({exc})") from None
        if event.event_type != "request_end":
            self.stats.not_requests += 1
            return None
        request = event.request
        if request is None:
            raise TraceLineError(self.path, number, "request", "a request_end row needs one")
        received = request.request_received_ms
        if received is None:
            received = event.event_time_unix_ms
        if received is None:
            raise TraceLineError(
                self.path, number, "request.request_received_ms",
                "missing, and no event_time_unix_ms either",
            )  # fmt: skip
        replay = request.replay
        if self.block_tokens != replay.trace_block_size:
            if self.stats.requests:  # the first request row sets the trace's block
                raise TraceLineError(
                    self.path, number, "request.replay.trace_block_size",
                    f"{replay.trace_block_size}, but earlier rows use {self.block_tokens}",
                )  # fmt: skip
            self.block_tokens = replay.trace_block_size
        return self._row(
            number, received / 1000.0, replay.input_length, request.output_tokens,
            replay.input_sequence_hashes, "request.replay.input_sequence_hashes",
        )  # fmt: skip

    def _azure(self, text: IO[str]) -> Iterator[TraceRow]:
        rows = csv.reader(text)
        header = next(rows, None)
        self.stats.lines += 1
        if header is None or tuple(h.strip() for h in header[:3]) != _AZURE_COLUMNS:
            raise ValueError(
                f"{self.path}:1: an Azure trace starts with the header "
                f"{','.join(_AZURE_COLUMNS)}, got {','.join(header or [])!r:.80}"
            )
        for number, cells in enumerate(rows, 2):
            self.stats.lines += 1
            if not cells or not any(c.strip() for c in cells):
                continue
            try:
                if len(cells) != len(header):
                    raise TraceLineError(
                        self.path, number, "(line)", f"{len(cells)} cells, the header has "
                        f"{len(header)}",
                    )  # fmt: skip
                try:
                    a = AzureLine.model_validate(dict(zip(_AZURE_COLUMNS, cells, strict=False)))
                except ValidationError as exc:
                    raise TraceLineError(self.path, number, *_first_error(exc)) from None
                row = self._row(number, a.TIMESTAMP, a.ContextTokens, a.GeneratedTokens, None, "")
            except TraceLineError as exc:
                self._bad(exc)
                continue
            self.stats.requests += 1
            yield row

    # -- checks ------------------------------------------------------------------------------

    def _row(
        self,
        number: int,
        timestamp_s: float,
        input_length: int,
        output_length: int,
        ids: list[int] | None,
        ids_field: str,
    ) -> TraceRow:
        if ids is not None:
            assert self.block_tokens is not None
            blocks = -(-input_length // self.block_tokens)
            if len(ids) != blocks:
                raise TraceLineError(
                    self.path, number, ids_field,
                    f"{len(ids)} ids, but {input_length} tokens make {blocks} blocks of "
                    f"{self.block_tokens}",
                )  # fmt: skip
        context = self.max_context_tokens
        if context is not None and input_length + output_length > context:
            raise TraceLineError(
                self.path, number, "input_length",
                f"prompt ({input_length} tokens) + output ({output_length}) exceeds the "
                f"model's context of {context} tokens",
            )  # fmt: skip
        return TraceRow(
            number, timestamp_s, input_length, output_length, None if ids is None else tuple(ids)
        )

    def _bad(self, exc: TraceLineError) -> None:
        if not self.skip_bad_lines:
            raise exc
        self.stats.bad_lines += 1
        if len(self.stats.bad_examples) < _KEPT_MESSAGES:
            self.stats.bad_examples.append(str(exc))
