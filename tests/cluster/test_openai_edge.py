"""OpenAI's own request rules at the ingress, through the official ``openai`` client: what OpenAI
refuses is refused here too (400 naming the field) and never reaches the request path; a tool
conversation OpenAI accepts is served."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from cluster.model_dir import ChatTokenizer
from tests.cluster.test_ingress_app import MODEL, FakePath, client, make_app, tok  # noqa: F401

TOOL_CALL = {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "content": "12 C"}]}, "messages[0].tool_call_id"),
        ({"stop": [str(i) for i in range(1000)]}, "stop"),
        ({"logit_bias": {"5": 1000}}, "logit_bias.5"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"tools": [{"type": "function", "function": {"name": "x y"}}]},
         "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ],
)
def test_what_openai_refuses_is_a_400_naming_the_field(
    tok: ChatTokenizer, kwargs: dict[str, Any], param: str  # noqa: F811
) -> None:
    path = FakePath([[5]])
    app = make_app(tok, path)
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

    async def main() -> None:
        with pytest.raises(openai.BadRequestError) as err:
            await client(app).chat.completions.create(**(body | kwargs))
        assert err.value.status_code == 400
        assert isinstance(err.value.body, dict) and err.value.body["param"] == param

    asyncio.run(main())
    assert path.requests == []  # refused at the edge: nothing admitted, nothing charged


def test_a_tool_conversation_openai_accepts_is_served(tok: ChatTokenizer) -> None:  # noqa: F811
    app = make_app(tok, FakePath([[5, 6]]))
    messages: list[Any] = [
        {"role": "developer", "content": "Use the tools."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "12 C and rain"},
    ]
    tools: list[Any] = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object",
                                              "properties": {"city": {"type": "string"}}}}}]

    async def main() -> Any:
        return await client(app).chat.completions.create(
            model=MODEL, messages=messages, tools=tools, tool_choice="none", stop=["\n\n"],
            metadata={"team": "search"}, max_tokens=2,
        )  # fmt: skip

    answer = asyncio.run(main())
    assert answer.choices[0].message.content
