"""One strict model per trace line shape (docs/design.md §8 "Real traces").

Three shapes are read:

- **Mooncake** JSONL (Mooncake's FAST'25 traces; also what Dynamo's replay and aiperf read):
  ``timestamp`` (ms from the trace's start), ``input_length``, ``output_length`` (tokens) and
  ``hash_ids``, one id per ``block_tokens``-token block of the prompt (512 in Mooncake's
  traces), remapped so that equal ids mean an equal block *and* an equal prefix up to it.
- **Azure** LLM inference CSV (Azure Public Dataset, 2023 and 2024): ``TIMESTAMP`` (wall clock,
  up to 9 decimals), ``ContextTokens``, ``GeneratedTokens``; no prefix information.
- **Dynamo** request traces (``DYN_REQUEST_TRACE``, schema ``dynamo.request.trace.v1``): a
  ``request_end`` row per request, the request's ``request_received_ms``, ``output_tokens`` and
  ``replay`` (``trace_block_size``, ``input_length``, ``input_sequence_hashes``: Dynamo's
  sequence-aware hashes, which like Mooncake's ids name a block together with its prefix).
  Rows of other event types (``tool_end``) carry no request and are skipped. Optional fields
  (agent context, timings) are accepted and not used: replay is open loop at the recorded
  times, without the sessions' dependencies.

Mooncake and Azure lines are closed shapes: an unknown field is refused by name (a
``mooncake-delta`` trace, whose prompts are deltas, must not pass for a plain one). Every size
has a schema bound here; the loader adds the checks that need the trace's context (the block
count against the prompt length, the model's context).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "DYNAMO_SCHEMA",
    "MAX_BLOCK_TOKENS",
    "MAX_LENGTH",
    "AzureLine",
    "DynamoEvent",
    "MooncakeLine",
    "dynamo_event",
]

MAX_LENGTH = 1 << 20  # tokens in a prompt or an output: the largest context any model states
MAX_BLOCK_TOKENS = 1 << 16  # a trace's block: Mooncake's 512, Dynamo's KV block (16-128)
U64_MAX = (1 << 64) - 1
DYNAMO_SCHEMA = "dynamo.request.trace.v1"

Length = Annotated[int, Field(ge=1, le=MAX_LENGTH)]
BlockId = Annotated[int, Field(ge=0, le=U64_MAX)]
# A prompt of MAX_LENGTH tokens in blocks of one token: the most ids a line can need.
BlockIds = Annotated[list[BlockId], Field(max_length=MAX_LENGTH)]
Millis = Annotated[float, Field(ge=0.0)]


class _Line(BaseModel):
    """Strict, finite, frozen; closed unless a shape says otherwise."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", frozen=True)


class MooncakeLine(_Line):
    timestamp: Millis
    input_length: Length
    output_length: Length
    hash_ids: BlockIds


# Azure's wall clock: "2023-11-16 18:17:03.9799600" (7 decimals in 2023, 6 in 2024).
_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?")


class AzureLine(_Line):
    """A CSV row: its cells are text, so the counts are read as integers from their digits
    (``"4808"``; ``"48.5"`` or ``"x"`` is refused), and the time as seconds since the epoch
    (UTC, the trace's own clock; only differences are used)."""

    TIMESTAMP: float
    ContextTokens: Annotated[Length, Field(strict=False)]
    GeneratedTokens: Annotated[Length, Field(strict=False)]

    @field_validator("TIMESTAMP", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> float:
        if not isinstance(value, str):
            raise ValueError("must be a time 'YYYY-MM-DD HH:MM:SS[.fraction]'")
        found = _AZURE_TIME.fullmatch(value.strip())
        if found is None:
            raise ValueError("must be a time 'YYYY-MM-DD HH:MM:SS[.fraction]'")
        whole, fraction = found.groups()
        try:
            stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        except ValueError:
            raise ValueError("must be a real date and time") from None
        return stamp.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


class _DynamoPart(_Line):
    # Dynamo's rows grow optional fields (agent context, timings, finish metadata): a row is
    # versioned by its schema name, so fields this reader does not use are let through.
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore", frozen=True)


class DynamoReplay(_DynamoPart):
    trace_block_size: Annotated[int, Field(ge=1, le=MAX_BLOCK_TOKENS)]
    input_length: Length
    input_sequence_hashes: BlockIds


class DynamoRequest(_DynamoPart):
    request_received_ms: Millis | None = None
    output_tokens: Length
    replay: DynamoReplay


class DynamoEvent(_DynamoPart):
    schema_: Literal["dynamo.request.trace.v1"] = Field(alias="schema")
    event_type: Annotated[str, Field(max_length=64)]
    event_time_unix_ms: Millis | None = None
    request: DynamoRequest | None = None


def dynamo_event(row: object) -> DynamoEvent:
    """The event of one parsed JSONL row: the row itself or its ``event`` (both occur in
    Dynamo's sinks); pydantic's ``ValidationError`` names the field."""
    if isinstance(row, dict) and isinstance(row.get("event"), dict):
        row = row["event"]
    return DynamoEvent.model_validate(row)
