"""Request and response shapes of the ingress (cluster/serve/openai_models.py, sse.py,
errors.py; docs/design.md "Serve runtime"), checked against the ``openai`` client's own types."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import Completion as OpenAICompletion
from openai.types.chat import ChatCompletion as OpenAIChat
from openai.types.chat import ChatCompletionChunk as OpenAIChunk
from pydantic import ValidationError

from cluster.ledger.sqlite import MAX_AMOUNT
from cluster.model_dir import ChatTokenizer, build_model_dir
from cluster.serve.errors import param_of, validation_error
from cluster.serve.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DisaggInfo,
    PromptTokensDetails,
    Usage,
)
from cluster.serve.path_types import Admitted, Finished, Routed
from cluster.serve.sse import RunState, Shapes, TextStream, format_amount

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return ChatTokenizer.from_dir(build_model_dir(tmp_path_factory.mktemp("m") / "t"))


def fails(model: Any, data: dict[str, Any]) -> str | None:
    try:
        model.model_validate(data)
    except ValidationError as e:
        return validation_error(e, data).param
    return None


def test_what_the_openai_client_sends_is_accepted() -> None:
    req = ChatCompletionRequest.model_validate({
        **CHAT, "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "12 C"},
            {"role": "developer", "content": "Answer in English."}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto", "logit_bias": {"50256": -100}, "metadata": {"team": "search"},
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "w", "schema": {"type": "object"}}},
        "max_completion_tokens": 9, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 1, "top_p": 0.5,
        "seed": 3, "stop": ["\n"], "user": "u-1", "bid": 2, "logprobs": False,
    })
    assert req.chat() == [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "a\nb"},
                          {"role": "assistant", "content": ""},
                          {"role": "tool", "content": "12 C"},
                          {"role": "developer", "content": "Answer in English."}]
    assert req.requested_max_tokens() == 9  # max_completion_tokens wins
    assert req.include_usage and req.bid == 2.0
    comp = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2], "max_tokens": 4})
    assert comp.prompt == [1, 2] and comp.requested_max_tokens() == 4
    assert not comp.include_usage and comp.bid is None
    # include_usage only counts on a stream
    assert not CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}).include_usage


@pytest.mark.parametrize(("extra", "param"), [
    ({"bid": -0.5}, "bid"), ({"bid": float("nan")}, "bid"), ({"bid": float("inf")}, "bid"),
    ({"bid": "1"}, "bid"), ({"bid": True}, "bid"), ({"bid": MAX_AMOUNT * 10}, "bid"),
    ({"n": 2}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1.0}, "max_tokens"),
    ({"temperature": 3}, "temperature"), ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "User", "content": "x"}]},
     "messages[1].role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "system", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": []}]},
     "messages[0].tool_calls"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
     "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "refusal": "no"}]}, "messages[0].refusal"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": "x" * 1000}, "stop"),
    ({"stop": ["ok", 5]}, "stop[1]"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}] * 129}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]},
     "tools[0].function.x"),
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"d": "x" * (70 << 10)}}}]}, "tools[0].function.parameters"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"logit_bias": {"50256": 101}}, "logit_bias.50256"),
    ({"logit_bias": {"the": 1}}, "logit_bias.the"),
    ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata.k"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type"),
    ({"messages": "hi"}, "messages"),
])
def test_bad_chat_fields_are_named(extra: dict[str, Any], param: str) -> None:
    assert fails(ChatCompletionRequest, {**CHAT, **extra}) == param


def test_completion_prompt_must_be_text_or_token_ids() -> None:
    base = {"model": "m"}
    assert fails(CompletionRequest, {**base, "prompt": ["a", "b"]}) == "prompt[0]"
    assert fails(CompletionRequest, {**base, "prompt": 5}) == "prompt"
    assert fails(CompletionRequest, base) == "prompt"
    assert fails(CompletionRequest, {**base, "prompt": "x", "best_of": 2}) == "best_of"


def test_param_of_skips_union_member_names() -> None:
    data = {"prompt": [1, "x"], "messages": [{"content": [{"type": "img"}]}]}
    assert param_of(("prompt", "list[int]", 1), data) == "prompt[1]"
    assert param_of(("messages", 0, "content", "list[TextPart]", 0, "type"), data) == \
        "messages[0].content[0].type"
    assert param_of(("missing", "deeper"), data) == "missing.deeper"
    assert param_of((), data) == ""


def usage() -> Usage:
    return Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=2))


def disagg() -> DisaggInfo:
    return DisaggInfo(payment=0.5, position=1, batch_id=None, mode="fcfs", decode_worker=2,
                      prefill_worker=None, policy_version=0, regime="below", cached_tokens=2)


def test_bodies_and_chunks_parse_as_the_openai_types() -> None:
    chat = Shapes(chat=True, request_id="r1", model="m", created=7)
    body = OpenAIChat.model_validate(chat.response("Hello", "length", usage(), disagg()))
    assert body.id == "chatcmpl-r1" and body.choices[0].message.content == "Hello"
    assert body.usage is not None and body.usage.prompt_tokens_details is not None
    assert body.usage.prompt_tokens_details.cached_tokens == 2
    assert body.model_extra is not None and body.model_extra["disagg"]["mode"] == "fcfs"
    frames = [*chat.first_chunks(), chat.delta("He"), chat.last_chunk("stop", disagg()),
              chat.usage_chunk(usage())]
    chunks = [OpenAIChunk.model_validate(json.loads(f.removeprefix(b"data: "))) for f in frames]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[1].choices[0].delta.content == "He"
    assert chunks[2].choices[0].finish_reason == "stop" and chunks[3].choices == []
    assert all(f.endswith(b"\n\n") and f.count(b"\n") == 2 for f in frames)
    comp = Shapes(chat=False, request_id="r2", model="m", created=7)
    assert comp.first_chunks() == []
    body2 = OpenAICompletion.model_validate(comp.response("Hi", "stop", usage(), disagg()))
    assert body2.id == "cmpl-r2" and body2.choices[0].text == "Hi"
    # Streamed completions are the same object with finish_reason null until the last chunk
    # (OpenAI's server does so; its client builds chunks without validating that field).
    delta, last, use = (json.loads(f.removeprefix(b"data: ")) for f in (
        comp.delta("x"), comp.last_chunk("length", disagg()), comp.usage_chunk(usage())))
    assert delta["choices"] == [{"index": 0, "text": "x", "logprobs": None,
                                 "finish_reason": None}]
    OpenAICompletion.model_validate(last)
    OpenAICompletion.model_validate(use)


def test_run_state_reports_what_the_path_said() -> None:
    run = RunState("r", 0.0, max_tokens=4, prompt_tokens=10)
    assert run.headers() == {"x-disagg-payment": "0", "x-disagg-position": "-1",
                             "x-disagg-request-id": "r"}
    assert run.disagg().mode is None and run.usage().prompt_tokens_details.cached_tokens == 0
    run.admitted = Admitted(position=2, payment=1.25, batch_id="b", mode="auction")
    run.routed = Routed(decode_worker=3, prefill_worker=0, policy_version=1, regime="saturated",
                        cached_tokens=99)  # clipped to the prompt
    run.n_out = 2
    assert run.headers()["x-disagg-payment"] == "1.25" and run.finish_reason() == "stop"
    run.finished = Finished(payment_charged=1e-6)
    assert run.headers()["x-disagg-payment"] == "1e-06"
    assert run.headers(charged=False)["x-disagg-payment"] == "0"
    assert run.usage().prompt_tokens_details.cached_tokens == 10
    assert format_amount(3.0) == "3" and float(format_amount(0.1)) == 0.1


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(text=TEXT, seed=st.integers(0, 2**32 - 1))
def test_text_stream_pieces_join_to_decode_stream(tok: ChatTokenizer, text: str,
                                                  seed: int) -> None:
    rng = random.Random(seed)
    ids = tok.encode(text) + tok.sample_output_ids(seed, 5) + tok.encode(" é漢🙂 x")
    stream, out, k = TextStream(tok), [], 0
    while k < len(ids):
        n = rng.randint(1, 4)
        out.append(stream.push(ids[k:k + n]))
        k += n
    out.append(stream.flush())
    assert "".join(out) == "".join(tok.decode_stream(ids)) == tok.decode(ids)
    assert "\ufffd" not in "".join(out[:-1]) or "\ufffd" in tok.decode(ids)
