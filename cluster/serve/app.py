"""The OpenAI-compatible HTTP edge of ``disaggctl serve`` (docs/design.md "Serve runtime", §5).

``build_app`` returns a FastAPI app: ``POST /v1/chat/completions`` and ``/v1/completions``
(streaming and not), ``GET /v1/models``, ``/health`` and ``/metrics``. A completion request is
checked in the order below; every check before the request path answers an error without
calling the path, so nothing is reserved or charged:

1. API key (``Authorization: Bearer``; see users.py) → 401;
2. body ≤ ``max_body_bytes`` (Content-Length, then the bytes actually read) → 413;
3. JSON object, model fields, bid (body ``bid`` wins over the ``x-bid`` header; the header is
   read only when the body has none) → 400 naming the field;
4. a positive bid needs an authenticated user → 401; unknown ``model`` → 404;
5. tokenize (in a thread: long prompts take a while) → 400 on text the tokenizer refuses;
   prompt + ``max_tokens`` beyond the model's context → 413.
Then the path runs: its ``PathError`` becomes that status (401 unknown user, 402 bid above the
remaining budget, 503 no worker after one retry); anything else it raises is a 500 without
details. Default max_tokens (absent from the body): 256 for chat, 16 for completions, cut to
what the context leaves.

The ``x-disagg-payment`` / ``x-disagg-position`` headers are on every response ("0" and "-1"
when the request was never admitted or failed). Without streaming they carry the payment
charged; a stream starts only after the path's first event (admission), so a request refused at
admission still gets its real status, and its headers carry the admission's position and
expected payment (the charge comes in the last chunk's ``disagg``). A failure after a stream
started is an SSE error event. A client that leaves, at any point, closes the path's iterator.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from cluster.model_dir import ChatTokenizer
from cluster.serve import openai_models as om
from cluster.serve.errors import (
    ApiError,
    as_api_error,
    header_bid,
    install_handlers,
    parse_json_object,
    rate_limited,
    read_body,
    unauthorized,
    validation_error,
)
from cluster.serve.ingress_metrics import IngressMetrics
from cluster.serve.limits import BODY_TIMEOUT_S, Limiter, Permit, RateLimited
from cluster.serve.path_types import (
    Admitted,
    Finished,
    PathEvent,
    PathRequest,
    RequestPath,
    Routed,
    TokenChunk,
)
from cluster.serve.sse import DONE, RunState, Shapes, TextStream, sse_json
from cluster.serve.streaming import (
    PAYMENT_HEADER,
    POSITION_HEADER,
    ClientGoneError,
    ClosingStream,
    DefaultHeaders,
    close_path,
    next_event,
    until_disconnect,
)
from cluster.serve.users import ANONYMOUS, Users

__all__ = ["MAX_BODY_BYTES", "PAYMENT_HEADER", "POSITION_HEADER", "body_limit", "build_app"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
BODY_BYTES_PER_TOKEN = 16  # a token id as JSON ("131071," is 7 bytes) or as text, with room


def body_limit(context_tokens: int) -> int:
    """The body limit for a model of ``context_tokens``: a prompt of the whole context fits, as
    token ids or as text, and never less than ``MAX_BODY_BYTES`` (2 MiB at 131,072 tokens)."""
    return max(MAX_BODY_BYTES, BODY_BYTES_PER_TOKEN * context_tokens)


METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_TIMEOUT_S = 5.0  # a hung actor must not hang the scrape


def build_app(
    path: RequestPath,
    users: Users,
    tokenizer: ChatTokenizer,
    *,
    model_name: str,
    max_body_bytes: int = MAX_BODY_BYTES,
    metrics_text: Callable[[], Awaitable[str]] | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    metrics_route: bool = True,
    limiter: Limiter | None = None,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """The ingress app over ``path``. ``metrics_text`` returns the Prometheus text of everything
    the ingress does not own (the actors' families, merged; it must not repeat the ingress's
    own three). ``clock`` times TTFT/ITL (wall seconds); ``on_shutdown`` runs at app shutdown.
    ``metrics_route`` False: no ``/metrics`` here (the service's metrics server has its own
    port, docs/design.md "Security model"); ``app.state.edge.metrics`` still counts.
    ``limiter``: per-identity limits (cluster/serve/limits.py), None: none; ``body_timeout_s``:
    a body not in by then is a 408 (``LimitSettings.body_timeout_s``)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await on_shutdown()

    app = FastAPI(title="disaggctl serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_handlers(app)
    app.add_middleware(DefaultHeaders)
    edge = _Edge(
        path, users, tokenizer, model_name, max_body_bytes, IngressMetrics(registry), clock,
        limiter, body_timeout_s,
    )  # fmt: skip
    app.state.edge = edge
    created = int(time.time())
    model_card = {"id": model_name, "object": "model", "created": created, "owned_by": "disaggctl"}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await edge.complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await edge.complete(request, chat=False)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, object]:
        if model != model_name:
            raise ApiError(
                404, f"model {model!r} is not served", param="model", code="model_not_found"
            )
        return model_card

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": model_name}

    if not metrics_route:
        return app

    @app.get("/metrics")
    async def metrics() -> Response:
        parts = [edge.metrics.text()]
        if metrics_text is not None:
            try:
                parts.append(await asyncio.wait_for(metrics_text(), METRICS_TIMEOUT_S))
            except Exception:  # the ingress's own families are still worth a scrape
                log.warning(
                    "metrics_text failed; serving the ingress's metrics only", exc_info=True
                )
        text = "".join(p if p.endswith("\n") else p + "\n" for p in parts if p)
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    return app


class _Edge:
    """The completion flow shared by both endpoints."""

    def __init__(
        self,
        path: RequestPath,
        users: Users,
        tokenizer: ChatTokenizer,
        model_name: str,
        max_body_bytes: int,
        metrics: IngressMetrics,
        clock: Callable[[], float],
        limiter: Limiter | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.path, self.users, self.tokenizer = path, users, tokenizer
        self.model_name, self.max_body_bytes = model_name, max_body_bytes
        self.metrics, self.clock, self.limiter = metrics, clock, limiter
        self.body_timeout_s = body_timeout_s

    async def complete(self, request: Request, *, chat: bool) -> Response:
        t0 = self.clock()
        request_id = uuid.uuid4().hex
        held: list[Permit] = []  # this request's permit, unless its stream takes it over
        try:
            return await self._complete(request, chat, t0, request_id, held)
        finally:
            for permit in held:
                permit.release()

    def _admit(self, user: str) -> Permit | None:
        """The identity's place under its limits (cluster/serve/limits.py), else a 429."""
        if self.limiter is None:
            return None
        try:
            return self.limiter.admit(user, anonymous=user == ANONYMOUS)
        except RateLimited as e:
            raise rate_limited(e.identity, e.reason, e.retry_after_s) from None

    async def _complete(
        self, request: Request, chat: bool, t0: float, request_id: str, held: list[Permit]
    ) -> Response:
        try:
            user = self._user(request)
            # The body first, within its deadline: a client that trickles it holds no place
            # under the limits ([21] 3), and a refusal afterwards costs one bounded read.
            raw = await read_body(request, self.max_body_bytes, self.body_timeout_s)
            permit = self._admit(user)
            if permit is not None:
                held.append(permit)
            data = parse_json_object(raw)
            model: type[om.ChatCompletionRequest | om.CompletionRequest] = (
                om.ChatCompletionRequest if chat else om.CompletionRequest
            )
            try:
                req = model.model_validate(data)
            except ValidationError as e:
                raise validation_error(e, data) from None
            bid = req.bid if req.bid is not None else header_bid(request.headers.get("x-bid"))
            if bid > 0 and user == ANONYMOUS:
                raise ApiError(
                    401,
                    "a positive bid needs an API key (Authorization: Bearer)",
                    param="bid",
                    code="missing_api_key",
                )
            if req.model != self.model_name:
                raise ApiError(
                    404,
                    f"model {req.model!r} is not served; this server serves {self.model_name!r}",
                    param="model",
                    code="model_not_found",
                )
            tokens = await self._tokenize(req)
            max_tokens = self._fit(req, len(tokens), chat)
        except ApiError as e:
            self.metrics.count(str(e.status))
            return e.response({"x-disagg-request-id": request_id})
        run = RunState(request_id, t0, max_tokens, len(tokens))
        shapes = Shapes(
            chat=chat, request_id=request_id, model=self.model_name, created=int(time.time())
        )
        events = self.path.run(PathRequest(request_id, user, bid, tokens, max_tokens))
        text = ""
        try:
            first = await until_disconnect(request, next_event(events))
            if first is None:
                raise RuntimeError("the request path ended without an event")
            ids = self._apply(run, first)
            if not req.stream:
                ids += await until_disconnect(request, self._drain(run, events))
                if run.finished is None:
                    raise RuntimeError("the request path ended without Finished")
                text = "".join(self.tokenizer.decode_stream(ids))
        except (ClientGoneError, asyncio.CancelledError) as e:
            self.metrics.count("disconnected")
            await close_path(events)
            if isinstance(e, asyncio.CancelledError):
                raise  # Serve cancelled the handler: the client is gone
            return Response(status_code=499)  # nobody reads it; nginx's "client closed"
        except Exception as e:
            err = as_api_error(e)
            self.metrics.count(str(err.status))
            await close_path(events)
            return err.response(run.headers(charged=False))
        if req.stream:
            permits, held[:] = list(held), []  # the stream's now: released when it ends
            return ClosingStream(
                self._stream(run, events, shapes, ids, req.include_usage, permits),
                media_type="text/event-stream",
                headers=run.headers(),
            )
        await close_path(events)
        self.metrics.count("ok")
        body = shapes.response(text, run.finish_reason(), run.usage(), run.disagg())
        return JSONResponse(body, headers=run.headers())

    def _user(self, request: Request) -> str:
        auth = request.headers.get("authorization")
        scheme, _, key = (auth or "").partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else ""
        if not self.users.configured:
            return ANONYMOUS  # keys are ignored: OpenAI clients send placeholders
        if auth is not None and not key:
            raise unauthorized("Authorization must be 'Bearer <key>'", "invalid_api_key")
        if not key:
            if self.users.allow_anonymous:
                return ANONYMOUS
            raise unauthorized("missing API key (Authorization: Bearer <key>)", "missing_api_key")
        name = self.users.authenticate(key)
        if name is None:
            raise unauthorized("unknown API key", "invalid_api_key")
        return name

    async def _tokenize(self, req: om.ChatCompletionRequest | om.CompletionRequest) -> list[int]:
        if isinstance(req, om.ChatCompletionRequest):
            param, work = "messages", asyncio.to_thread(self.tokenizer.encode_chat, req.chat())
        elif isinstance(req.prompt, str):
            param, work = "prompt", asyncio.to_thread(self.tokenizer.encode, req.prompt)
        else:
            if any(not 0 <= t < self.tokenizer.vocab_size for t in req.prompt):
                raise ApiError(
                    400,
                    f"prompt token ids must lie in [0, {self.tokenizer.vocab_size})",
                    param="prompt",
                )
            return list(req.prompt)
        try:
            tokens = await work
        except ValueError as e:
            raise ApiError(400, str(e), param=param) from None
        if not tokens:
            raise ApiError(400, "the prompt is empty", param=param)
        return tokens

    def _fit(
        self, req: om.ChatCompletionRequest | om.CompletionRequest, n_prompt: int, chat: bool
    ) -> int:
        """``max_tokens`` for the path: as asked, or the default cut to what the context
        leaves; 413 when the prompt and the output cannot fit."""
        context = self.tokenizer.context_tokens
        room = context - n_prompt
        asked = req.requested_max_tokens()
        if asked is not None and asked > room:
            raise ApiError(
                413,
                f"prompt ({n_prompt} tokens) + max_tokens ({asked}) exceeds "
                f"the model's context of {context} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if room < 1:
            raise ApiError(
                413,
                f"prompt ({n_prompt} tokens) leaves no room in the model's "
                f"context of {context} tokens",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        default = om.DEFAULT_CHAT_MAX_TOKENS if chat else om.DEFAULT_COMPLETION_MAX_TOKENS
        return asked if asked is not None else min(default, room)

    def _apply(self, run: RunState, ev: PathEvent) -> list[int]:
        """Record one event; the output token ids it carries."""
        if isinstance(ev, Admitted):
            run.admitted = ev
        elif isinstance(ev, Routed):
            run.routed = ev
        elif isinstance(ev, Finished):
            run.finished = ev
        elif isinstance(ev, TokenChunk) and ev.token_ids:
            now = self.clock()
            if run.t_last is None:
                self.metrics.ttft.observe(max(now - run.t0, 0.0))
            else:
                self.metrics.chunk(len(ev.token_ids), now - run.t_last)
            run.t_last = now
            run.n_out += len(ev.token_ids)
            return list(ev.token_ids)
        return []

    async def _drain(self, run: RunState, events: AsyncIterator[PathEvent]) -> list[int]:
        ids: list[int] = []
        async for ev in events:
            ids += self._apply(run, ev)
        return ids

    async def _stream(
        self,
        run: RunState,
        events: AsyncIterator[PathEvent],
        shapes: Shapes,
        first_ids: list[int],
        include_usage: bool,
        permits: list[Permit],
    ) -> AsyncIterator[bytes]:
        text = TextStream(self.tokenizer)
        status = "disconnected"  # unless the stream gets to its end or fails
        try:
            for chunk in shapes.first_chunks():
                yield chunk
            if first_ids and (piece := text.push(first_ids)):
                yield shapes.delta(piece)
            async for ev in events:
                if (ids := self._apply(run, ev)) and (piece := text.push(ids)):
                    yield shapes.delta(piece)
            if run.finished is None:
                raise RuntimeError("the request path ended without Finished")
            status = "ok"  # answered and charged, whether or not the client reads the end
            if piece := text.flush():
                yield shapes.delta(piece)
            yield shapes.last_chunk(run.finish_reason(), run.disagg())
            if include_usage:
                yield shapes.usage_chunk(run.usage())
            yield DONE
        except Exception as e:  # headers are gone: the failure travels as an SSE error event
            err = as_api_error(e)
            status = str(err.status)
            yield sse_json(err.body())
            yield DONE
        finally:
            self.metrics.count(status)  # first: under anyio's cancel scopes awaits may not return
            for permit in permits:
                permit.release()
            await close_path(events)
