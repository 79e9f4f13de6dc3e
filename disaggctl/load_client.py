"""A closed-loop HTTP load client for the live service (docs/design.md "Serve runtime").

``C(t)`` clients each send one streaming chat completion at a time, over the OpenAI API, and
start the next when the last one ends. ``C(t)`` follows a schedule of phases (a linear ramp from
the previous level over ``ramp_s``, then a hold), so a run goes through calm, the knee, a
saturated hold and a spike. Prompts follow the calibration workload: one of five shared system
templates (so prefixes repeat and hit the KV cache) and a short unique question. A share of the
clients are bidding users with keys; the rest are anonymous and bid 0.

Each finished request becomes a :class:`ClientResult` with wall-clock TTFT, mean ITL, E2E, HTTP
status, the payment and queue position the service reported, and its phase (by start time:
requests are attributed to the phase in which they arrived).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from cluster.model_dir import load_words
from cluster.sim.workloads import output_length_range

__all__ = [
    "Bidder",
    "ClientResult",
    "LoadPhase",
    "LoadRun",
    "PromptSource",
    "output_lengths",
    "run_load",
]


@dataclass(frozen=True)
class LoadPhase:
    """Hold ``concurrency`` clients for ``seconds``, reached by a linear ramp of ``ramp_s``."""

    name: str
    seconds: float
    concurrency: int
    ramp_s: float = 1.0

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and 0 <= self.ramp_s <= self.seconds):
            raise ValueError(f"phase {self.name!r}: need seconds > 0 and 0 <= ramp_s <= seconds")
        if not 0 <= self.concurrency <= 4096:
            raise ValueError(f"phase {self.name!r}: concurrency must be in [0, 4096]")


@dataclass(frozen=True)
class Bidder:
    """A user with a key who bids ``bid`` per request on a share ``share`` of the clients."""

    name: str
    key: str
    bid: float
    share: float


@dataclass(frozen=True)
class ClientResult:
    user: str
    phase: str
    started: float  # wall seconds since the run began
    status: int
    ttft_s: float | None
    itl_s: float | None
    e2e_s: float
    tokens: int
    payment: float
    position: int
    error: str = ""


class PromptSource:
    """Chat messages shaped like the calibration workload: five shared system templates of
    about ``template_words`` words, and a unique question of about ``question_words``."""

    def __init__(
        self, seed: int = 0, templates: int = 5, template_words: int = 96, question_words: int = 24
    ) -> None:
        self._words = [w for w in load_words() if w.isalpha()][:2000]
        rng = random.Random(seed)
        self.templates = [
            "You are assistant "
            + str(k)
            + ". "
            + " ".join(rng.choices(self._words, k=template_words))
            for k in range(templates)
        ]
        self._rng = rng
        self._question_words = question_words

    def messages(self) -> list[dict[str, str]]:
        template = self._rng.choice(self.templates)
        question = " ".join(self._rng.choices(self._words, k=self._question_words)) + "?"
        return [{"role": "system", "content": template}, {"role": "user", "content": question}]


def concurrency_at(phases: Sequence[LoadPhase], t: float) -> tuple[str, int]:
    """The phase and the number of clients ``t`` seconds into the run (0 after the last)."""
    previous = 0
    start = 0.0
    for phase in phases:
        if t < start + phase.seconds:
            into = t - start
            if phase.ramp_s > 0 and into < phase.ramp_s:
                level = previous + (phase.concurrency - previous) * into / phase.ramp_s
                return phase.name, round(level)
            return phase.name, phase.concurrency
        previous, start = phase.concurrency, start + phase.seconds
    return "", 0


@dataclass
class LoadRun:
    results: list[ClientResult]
    seconds: float


async def _one_request(
    client: httpx.AsyncClient,
    messages: list[dict[str, str]],
    max_tokens: int,
    key: str | None,
    bid: float,
    model: str,
) -> tuple[int, float | None, list[float], int, float, int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "bid": bid,
    }
    t0 = time.perf_counter()
    ttft: float | None = None
    stamps: list[float] = []
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        payment = float(resp.headers.get("x-disagg-payment", 0) or 0)
        position = int(float(resp.headers.get("x-disagg-position", 0) or 0))
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")[:200]
            return resp.status_code, None, [], 0, payment, position, text
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if not choices or not (choices[0].get("delta") or {}).get("content"):
                continue
            now = time.perf_counter() - t0
            if ttft is None:
                ttft = now
            stamps.append(now)
            tokens += 1
    return 200, ttft, stamps, tokens, payment, position, ""


def output_lengths(max_tokens: int, range_ratio: float, seed: int) -> Callable[[], int]:
    """Each call, the next request's ``max_tokens``: uniform over the integers in
    [L(1 - r), L(1 + r)], L = ``max_tokens``, r = ``range_ratio``
    (``cluster.sim.workloads.output_length_range``), from a seeded stream of its own so that the
    users' draws do not depend on r."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    shortest, longest = output_length_range(max_tokens, range_ratio, name="max_tokens_range_ratio")
    draws = random.Random(seed)
    return lambda: draws.randint(shortest, longest)


async def run_load(
    base_url: str,
    phases: Sequence[LoadPhase],
    *,
    bidders: Sequence[Bidder] = (),
    anonymous_key: str | None = None,
    max_tokens: int = 64,
    max_tokens_range_ratio: float = 0.0,
    model: str = "disagg-tiny",
    seed: int = 0,
    timeout_s: float = 300.0,
    on_tick: Callable[[float, str, int, Sequence[ClientResult]], None] | None = None,
) -> LoadRun:
    """Drive the service through ``phases``; ``on_tick(t, phase, clients, results)`` each second.

    With ``max_tokens_range_ratio`` r > 0 each request asks for a length drawn uniformly from
    the integers in [L(1 - r), L(1 + r)], L = ``max_tokens`` (the simulator's rule,
    ``cluster.sim.template_source.TemplateSource``), from its own seeded stream.
    """
    next_length = output_lengths(max_tokens, max_tokens_range_ratio, seed + 2)
    prompts = PromptSource(seed)
    rng = random.Random(seed + 1)
    results: list[ClientResult] = []
    total = sum(p.seconds for p in phases)
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    start = time.perf_counter()
    active: dict[int, asyncio.Task[None]] = {}

    def pick_user() -> tuple[str, str | None, float]:
        x = rng.random()
        for b in bidders:
            if x < b.share:
                return b.name, b.key, b.bid
            x -= b.share
        return "anonymous", anonymous_key, 0.0

    async def client_loop(slot: int, client: httpx.AsyncClient) -> None:
        while True:
            t = time.perf_counter() - start
            phase, level = concurrency_at(phases, t)
            if slot >= level:
                return
            user, key, bid = pick_user()
            t_req = time.perf_counter()
            try:
                length = next_length()
                status, ttft, stamps, tokens, paid, position, error = await _one_request(
                    client, prompts.messages(), length, key, bid, model
                )
            except (httpx.HTTPError, json.JSONDecodeError) as exc:
                status, ttft, stamps, tokens, paid, position = 599, None, [], 0, 0.0, 0
                error = f"{type(exc).__name__}: {exc}"[:200]
            e2e = time.perf_counter() - t_req
            itl = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
            results.append(
                ClientResult(
                    user,
                    phase,
                    t_req - start,
                    status,
                    ttft,
                    itl,
                    e2e,
                    tokens,
                    paid,
                    position,
                    error,
                )
            )

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        while (t := time.perf_counter() - start) < total:
            phase, level = concurrency_at(phases, t)
            for slot in range(level):
                task = active.get(slot)
                if task is None or task.done():
                    active[slot] = asyncio.create_task(client_loop(slot, client))
            if on_tick is not None:
                on_tick(t, phase, sum(not task.done() for task in active.values()), results)
            await asyncio.sleep(min(1.0, max(0.0, total - t)))
        # The last phase is over: let in-flight requests finish (bounded by the HTTP timeout).
        await asyncio.gather(*active.values(), return_exceptions=True)
    return LoadRun(results, time.perf_counter() - start)


def by_phase(results: Sequence[ClientResult]) -> Mapping[str, list[ClientResult]]:
    out: dict[str, list[ClientResult]] = {}
    for r in results:
        out.setdefault(r.phase, []).append(r)
    return out
