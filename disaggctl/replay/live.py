"""A trace replayed against a running service over HTTP, open loop (docs/design.md §8).

The project's load client in its open-loop form: each request is sent at its scheduled time
(``start + arrival_s``) whatever the service is doing, as one streaming ``POST /v1/completions``
whose prompt is the trace's token ids (``cluster.traces.prompts``: the same ids the simulator
replays, so both see the same sharing) and whose ``max_tokens`` is the trace's output length. A
scheduler coroutine sleeps until each send time and starts the request as a task of its own, so
a slow answer never delays the next send; each request's body is built before its time comes.
How late each send was (its start against its schedule) is recorded: the replay is only as good
as that lateness.

With ``metrics_url`` the service's ``/metrics`` is read every second into ticks (regime, τ, ω,
poa_hat, pools), as ``disaggctl status`` reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from cluster.traces.prompts import TracePrompts
from cluster.traces.window import TraceRequest
from disaggctl.serve_cli import parse_status

__all__ = ["LiveRequest", "LiveRun", "lateness_summary", "replay_live"]

_MAX_IN_FLIGHT = 4096  # the HTTP client's connection pool
_AHEAD_S = 2.0  # request bodies are built up to this long before they are due
_AHEAD_MAX = 256  # and at most this many at once (bounded memory in a burst)
_SLACK_S = 0.01  # no body is built when the next send is due sooner than this


def _body(request: TraceRequest, prompts: TracePrompts, model: str) -> bytes:
    """The JSON body of one request (a few ms for a long prompt: built ahead of time)."""
    payload = {
        "model": model,
        "prompt": prompts.tokens(request).tolist(),
        "max_tokens": request.output_length,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(payload, separators=(",", ":")).encode()


@dataclass(frozen=True)
class LiveRequest:
    """One request as the client saw it; times in seconds since the replay began."""

    index: int
    line: int
    scheduled_s: float
    sent_s: float
    status: int
    ttft_s: float | None
    e2e_s: float
    itl_mean_s: float | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prefill_worker: int | None
    decode_worker: int | None
    error: str = ""

    @property
    def lateness_s(self) -> float:
        return self.sent_s - self.scheduled_s


@dataclass
class LiveRun:
    requests: list[LiveRequest]
    ticks: list[dict[str, Any]]
    seconds: float


def lateness_summary(requests: Iterable[LiveRequest], within_s: float = 0.05) -> dict[str, float]:
    """How late the sends were: quantiles (ms) and the share sent within ``within_s``."""
    late = sorted(r.lateness_s for r in requests)
    if not late:
        return {"sent": 0, "within_share": math.nan}

    def q(p: float) -> float:
        return 1000.0 * late[min(len(late) - 1, int(p * (len(late) - 1) + 0.5))]

    return {
        "sent": len(late),
        "lateness_p50_ms": q(0.50),
        "lateness_p99_ms": q(0.99),
        "lateness_max_ms": 1000.0 * late[-1],
        "within_ms": 1000.0 * within_s,
        "within_share": sum(1 for x in late if x <= within_s) / len(late),
    }


async def _send(
    client: httpx.AsyncClient,
    body: bytes,
    headers: dict[str, str],
) -> tuple[int, float | None, list[float], dict[str, Any], str]:
    """One streamed completion: (status, TTFT, token times, the last chunk's usage/disagg,
    error), times from the moment the request started."""
    t0 = time.perf_counter()
    ttft: float | None = None
    stamps: list[float] = []
    extra: dict[str, Any] = {}
    async with client.stream("POST", "/v1/completions", content=body, headers=headers) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")[:200]
            return resp.status_code, None, [], {}, text
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for key in ("usage", "disagg"):
                if chunk.get(key):
                    extra[key] = chunk[key]
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.perf_counter() - t0
                ttft = now if ttft is None else ttft
                stamps.append(now)
    return 200, ttft, stamps, extra, ""


def _result(
    request: TraceRequest, scheduled: float, sent: float, outcome: tuple[Any, ...], e2e: float
) -> LiveRequest:
    status, ttft, stamps, extra, error = outcome
    usage = extra.get("usage") or {}
    disagg = extra.get("disagg") or {}
    details = usage.get("prompt_tokens_details") or {}
    # Tokens arrive in frames (the service coalesces a stream's tokens every stream_chunk_s):
    # the mean inter-token latency is the first text's to the last's over the tokens between.
    tokens = int(usage.get("completion_tokens", len(stamps)))
    itl = (stamps[-1] - stamps[0]) / (tokens - 1) if len(stamps) > 1 and tokens > 1 else None
    return LiveRequest(
        index=request.index,
        line=request.line,
        scheduled_s=scheduled,
        sent_s=sent,
        status=status,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_mean_s=itl,
        prompt_tokens=int(usage.get("prompt_tokens", request.input_length)),
        cached_tokens=int(details.get("cached_tokens", disagg.get("cached_tokens", 0)) or 0),
        output_tokens=tokens,
        prefill_worker=disagg.get("prefill_worker"),
        decode_worker=disagg.get("decode_worker"),
        error=error,
    )


async def _poll(url: str, start: float, ticks: list[dict[str, Any]], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        while not stop.is_set():
            try:
                status = parse_status((await client.get(url)).text)
            except httpx.HTTPError:
                status = {}
            ticks.append({"t": time.perf_counter() - start, **status})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def _replay(
    base_url: str,
    requests: Iterator[TraceRequest],
    prompts: TracePrompts,
    *,
    model: str,
    api_key: str | None,
    metrics_url: str | None,
    timeout_s: float,
    on_progress: Callable[[int, int], None] | None,
) -> LiveRun:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    limits = httpx.Limits(max_connections=_MAX_IN_FLIGHT, max_keepalive_connections=_MAX_IN_FLIGHT)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    results: list[LiveRequest] = []
    ticks: list[dict[str, Any]] = []
    tasks: set[asyncio.Task[None]] = set()
    stop = asyncio.Event()
    sent_count = [0]
    start = time.perf_counter() + 0.5  # the first body is built before the clock starts
    poller = asyncio.create_task(_poll(metrics_url, start, ticks, stop)) if metrics_url else None

    async def run_one(request: TraceRequest, body: bytes, scheduled: float) -> None:
        sent = time.perf_counter() - start
        try:
            outcome: tuple[Any, ...] = await _send(client, body, headers)
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            outcome = (599, None, [], {}, f"{type(exc).__name__}: {exc}"[:200])
        e2e = time.perf_counter() - start - sent
        results.append(_result(request, scheduled, sent, outcome, e2e))
        if on_progress is not None:
            on_progress(sent_count[0], len(results))

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        ahead: deque[tuple[TraceRequest, bytes]] = deque()
        pending = iter(requests)
        exhausted = False

        def build_one() -> bool:
            nonlocal exhausted
            request = None if exhausted else next(pending, None)
            if request is None:
                exhausted = True
                return False
            ahead.append((request, _body(request, prompts, model)))
            return True

        while ahead or build_one():
            due = start + ahead[0][0].arrival_s
            # Bodies are built in the slack before the next send, never in its way: one more
            # only while that send is further off than _SLACK_S (a body takes a few ms).
            while (
                len(ahead) < _AHEAD_MAX
                and due - time.perf_counter() > _SLACK_S
                and ahead[-1][0].arrival_s < time.perf_counter() - start + _AHEAD_S
                and build_one()
            ):
                pass
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            request, body = ahead.popleft()
            task = asyncio.create_task(run_one(request, body, request.arrival_s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent_count[0] += 1
            if on_progress is not None:
                on_progress(sent_count[0], len(results))
            await asyncio.sleep(0)  # let it start its send before anything else is built
        while tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)
    stop.set()
    if poller is not None:
        await poller
    results.sort(key=lambda r: r.index)
    return LiveRun(results, ticks, time.perf_counter() - start)


def replay_live(
    base_url: str,
    requests: Iterator[TraceRequest],
    prompts: TracePrompts,
    *,
    model: str,
    api_key: str | None = None,
    metrics_url: str | None = None,
    timeout_s: float = 600.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> LiveRun:
    """Replay ``requests`` against the service at ``base_url`` (module docstring)."""
    return asyncio.run(
        _replay(
            base_url, requests, prompts, model=model, api_key=api_key, metrics_url=metrics_url,
            timeout_s=timeout_s, on_progress=on_progress,
        )
    )  # fmt: skip
