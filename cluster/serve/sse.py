"""Response shapes of the two completion endpoints, Server-Sent Events framing and incremental
detokenization (docs/design.md "Serve runtime").

A stream is ``data: <json>\\n\\n`` events in OpenAI's shapes (``chat.completion.chunk`` or
``text_completion``): for chat a first chunk with ``role: assistant``, then text deltas, then a
chunk with ``finish_reason`` and our ``disagg`` object (the payment charged), then, when
``stream_options.include_usage``, a chunk with empty ``choices`` and ``usage``; last
``data: [DONE]``. A failure after the stream started is an event ``{"error": {...}}`` (what
OpenAI's own server and its clients use) followed by ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from cluster.serve import openai_models as om
from cluster.serve.openai_models import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    DisaggInfo,
    Usage,
)
from cluster.serve.path_types import Admitted, Finished, Routed
from cluster.serve.streaming import PAYMENT_HEADER, POSITION_HEADER

__all__ = ["DONE", "RunState", "Shapes", "TextStream", "format_amount", "sse", "sse_json"]

DONE = b"data: [DONE]\n\n"


def sse(model: BaseModel) -> bytes:
    """One SSE event carrying ``model`` as JSON (pydantic's JSON is one line: no ``\\n`` in it)."""
    return b"data: " + model.model_dump_json().encode() + b"\n\n"


def sse_json(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Detokenizer(Protocol):
    def decode(self, ids: Iterable[int]) -> str: ...


class TextStream:
    """Text deltas for token ids that arrive in chunks; joined (with :meth:`flush`) they equal
    ``decode(all ids)``, which is ``"".join(ChatTokenizer.decode_stream(all ids))``.

    ``ChatTokenizer.decode_stream`` is a generator over a complete iterable: it cannot wait for
    the next chunk between two ids. This is the same algorithm (tokenizers' ``DecodeStream``,
    vLLM's incremental detokenizer) over the public ``decode``: decode a short window from the
    start of the last emitted piece, emit what it adds, and hold text back while it ends in an
    incomplete UTF-8 sequence (U+FFFD). Work per chunk is bounded by the window, not the output.
    """

    def __init__(self, tokenizer: Detokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # window start: the first id of the last emitted piece
        self._read = 0  # ids before this index are emitted

    def push(self, ids: Iterable[int]) -> str:
        """Append ``ids``; the text they complete (possibly empty)."""
        self._ids.extend(ids)
        return self._step(final=False)

    def flush(self) -> str:
        """Whatever was held back (an incomplete character at the very end)."""
        return self._step(final=True)

    def _step(self, *, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return ""  # nothing new yet, or a character still split across ids
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]


class Shapes:
    """The OpenAI objects of one request of one endpoint (``chat`` or completions)."""

    def __init__(self, *, chat: bool, request_id: str, model: str, created: int) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = model
        self.created = created

    def first_chunks(self) -> list[bytes]:
        """What a stream starts with: chat announces the assistant role (as OpenAI does)."""
        if not self.chat:
            return []
        return [sse(self._chat_chunk(ChatDelta(role="assistant", content="")))]

    def delta(self, text: str) -> bytes:
        if self.chat:
            return sse(self._chat_chunk(ChatDelta(content=text)))
        return sse(self._completion([CompletionChoice(text=text)]))

    def last_chunk(self, finish_reason: str, disagg: DisaggInfo) -> bytes:
        if self.chat:
            return sse(self._chat_chunk(ChatDelta(), finish_reason, disagg=disagg))
        return sse(
            self._completion(
                [CompletionChoice(text="", finish_reason=finish_reason)], disagg=disagg
            )
        )

    def usage_chunk(self, usage: Usage) -> bytes:
        if self.chat:
            return sse(
                ChatCompletionChunk(
                    id=self.id, created=self.created, model=self.model, choices=[], usage=usage
                )
            )
        return sse(self._completion([], usage=usage))

    def response(
        self, text: str, finish_reason: str, usage: Usage, disagg: DisaggInfo
    ) -> dict[str, object]:
        """The non-streaming body."""
        body: BaseModel
        if self.chat:
            body = ChatCompletion(
                id=self.id,
                created=self.created,
                model=self.model,
                usage=usage,
                disagg=disagg,
                choices=[
                    ChatChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)
                ],
            )
        else:
            body = self._completion(
                [CompletionChoice(text=text, finish_reason=finish_reason)],
                usage=usage,
                disagg=disagg,
            )
        return body.model_dump(mode="json")

    def _chat_chunk(
        self,
        delta: ChatDelta,
        finish_reason: str | None = None,
        *,
        disagg: DisaggInfo | None = None,
    ) -> ChatCompletionChunk:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=[choice], disagg=disagg
        )

    def _completion(
        self,
        choices: list[CompletionChoice],
        *,
        usage: Usage | None = None,
        disagg: DisaggInfo | None = None,
    ) -> Completion:
        return Completion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            disagg=disagg,
        )


def format_amount(x: float) -> str:
    """The shortest text that reads back as ``x`` ("0", "1.5", "1e-06"), as in the headers."""
    text = repr(float(x))
    return text.removesuffix(".0")


@dataclass
class RunState:
    """One request on its way through the path: what the path has said so far, and the usage,
    ``disagg`` object and headers that follow from it."""

    request_id: str
    t0: float  # clock() at arrival
    max_tokens: int
    prompt_tokens: int
    admitted: Admitted | None = None
    routed: Routed | None = None
    finished: Finished | None = None
    n_out: int = 0
    t_last: float | None = None  # clock() at the last token chunk

    def payment(self) -> float:
        """Charged once finished; before that, what admission expects."""
        if self.finished is not None:
            return self.finished.payment_charged
        return self.admitted.payment if self.admitted is not None else 0.0

    def headers(self, *, charged: bool = True) -> dict[str, str]:
        """Payment and position headers; a failed request pays 0 (nothing is charged)."""
        position = self.admitted.position if self.admitted is not None else -1
        payment = float(self.payment()) if charged else 0.0
        return {
            PAYMENT_HEADER: format_amount(payment),
            POSITION_HEADER: str(position),
            "x-disagg-request-id": self.request_id,
        }

    def usage(self) -> Usage:
        cached = min(self.routed.cached_tokens, self.prompt_tokens) if self.routed else 0
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.n_out,
            total_tokens=self.prompt_tokens + self.n_out,
            prompt_tokens_details=om.PromptTokensDetails(cached_tokens=cached),
        )

    def finish_reason(self) -> str:
        # The simulated engines stop only at max_tokens; "stop" covers a path that ends early.
        return "length" if self.n_out >= self.max_tokens else "stop"

    def disagg(self) -> DisaggInfo:
        a, r = self.admitted, self.routed
        return DisaggInfo(
            payment=self.payment(),
            position=a.position if a else -1,
            batch_id=a.batch_id if a else None,
            mode=a.mode if a else None,
            decode_worker=r.decode_worker if r else None,
            prefill_worker=r.prefill_worker if r else None,
            policy_version=r.policy_version if r else None,
            regime=r.regime if r else None,
            cached_tokens=self.usage().prompt_tokens_details.cached_tokens,
        )
