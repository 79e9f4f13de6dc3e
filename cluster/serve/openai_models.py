"""OpenAI-shaped request and response bodies of the ingress (docs/design.md "Serve runtime").

Requests derive from :class:`cluster.models.StrictModel` like every edge shape: strict types
(``"1.5"`` is not a bid, ``true`` is not 1), no NaN or infinity, no unknown keys (a misspelt
``bidd`` must not silently bid 0). OpenAI's sampling fields (temperature, top_p, stop, seed, …)
are accepted, range-checked and ignored: the simulated engines do not sample from a model.
Two fields are ours: ``bid`` (the most the user pays for this request, finite, 0 ≤ bid ≤
``MAX_BID``) and, in responses, the ``disagg`` object (what the auction and router decided).

OpenAI's own rules hold where OpenAI states them, so a body OpenAI would refuse is refused here
too (400 naming the field): the five roles (system, developer, user, assistant, tool), content
on every message but an assistant's that calls tools or refuses, ``tool_call_id`` on tool
messages only, at most 4 ``stop`` strings, at most 16 ``metadata`` pairs (keys ≤ 64 characters,
values ≤ 512), ``logit_bias`` values in [-100, 100]. Where OpenAI states no bound we set one
(``MAX_TOOLS`` tools, ``MAX_LOGIT_BIAS`` biases, ``MAX_SCHEMA_BYTES`` of JSON per schema), so
nothing a client sends is unbounded even under the body's size limit.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

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


MAX_STOP = 4  # OpenAI: up to 4 sequences
MAX_TOOLS = 128  # OpenAI documents 128 functions per request
MAX_TOOL_CALLS = 128
MAX_LOGIT_BIAS = 1024
MAX_METADATA = 16  # OpenAI: 16 pairs, keys ≤ 64 characters, values ≤ 512
MAX_SCHEMA_BYTES = 64 << 10  # a tool's parameters or a response format's schema, as JSON
MAX_ARGUMENTS_CHARS = 64 << 10  # an earlier turn's tool-call arguments (a JSON string)


# Any: a JSON schema of the client's, passed on untouched (bounded in size only).
def _bounded_json(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None and len(json.dumps(value)) > MAX_SCHEMA_BYTES:
        raise ValueError(f"at most {MAX_SCHEMA_BYTES} bytes of JSON")
    return value


Short = Annotated[str, StringConstraints(max_length=_SHORT)]
Schema = Annotated[dict[str, Any] | None, AfterValidator(_bounded_json)]
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Stop = Short | Annotated[list[Short], Field(max_length=MAX_STOP)]
LogitBias = Annotated[
    dict[
        Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")],  # a token id
        Annotated[float, Field(ge=-100.0, le=100.0)],
    ],
    Field(max_length=MAX_LOGIT_BIAS),
]
Metadata = Annotated[
    dict[Annotated[str, StringConstraints(max_length=64)],
         Annotated[str, StringConstraints(max_length=512)]],
    Field(max_length=MAX_METADATA),
]  # fmt: skip
Role = Literal["system", "developer", "user", "assistant", "tool"]


class FunctionCall(StrictModel):
    name: FunctionName
    arguments: str = Field(max_length=MAX_ARGUMENTS_CHARS)


class ToolCall(StrictModel):
    """A tool call of an earlier assistant turn (accepted, not rendered: no tool runs here)."""

    id: str = Field(min_length=1, max_length=_SHORT)
    type: Literal["function"]
    function: FunctionCall


class FunctionDefinition(StrictModel):
    name: FunctionName
    description: str | None = Field(default=None, max_length=8192)
    parameters: Schema = None
    strict: bool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: FunctionName


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(StrictModel):
    name: FunctionName
    description: str | None = Field(default=None, max_length=8192)
    schema_: Schema = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatMessage(StrictModel):
    """One turn. Fields are checked in this order, so ``content`` (last) sees the others."""

    role: Role
    name: str | None = Field(default=None, max_length=_SHORT)
    tool_calls: list[ToolCall] | None = Field(default=None, min_length=1, max_length=MAX_TOOL_CALLS)
    refusal: str | None = Field(default=None, max_length=8192)
    tool_call_id: str | None = Field(
        default=None, min_length=1, max_length=_SHORT, validate_default=True
    )
    content: str | list[TextPart] | None = Field(default=None, validate_default=True)

    @field_validator("tool_calls", "refusal")
    @classmethod
    def _assistant_only(cls, value: object, info: ValidationInfo) -> object:
        role = info.data.get("role")
        if value is not None and role != "assistant":
            raise ValueError(f"only an assistant message carries {info.field_name}, not a {role}")
        return value

    @field_validator("tool_call_id")
    @classmethod
    def _tool_only(cls, value: str | None, info: ValidationInfo) -> str | None:
        role = info.data.get("role")
        if role == "tool" and value is None:
            raise ValueError("a tool message needs the tool_call_id it answers")
        if role != "tool" and value is not None:
            raise ValueError(f"only a tool message carries tool_call_id, not a {role}")
        return value

    @field_validator("content")
    @classmethod
    def _content_for_role(
        cls, value: str | list[TextPart] | None, info: ValidationInfo
    ) -> str | list[TextPart] | None:
        role = info.data.get("role")
        if (
            value is None
            and role is not None
            and not (
                role == "assistant" and (info.data.get("tool_calls") or info.data.get("refusal"))
            )
        ):
            raise ValueError(
                "an assistant message needs content unless it has tool_calls or a refusal"
                if role == "assistant" else f"a {role} message needs content"
            )  # fmt: skip
        return value

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
    stop: Stop | None = None
    logit_bias: LogitBias | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_CompletionBase):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: bool | None = None  # accepted; responses carry logprobs: null
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: Metadata | None = None
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
    suffix: str | None = Field(default=None, max_length=8192)
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
