"""OpenAI-shaped request and response bodies of the ingress (docs/design.md "Serve runtime").

Requests derive from :class:`cluster.models.StrictModel` like every edge shape: strict types
(``"1.5"`` is not a bid, ``true`` is not 1), no NaN or infinity, no unknown keys (a misspelt
``bidd`` must not silently bid 0). OpenAI's sampling fields (temperature, top_p, stop, seed, …)
are accepted, range-checked and ignored: the simulated engines do not sample from a model.
Two fields are ours: ``bid`` (the most the user pays for this request, finite, 0 ≤ bid ≤
``MAX_BID``) and, in responses, the ``disagg`` object (what the auction and router decided).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from auction import MAX_BID
from cluster.model_dir import MAX_MESSAGES
from cluster.models import StrictModel

__all__ = [
    "MAX_TOKENS_LIMIT",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionChoice",
    "CompletionRequest",
    "DisaggInfo",
    "Usage",
]

MAX_TOKENS_LIMIT = 1 << 20  # schema bound; the model's context bound is checked later (413)
DEFAULT_CHAT_MAX_TOKENS = 256  # cut to what the context leaves when not given explicitly
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
_SHORT = 256  # model names, user ids, stop strings: nothing longer is meaningful here


class StreamOptions(StrictModel):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted, ignored


class TextPart(StrictModel):
    """A text content part; other part types (images, audio) are refused."""

    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: str = Field(pattern=r"^[a-z_]{1,32}$")
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=_SHORT)
    # Tool-call bookkeeping of earlier turns: accepted, not rendered (no tools run here).
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined by newlines, as vLLM does)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)


class _CompletionBase(StrictModel):
    """Fields both endpoints share."""

    model: str = Field(min_length=1, max_length=_SHORT)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    stream_options: StreamOptions | None = None
    bid: float | None = Field(default=None, ge=0.0, le=MAX_BID)
    user: str | None = Field(default=None, max_length=_SHORT)  # OpenAI's end-user tag; unused
    n: int = Field(default=1, ge=1, le=1)  # one choice per request: the auction prices one
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_CompletionBase):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: bool | None = None  # accepted; responses carry logprobs: null
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = Field(default=None, max_length=_SHORT)
    reasoning_effort: str | None = Field(default=None, max_length=_SHORT)

    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's current name) wins over the older ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def chat(self) -> list[dict[str, str]]:
        """The messages as the chat template reads them."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_CompletionBase):
    """``POST /v1/completions``: one prompt, as text or as token ids."""

    prompt: str | list[int]
    echo: bool = False  # accepted; the prompt is never echoed
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


# --- responses: plain (non-strict) models, built by the ingress itself ---------------------------


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class PromptTokensDetails(_Out):
    cached_tokens: int


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class DisaggInfo(_Out):
    """What the auction and the router did with the request (our extension of OpenAI's shape).

    ``payment``: charged (non-streaming, and the last streamed chunk) or expected at admission
    (the ``x-disagg-payment`` header of a stream). ``position``: release position in the
    auction's order (-1, and the other fields None, where the path never said). ``mode``:
    ``"fcfs"`` or ``"auction"``."""

    payment: float
    position: int
    batch_id: str | None
    mode: str | None
    decode_worker: int | None
    prefill_worker: int | None
    policy_version: int | None
    regime: str | None
    cached_tokens: int


class AssistantMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Out):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    disagg: DisaggInfo


class ChatDelta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Out):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Out):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    disagg: DisaggInfo | None = None


class CompletionChoice(_Out):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class Completion(_Out):
    """A ``/v1/completions`` answer, and (``usage``/``disagg`` None) each streamed chunk: OpenAI
    streams the same ``text_completion`` object."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    disagg: DisaggInfo | None = None
