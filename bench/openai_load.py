"""The load both sides of ``bench/dynamo.py`` get: closed-loop streamed chats through the official
``openai`` client, per concurrency level, and their summary (``bench.load_stats``: requests/s in
the counted window, TTFT P50/P99 to the first content chunk, errors)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import Any

from bench.load_stats import Sample, summarize

MODEL = "disagg-tiny"
SYSTEM_PROMPTS, SYSTEM_WORDS, QUESTION_WORDS = 8, 280, 24  # ~300-token system prompts
PROMPTS_PER_LEVEL = 4000  # each level its own distinct user turns, the same on both systems
DRAIN_S = 30.0
REQUEST_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 180.0
Levels = dict[int, dict[str, Any]]  # concurrency level -> its summary


def make_prompts(total: int, seed: int) -> list[list[dict[str, str]]]:
    from disaggctl.load_client import PromptSource

    source = PromptSource(seed, templates=SYSTEM_PROMPTS, template_words=SYSTEM_WORDS,
                          question_words=QUESTION_WORDS)  # fmt: skip
    return [source.messages() for _ in range(total)]


def make_client(base_url: str, clients: int) -> Any:
    import httpx2  # what openai's client is built on
    import openai

    limits = httpx2.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    http = openai.DefaultAsyncHttpxClient(limits=limits, trust_env=False)
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                              timeout=REQUEST_TIMEOUT_S, http_client=http)  # fmt: skip


async def one_request(client: Any, messages: Any, max_tokens: int, t_point: float) -> Sample:
    import httpx2
    import openai

    t0 = time.perf_counter()
    ttft: float | None = None
    chunks = 0
    error: str | None = None
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                chunks += 1
    except (openai.OpenAIError, httpx2.HTTPError) as exc:
        error = type(exc).__name__
    t1 = time.perf_counter()
    return Sample(t0 - t_point, t1 - t_point, error, ttft, chunks)


async def closed_loop(base_url: str, prompts: Sequence[Any], clients: int, seconds: float,
                      max_tokens: int) -> list[Sample]:  # fmt: skip
    """``clients`` clients, each sending its next request when its last one ended, for
    ``seconds``; in-flight requests then get ``DRAIN_S`` to finish."""
    order = itertools.count()
    samples: list[Sample] = []
    client = make_client(base_url, clients)
    async with client:
        t_point = time.perf_counter()

        async def loop() -> None:
            while time.perf_counter() - t_point < seconds:
                messages = prompts[next(order) % len(prompts)]
                samples.append(await one_request(client, messages, max_tokens, t_point))

        tasks = [asyncio.create_task(loop()) for _ in range(clients)]
        _, pending = await asyncio.wait(tasks, timeout=seconds + DRAIN_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return samples


async def closed_loop_over(urls: Sequence[str], prompts: Sequence[Any], clients: int,
                           seconds: float, max_tokens: int) -> list[list[Sample]]:  # fmt: skip
    """:func:`closed_loop` with the ``clients`` split evenly over ``urls`` (client k on
    ``urls[k % len(urls)]``, each its own share of the prompts): the samples per URL."""
    n = len(urls)
    loops = [
        closed_loop(url, prompts[i::n], len(range(i, clients, n)), seconds, max_tokens)
        for i, url in enumerate(urls)
    ]
    return list(await asyncio.gather(*loops))


def wait_answering(base_url: str, messages: Any, max_tokens: int) -> None:
    """Until one streamed request is answered with content, then a few more (warm-up)."""
    deadline = time.monotonic() + READY_TIMEOUT_S

    async def probe() -> Sample:
        async with make_client(base_url, 1) as client:
            return await one_request(client, messages, max_tokens, time.perf_counter())

    while (last := asyncio.run(probe())).error is not None or last.ttft_s is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base_url} did not answer within {READY_TIMEOUT_S:g} s: {last}")
        time.sleep(0.5)
    for _ in range(4):
        asyncio.run(probe())


def run_levels(base_url: str, prompts: Sequence[Any], args: argparse.Namespace,
               bar: Any) -> Levels:  # fmt: skip
    wait_answering(base_url, prompts[-1], args.max_tokens)
    out = {}
    for k, clients in enumerate(args.levels):
        level_prompts = prompts[k * PROMPTS_PER_LEVEL : (k + 1) * PROMPTS_PER_LEVEL]
        samples = asyncio.run(
            closed_loop(base_url, level_prompts, clients, args.seconds, args.max_tokens)
        )
        out[clients] = summarize(samples, args.warmup, args.seconds)
        bar.update(1)
        time.sleep(1.0)  # the last requests' bookkeeping settles
    return out
