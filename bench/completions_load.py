"""The load of ``bench/ingress.py``: closed-loop streamed ``POST /v1/completions`` with token-id
prompts over plain HTTP (``httpx``), the same requests to either system, one
:class:`~bench.load_stats.Sample` per request."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench.load_stats import Sample

__all__ = ["closed_loop", "make_prompts", "one_completion", "wait_ready"]

DRAIN_S = 20.0  # after a point, in-flight requests get this long to finish, then are cancelled
REQUEST_TIMEOUT_S = 120.0


def make_prompts(n: int, seed: int) -> list[list[int]]:
    """``n`` token-id prompts of the calibration workload's shape (chat template applied)."""
    from cluster.model_dir import ChatTokenizer, default_model_dir
    from disaggctl.load_client import PromptSource

    tokenizer = ChatTokenizer.from_dir(default_model_dir())
    source = PromptSource(seed)
    return [tokenizer.encode_chat(source.messages()) for _ in range(n)]


async def one_completion(client: Any, body: dict[str, Any], t_point: float) -> Sample:
    import httpx

    t0 = time.perf_counter()
    ttft: float | None = None
    chunks = 0
    status = 599  # unless the stream gets to [DONE]; 598: an SSE error event came
    failed = False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                status = resp.status_code
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        status = 598 if failed else 200
                        break
                    choices = json.loads(line[6:]).get("choices")
                    if choices is None:  # an SSE error event: the stream failed
                        failed = True
                        continue
                    if choices and choices[0].get("text"):
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        chunks += 1
    except (httpx.HTTPError, json.JSONDecodeError):
        status = 599
    t1 = time.perf_counter()
    error = None if status == 200 else str(status)
    return Sample(t0 - t_point, t1 - t_point, error, ttft, chunks)


async def closed_loop(
    base_url: str,
    prompts: Sequence[list[int]],
    *,
    clients: int,
    seconds: float,
    max_tokens: int,
    model: str,
) -> list[Sample]:
    """``clients`` clients, each sending its next request when the last one ended, for
    ``seconds``; then in-flight requests get ``DRAIN_S`` to finish."""
    import httpx

    order: Iterator[int] = itertools.count()
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        t_point = time.perf_counter()

        async def client_loop() -> None:
            while time.perf_counter() - t_point < seconds:
                prompt = prompts[next(order) % len(prompts)]
                body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                        "stream": True}  # fmt: skip
                samples.append(await one_completion(client, body, t_point))

        tasks = [asyncio.create_task(client_loop()) for _ in range(clients)]
        await asyncio.sleep(seconds)
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return samples


def wait_ready(base_url: str, body: dict[str, Any], timeout_s: float = 120.0) -> None:
    """Until one streamed request is answered (the deployment is up), then a few more."""
    deadline = time.monotonic() + timeout_s

    async def probe() -> str | None:
        import httpx

        async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as client:
            return (await one_completion(client, body, time.perf_counter())).error

    last: object = None
    while True:
        try:
            last = asyncio.run(probe())
            if last is None:
                break
        except Exception as exc:  # not listening yet
            last = exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base_url} did not answer within {timeout_s:g} s: {last}")
        time.sleep(0.5)
    for _ in range(4):
        asyncio.run(probe())
