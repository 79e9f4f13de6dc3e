"""The HTTP edge (cluster/serve/app.py; docs/design.md "Serve runtime", §5) against a fake
request path, through the official ``openai`` client in-process (no sockets, no Ray)."""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from cluster.model_dir import ChatTokenizer, build_model_dir
from cluster.serve.app import build_app
from cluster.serve.path_types import (
    Admitted,
    Finished,
    PathError,
    PathEvent,
    PathRequest,
    Routed,
    TokenChunk,
)
from cluster.serve.users import ANONYMOUS, Users, UsersFile, hash_key

KEY, MODEL = "sk-alice-secret", "disagg-tiny"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


class Clock:
    """A manual clock: the fake path moves it, so TTFT and ITL are exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakePath:
    """Admits at ``position`` expecting ``payment``, routes, yields ``chunks``, charges
    ``charged``. Knobs make it fail (``admit_error``, ``mid_error``) or wait forever
    (``hold_admission``, ``hold_after`` chunks) so a test can disconnect. ``outcome`` records
    how each request ended: "finished", "closed" (aclose/cancel) or "error"."""

    def __init__(self, chunks: Sequence[Sequence[int]], clock: Clock | None = None, *,
                 position: int = 3, payment: float = 0.75, charged: float = 0.5,
                 cached: int = 4, admit_error: PathError | None = None,
                 mid_error: PathError | None = None, hold_admission: bool = False,
                 hold_after: int | None = None) -> None:
        self.chunks = [list(c) for c in chunks]
        self.clock = clock
        self.position, self.payment, self.charged, self.cached = position, payment, charged, cached
        self.admit_error, self.mid_error = admit_error, mid_error
        self.hold_admission, self.hold_after = hold_admission, hold_after
        self.requests: list[PathRequest] = []
        self.outcome: dict[str, str] = {}
        self.waiting = asyncio.Event()  # set when the path blocks on a hold

    async def run(self, req: PathRequest) -> AsyncIterator[PathEvent]:
        self.requests.append(req)
        outcome = "closed"
        try:
            if self.admit_error is not None:
                outcome = "error"
                raise self.admit_error
            if self.hold_admission:
                await self._hold()
            yield Admitted(self.position, self.payment, "b-1", "auction")
            yield Routed(6, 1, 7, "transition", self.cached)
            for k, ids in enumerate(self.chunks):
                if k == self.hold_after:
                    await self._hold()
                if self.clock is not None:
                    self.clock.now += 0.25 if k == 0 else 0.02
                yield TokenChunk(ids)
            if self.mid_error is not None:
                outcome = "error"
                raise self.mid_error
            outcome = "finished"
            yield Finished(self.charged)
        finally:
            self.outcome[req.request_id] = outcome

    async def _hold(self) -> None:
        self.waiting.set()
        await asyncio.Event().wait()  # forever: only closing the iterator ends it


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return ChatTokenizer.from_dir(
        build_model_dir(tmp_path_factory.mktemp("m") / MODEL, context_tokens=1024))


@pytest.fixture(scope="module")
def out_ids(tok: ChatTokenizer) -> list[int]:
    return tok.sample_output_ids(seed=7, n=12)


def chunked(ids: list[int], sizes: Sequence[int] = (1, 2, 4, 5)) -> list[list[int]]:
    out, k = [], 0
    for s in sizes:
        out.append(ids[k:k + s])
        k += s
    return out


def users_file(allow_anonymous: bool = True) -> Users:
    file = UsersFile.model_validate({"users": [
        {"name": "alice", "key_sha256": hash_key(KEY), "budget": 10.0}]})
    return Users(file, allow_anonymous=allow_anonymous)


def make_app(tok: ChatTokenizer, path: Any, users: Users | None = None, **kw: Any) -> FastAPI:
    kw.setdefault("registry", CollectorRegistry())
    return build_app(path, users if users is not None else users_file(), tok, model_name=MODEL,
                     **kw)


def client(app: FastAPI, key: str = KEY) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key=key, http_client=http,
                              max_retries=0)


async def post(app: FastAPI, path: str, body: Any, headers: dict[str, str] | None = None,
               content: Any = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as http:
        hdrs = {"authorization": f"Bearer {KEY}", **(headers or {})}
        if content is not None:
            return await http.post(path, content=content, headers=hdrs)
        return await http.post(path, json=body, headers=hdrs)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- success ----------------------------------------------------------------------------------


def test_chat_without_streaming_answers_text_usage_disagg_and_headers(
        tok: ChatTokenizer, out_ids: list[int]) -> None:
    path = FakePath(chunked(out_ids))
    app = make_app(tok, path)

    async def main() -> Any:
        raw = await client(app).chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, extra_body={"bid": 1.5})
        return raw, raw.parse()

    raw, resp = run(main())
    assert raw.headers["x-disagg-payment"] == "0.5"  # charged, not the 0.75 expected
    assert raw.headers["x-disagg-position"] == "3"
    assert resp.choices[0].message.content == tok.decode(out_ids)
    assert resp.choices[0].finish_reason == "length"
    prompt = tok.encode_chat(MESSAGES)
    assert resp.usage.prompt_tokens == len(prompt) and resp.usage.completion_tokens == 12
    assert resp.usage.total_tokens == len(prompt) + 12
    assert resp.usage.prompt_tokens_details.cached_tokens == 4
    assert resp.model_extra["disagg"] == {
        "payment": 0.5, "position": 3, "batch_id": "b-1", "mode": "auction",
        "decode_worker": 6, "prefill_worker": 1, "policy_version": 7, "regime": "transition",
        "cached_tokens": 4}
    (req,) = path.requests
    assert (req.user, req.bid, req.tokens, req.max_tokens) == ("alice", 1.5, prompt, 12)
    assert path.outcome[req.request_id] == "finished"


def test_chat_stream_pieces_join_to_the_text_and_end_with_usage(
        tok: ChatTokenizer, out_ids: list[int]) -> None:
    path = FakePath(chunked(out_ids))
    app = make_app(tok, path)

    async def main() -> Any:
        raw = await client(app).chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, stream=True,
            stream_options={"include_usage": True}, extra_body={"bid": 1.5})
        return raw.headers, [c async for c in raw.parse()]

    headers, chunks = run(main())
    assert headers["x-disagg-payment"] == "0.75"  # a stream's headers: expected at admission
    assert headers["x-disagg-position"] == "3"
    assert headers["content-type"].startswith("text/event-stream")
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tok.decode(out_ids) == "".join(tok.decode_stream(out_ids))
    last, usage = chunks[-2], chunks[-1]
    assert last.choices[0].finish_reason == "length"
    assert last.model_extra["disagg"]["payment"] == 0.5  # what was charged, at the end
    assert usage.choices == [] and usage.usage.completion_tokens == 12
    assert usage.usage.prompt_tokens_details.cached_tokens == 4


def test_sse_framing_ends_with_done_and_omits_usage_unless_asked(
        tok: ChatTokenizer, out_ids: list[int]) -> None:
    app = make_app(tok, FakePath(chunked(out_ids)))
    body = {"model": MODEL, "prompt": "Once upon", "max_tokens": 12, "stream": True}
    r = run(post(app, "/v1/completions", body))
    events = r.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert all(p["object"] == "text_completion" and p["usage"] is None for p in payloads)
    assert "".join(p["choices"][0]["text"] for p in payloads) == tok.decode(out_ids)


def test_completions_with_text_and_with_token_ids(tok: ChatTokenizer,
                                                  out_ids: list[int]) -> None:
    path = FakePath(chunked(out_ids))
    app = make_app(tok, path)

    async def main() -> Any:
        c = client(app)
        plain = await c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12)
        ids = await c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=12)
        stream = await c.completions.create(model=MODEL, prompt="Once", max_tokens=12,
                                            stream=True, stream_options={"include_usage": True})
        return plain, ids, [c async for c in stream]

    plain, ids, chunks = run(main())
    assert plain.object == "text_completion" and plain.choices[0].text == tok.decode(out_ids)
    assert plain.usage.prompt_tokens == len(tok.encode("Once upon a time"))
    assert path.requests[1].tokens == [5, 6, 7] and ids.usage.prompt_tokens == 3
    assert "".join(c.choices[0].text for c in chunks if c.choices) == tok.decode(out_ids)
    assert chunks[-1].usage.completion_tokens == 12
    assert all(r.user == "alice" and r.bid == 0.0 for r in path.requests)


def test_default_max_tokens_fit_what_the_context_leaves(tok: ChatTokenizer) -> None:
    path = FakePath([[5]])
    app = make_app(tok, path)
    long_prompt = " ".join(["word"] * 900)  # ~900 of the 1024 tokens

    async def main() -> None:
        c = client(app)
        await c.chat.completions.create(model=MODEL, messages=MESSAGES)
        await c.completions.create(model=MODEL, prompt="Hi")
        await c.completions.create(model=MODEL, prompt=long_prompt, max_tokens=None)

    run(main())
    n_long = len(tok.encode(long_prompt))
    assert [r.max_tokens for r in path.requests] == [256, 16, min(16, 1024 - n_long)]


def test_body_bid_wins_over_the_x_bid_header(tok: ChatTokenizer) -> None:
    path = FakePath([[5]])
    app = make_app(tok, path)
    base = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}

    async def main() -> list[int]:
        return [
            (await post(app, "/v1/chat/completions", base, {"x-bid": "2.25"})).status_code,
            (await post(app, "/v1/chat/completions", {**base, "bid": 1.0},
                        {"x-bid": "9"})).status_code,
            # the header is not read when the body bids, so a bad one does not matter there
            (await post(app, "/v1/chat/completions", {**base, "bid": 0.5},
                        {"x-bid": "abc"})).status_code,
        ]

    assert run(main()) == [200, 200, 200]
    assert [r.bid for r in path.requests] == [2.25, 1.0, 0.5]


# --- errors -----------------------------------------------------------------------------------


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert r.headers["x-disagg-payment"] == "0"  # nothing charged
    return dict(body["error"])


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "disagg-tiny", "prompt": "a", "bid": -1}', "bid"),
    (b'{"model": "disagg-tiny", "prompt": "a", "bid": NaN}', "bid"),
    (b'{"model": "disagg-tiny", "prompt": "a", "bid": Infinity}', "bid"),
    (b'{"model": "disagg-tiny", "prompt": "a", "bid": "abc"}', "bid"),
    (b'{"model": "disagg-tiny", "prompt": "a", "bid": "1.5"}', "bid"),
    (b'{"model": "disagg-tiny", "prompt": "a", "bid": true}', "bid"),
    (b'{"model": "disagg-tiny", "prompt": "a", "bid": 1e13}', "bid"),
    (b'{"model": "disagg-tiny", "prompt": "a", "bidd": 1}', "bidd"),
    (b'{"model": "disagg-tiny", "prompt": "a", "n": 2}', "n"),
    (b'{"model": "disagg-tiny", "prompt": "a", "max_tokens": 0}', "max_tokens"),
    (b'{"model": "disagg-tiny", "prompt": ["a", 1]}', "prompt[0]"),
    (b'{"model": "disagg-tiny", "prompt": [99999999]}', "prompt"),
    (b'{"model": "disagg-tiny"}', "prompt"),
    (b'{"model": "disagg-tiny", "prompt": ', None),
    (b'[1, 2]', None),
    (b'\xff\xfe', None),
])
def test_bad_bodies_are_400_naming_the_field(tok: ChatTokenizer, raw: bytes,
                                             param: str | None) -> None:
    path = FakePath([[5]])
    r = run(post(make_app(tok, path), "/v1/completions", None,
                 {"content-type": "application/json"}, content=raw))
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param
    assert path.requests == []


def test_bad_x_bid_headers_are_400(tok: ChatTokenizer) -> None:
    path = FakePath([[5]])
    app = make_app(tok, path)
    body = {"model": MODEL, "prompt": "a"}
    for bad in ("abc", "nan", "inf", "-1", "1e13", ""):
        r = run(post(app, "/v1/completions", body, {"x-bid": bad}))
        assert (r.status_code, error_of(r)["param"]) == (400, "x-bid"), bad
    assert path.requests == []


def test_chat_validation_names_nested_fields(tok: ChatTokenizer) -> None:
    app = make_app(tok, FakePath([[5]]))
    bad_part = [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
    cases = [({"model": MODEL, "messages": []}, "messages"),
             ({"model": MODEL, "messages": [{"role": "User!", "content": "x"}]},
              "messages[0].role"),
             ({"model": MODEL, "messages": bad_part}, "messages[0].content[0].type")]
    for body, param in cases:
        r = run(post(app, "/v1/chat/completions", body))
        assert (r.status_code, error_of(r)["param"]) == (400, param)


def test_fastapi_validation_errors_become_400(tok: ChatTokenizer) -> None:
    app = make_app(tok, FakePath([[5]]))

    @app.get("/probe")
    async def probe(n: int) -> int:  # a route with FastAPI-validated parameters
        return n

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as http:
            return await http.get("/probe", params={"n": "x"})

    r = run(main())
    assert r.status_code == 400 and error_of(r)["param"] == "n"


def test_authentication(tok: ChatTokenizer) -> None:
    path = FakePath([[5]])
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}

    async def main() -> None:
        app = make_app(tok, path)
        with pytest.raises(openai.AuthenticationError) as e:
            await client(app, key="sk-wrong").chat.completions.create(**body)
        assert e.value.body["param"] == "authorization"
        # no key and anonymous allowed: fine at bid 0, 401 with a positive bid
        r = await post(app, "/v1/chat/completions", body, {"authorization": ""})
        assert r.status_code == 401  # an empty Authorization header is malformed
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as http:
            ok = await http.post("/v1/chat/completions", json=body)
            paid = await http.post("/v1/chat/completions", json={**body, "bid": 1.0})
        assert ok.status_code == 200 and path.requests[-1].user == ANONYMOUS
        assert paid.status_code == 401 and error_of(paid)["param"] == "bid"
        closed = make_app(tok, path, users_file(allow_anonymous=False))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=closed),
                                     base_url="http://test") as http:
            r = await http.post("/v1/chat/completions", json=body)
        assert r.status_code == 401 and error_of(r)["code"] == "missing_api_key"
        # no users file: every request is anonymous and keys are ignored
        open_app = make_app(tok, path, Users())
        await client(open_app, key="EMPTY").chat.completions.create(**body)
        assert path.requests[-1].user == ANONYMOUS
        with pytest.raises(openai.AuthenticationError):
            await client(open_app).chat.completions.create(**body, extra_body={"bid": 0.1})

    run(main())
    assert len(path.requests) == 2  # only the two that passed reached the path


@pytest.mark.parametrize(("status", "exc"), [
    (402, openai.APIStatusError), (503, openai.InternalServerError),
    (401, openai.AuthenticationError),
])
def test_path_errors_at_admission_keep_their_status(tok: ChatTokenizer, status: int,
                                                    exc: type[Exception]) -> None:
    path = FakePath([[5]], admit_error=PathError(status, "no"))
    app = make_app(tok, path)

    async def main(stream: bool) -> None:
        with pytest.raises(exc) as e:
            await client(app).chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=stream, extra_body={"bid": 20.0})
        assert isinstance(e.value, openai.APIStatusError) and e.value.status_code == status
        assert e.value.response.headers["x-disagg-payment"] == "0"

    run(main(False))
    run(main(True))  # a stream refused at admission still gets the real status
    assert set(path.outcome.values()) == {"error"}


def test_a_failure_mid_stream_is_an_sse_error_event(tok: ChatTokenizer,
                                                     out_ids: list[int]) -> None:
    path = FakePath(chunked(out_ids), mid_error=PathError(503, "decode worker died"))
    app = make_app(tok, path)

    async def main() -> list[Any]:
        got = []
        stream = await client(app).chat.completions.create(model=MODEL, messages=MESSAGES,
                                                           stream=True)
        with pytest.raises(openai.APIError, match="decode worker died"):
            async for c in stream:
                got.append(c)
        return got

    assert len(run(main())) >= 2  # the role chunk and some text came before the error
    r = run(post(app, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES}))
    assert r.status_code == 503 and error_of(r)["code"] == "unavailable"


class BrokenPath:
    """Paths that break the protocol or crash: the client gets a 500 without internals."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.closed = 0

    async def run(self, req: PathRequest) -> AsyncIterator[PathEvent]:
        try:
            if self.kind == "crash":
                raise KeyError("internal detail")
            if self.kind == "silent":
                return
            yield Admitted(0, 0.0, None, "fcfs")
            yield TokenChunk([5, 6])  # then ends without Finished
        finally:
            self.closed += 1


@pytest.mark.parametrize("kind", ["crash", "silent", "unfinished"])
def test_a_broken_path_is_a_500(tok: ChatTokenizer, kind: str) -> None:
    path = BrokenPath(kind)
    app = make_app(tok, path)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
    r = run(post(app, "/v1/chat/completions", body))
    assert r.status_code == 500 and error_of(r) == {
        "message": "internal error", "type": "server_error", "param": None,
        "code": "internal_error"}
    if kind == "unfinished":  # streaming, the failure comes after the text, as an event
        r = run(post(app, "/v1/chat/completions", {**body, "stream": True}))
        assert r.status_code == 200
        assert '"code":"internal_error"' in r.text and r.text.endswith("data: [DONE]\n\n")
    assert path.closed >= 1


def test_text_the_tokenizer_refuses_is_400(tok: ChatTokenizer) -> None:
    path = FakePath([[5]])
    app = make_app(tok, path)
    lone = b'{"model": "disagg-tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'
    r = run(post(app, "/v1/chat/completions", None, content=lone))
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    r = run(post(app, "/v1/completions", {"model": MODEL, "prompt": ""}))
    assert r.status_code == 400 and error_of(r)["param"] == "prompt"
    r = run(post(app, "/v1/completions", {"model": MODEL, "prompt": "a"},
                 {"content-length": "12x"}))
    assert r.status_code == 400
    assert path.requests == []


def test_too_large_bodies_and_prompts_are_413(tok: ChatTokenizer) -> None:
    path = FakePath([[5]])
    app = make_app(tok, path, max_body_bytes=1000)
    big = {"model": MODEL, "prompt": "x" * 2000}

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        for _ in range(40):
            yield b" " * 100

    async def main() -> None:
        r = await post(app, "/v1/completions", big)
        assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"
        r = await post(app, "/v1/completions", None, content=chunks())
        assert r.status_code == 413
        with pytest.raises(openai.APIStatusError) as e:  # prompt + max_tokens > context
            await client(make_app(tok, path)).completions.create(
                model=MODEL, prompt="Hello", max_tokens=1024)
        assert e.value.status_code == 413 and e.value.body["param"] == "max_tokens"
        with pytest.raises(openai.APIStatusError) as e:  # the prompt alone fills it
            await client(make_app(tok, path)).completions.create(
                model=MODEL, prompt=list(range(10, 1034)))
        assert e.value.status_code == 413 and e.value.body["code"] == "context_length_exceeded"

    run(main())
    assert path.requests == []


def test_unknown_model_is_404_and_every_response_has_the_headers(tok: ChatTokenizer) -> None:
    app = make_app(tok, FakePath([[5]]))

    async def main() -> None:
        with pytest.raises(openai.NotFoundError):
            await client(app).chat.completions.create(model="gpt-x", messages=MESSAGES)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as http:
            for r in (await http.get("/nope"), await http.get("/health"),
                      await http.get("/v1/models/gpt-x")):
                assert r.headers["x-disagg-payment"] == "0"
                assert r.headers["x-disagg-position"] == "-1"
            assert (await http.get("/v1/models/gpt-x")).status_code == 404

    run(main())


# --- disconnects ------------------------------------------------------------------------------


async def drive(app: FastAPI, body: dict[str, Any], *, spec: str = "2.3",
                on_send: Callable[[list[dict[str, Any]]], bool] = lambda m: False,
                gone: asyncio.Event | None = None) -> list[dict[str, Any]]:
    """Call the ASGI app as a server would; ``on_send`` says when the client has left."""
    raw = json.dumps(body).encode()
    gone = gone or asyncio.Event()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("t", 1), "server": ("t", 80),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode()),
                         (b"authorization", f"Bearer {KEY}".encode())]}
    sent: list[dict[str, Any]] = []
    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if gone.is_set() and spec >= "2.4":
            raise OSError("connection reset")
        sent.append(message)
        if on_send(sent):
            gone.set()

    await asyncio.wait_for(app(scope, receive, send), 5)
    return sent


def body_events(sent: list[dict[str, Any]]) -> int:
    return sum(1 for m in sent if m["type"] == "http.response.body" and m.get("body"))


STREAM = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "stream": True}


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_a_client_leaving_mid_stream_closes_the_path(tok: ChatTokenizer, out_ids: list[int],
                                                     spec: str) -> None:
    path = FakePath(chunked(out_ids), hold_after=None if spec == "2.4" else 2)
    app = make_app(tok, path)
    # 2.3: the server reports the disconnect while the path waits; 2.4: the next send fails
    sent = run(drive(app, STREAM, spec=spec, on_send=lambda s: body_events(s) >= 2))
    assert 2 <= body_events(sent) < len(out_ids)
    assert not any(b"[DONE]" in m.get("body", b"") for m in sent)
    assert list(path.outcome.values()) == ["closed"]  # never reached Finished


def test_a_client_leaving_while_queued_closes_the_path(tok: ChatTokenizer) -> None:
    path = FakePath([[5]], hold_admission=True)
    app = make_app(tok, path)

    async def main(stream: bool) -> list[dict[str, Any]]:
        gone = asyncio.Event()

        async def leave() -> None:
            await path.waiting.wait()
            gone.set()

        leaver = asyncio.create_task(leave())
        sent = await drive(app, {**STREAM, "stream": stream}, gone=gone)
        await leaver
        return sent

    for stream in (True, False):
        sent = run(main(stream))
        assert sent[0]["status"] == 499
    assert list(path.outcome.values()) == ["closed", "closed"]


@pytest.mark.parametrize("where", ["mid-stream", "queued"])
def test_a_cancelled_handler_closes_the_path(tok: ChatTokenizer, out_ids: list[int],
                                            where: str) -> None:
    """Ray Serve cancels the handler task when the client disconnects."""
    queued = where == "queued"
    path = FakePath(chunked(out_ids), hold_after=None if queued else 2, hold_admission=queued)
    app = make_app(tok, path)

    async def main() -> None:
        task = asyncio.create_task(drive(app, {**STREAM, "stream": not queued}))
        await path.waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert list(path.outcome.values()) == ["closed"]


# --- models, health, metrics, deployment ------------------------------------------------------


def test_models_health_and_metrics(tok: ChatTokenizer, out_ids: list[int]) -> None:
    clock = Clock()
    registry = CollectorRegistry()

    async def actors() -> str:
        return "# TYPE disagg_regime gauge\ndisagg_regime 1.0"

    async def broken() -> str:
        raise RuntimeError("an actor died")

    app = make_app(tok, FakePath(chunked(out_ids, (1, 2, 9)), clock), registry=registry,
                   clock=clock, metrics_text=actors)

    async def main() -> tuple[Any, httpx.Response, httpx.Response]:
        c = client(app)
        models = await c.models.list()
        await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12)
        with pytest.raises(openai.AuthenticationError):
            await client(app, "bad").chat.completions.create(model=MODEL, messages=MESSAGES)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as http:
            return models, await http.get("/health"), await http.get("/metrics")

    models, health, metrics = run(main())
    assert [m.id for m in models.data] == [MODEL]
    assert run(client(app).models.retrieve(MODEL)).id == MODEL
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert metrics.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "disagg_regime 1.0" in metrics.text and "disagg_ttft_seconds_bucket" in metrics.text
    value = registry.get_sample_value
    assert value("disagg_ttft_seconds_count") == 1
    assert value("disagg_ttft_seconds_sum") == pytest.approx(0.25)
    assert value("disagg_itl_seconds_count") == 11  # 2 + 9 tokens after the first chunk
    assert value("disagg_itl_seconds_sum") == pytest.approx(0.04)  # two gaps of 0.02
    assert value("disagg_requests_total", {"status": "ok"}) == 1
    assert value("disagg_requests_total", {"status": "401"}) == 1
    alone = make_app(tok, FakePath([[5]]), metrics_text=broken)

    async def scrape() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=alone),
                                     base_url="http://test") as http:
            return await http.get("/metrics")

    r = run(scrape())  # a failing metrics_text still leaves the ingress's own families
    assert r.status_code == 200 and "disagg_requests_total" in r.text


def test_metric_names_and_buckets_match_controller_metrics() -> None:
    from cluster.serve.ingress_metrics import IngressMetrics
    from telemetry import metrics as cm

    ours = IngressMetrics()
    for mine, theirs in ((ours.ttft, cm.TTFT), (ours.itl, cm.ITL), (ours.requests, cm.REQUESTS)):
        assert mine._name == theirs._name
        assert getattr(mine, "_upper_bounds", None) == getattr(theirs, "_upper_bounds", None)


def test_the_serve_deployment_serves_the_app_build_app_makes(
        tok: ChatTokenizer, out_ids: list[int], tmp_path: Path) -> None:
    from ray.serve import Application
    from ray.serve._private.http_util import ASGIAppReplicaWrapper

    from cluster.serve.deployment import (
        MAX_ONGOING_REQUESTS,
        IngressDeployment,
        OpenAIIngress,
        ingress_app,
    )

    model_dir = build_model_dir(tmp_path / MODEL, context_tokens=1024)
    path = FakePath(chunked(out_ids))
    replica_cls = IngressDeployment.func_or_class
    assert issubclass(replica_cls, OpenAIIngress)
    assert issubclass(replica_cls, ASGIAppReplicaWrapper)
    assert IngressDeployment.max_ongoing_requests == MAX_ONGOING_REQUESTS
    bound = ingress_app(lambda: path, model_name=MODEL, users=users_file(), num_replicas=2)
    assert isinstance(bound, Application)  # binding starts nothing

    shut: list[bool] = []

    async def aclose() -> None:  # the optional shutdown hook of the factory's path
        shut.append(True)

    path.aclose = aclose  # type: ignore[attr-defined]

    async def factory() -> FakePath:  # a factory may be async (a path that connects first)
        return path

    async def main() -> Any:
        # What a replica does (ray/serve/_private/replica.py): construct (Serve's wrapper
        # __init__ is async), call the build hook, install its app, run the lifespan.
        replica = replica_cls.__new__(replica_cls)
        await replica.__init__(factory, model_name=MODEL, model_dir=str(model_dir),
                               users=users_file().to_wire())
        app = await replica.__serve_build_asgi_app__()
        replica._set_asgi_app(app)
        await replica._run_asgi_lifespan_startup()
        assert isinstance(app, FastAPI) and replica.app is app and replica.path is path
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=replica),
                                 base_url="http://test")
        c = openai.AsyncOpenAI(base_url="http://test/v1", api_key=KEY, http_client=http)
        resp = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12)
        await http.aclose()
        await replica.__del__()  # Serve's replica teardown: the lifespan's shutdown
        with warnings.catch_warnings():  # GC calls the async __del__ once more, unawaited
            warnings.simplefilter("ignore", RuntimeWarning)
            del replica, http, c
            gc.collect()
        return resp

    resp = run(main())
    assert resp.choices[0].message.content == tok.decode(out_ids)
    assert path.requests[0].user == "alice"
    assert shut == [True]


def test_a_ray_without_the_replicas_cpus_is_refused_at_start() -> None:
    from cluster.models import ConfigError
    from cluster.serve.deployment import check_ingress_cpus

    check_ingress_cpus(4, 4.0)  # Serve can place all four
    with pytest.raises(ConfigError, match=r"ingress_replicas: 4 replicas reserve 4 CPUs.* has 2"):
        check_ingress_cpus(4, 2.0)
