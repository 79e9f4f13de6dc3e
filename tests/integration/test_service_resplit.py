"""The second lever on the live service (docs/design.md §4 "Two levers", §5): the controller
actor moves a decode worker actor to prefill while requests stream through the ingress, then
moves it back, so the shared service ends as it began (1P/2D, same worker ids).

Checked: every request in flight during the re-split is answered (the official ``openai``
client, through the ingress); ``resplit_start → drained → warm`` arrives on
``disagg.<ns>.pools``; the new prefill worker then receives prefill work (the router actor's
per-worker counts, and the responses' ``disagg.prefill_worker``); ``disagg_pool_workers{role}``
and ``disagg_resplits_total`` on ``/metrics`` show it. The warm-up is the profile's
``role_switch_s`` (30 s) at speed-up 4: 7.5 s per move.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import nats
import openai
import pytest
import ray

from cluster.nats_auth import connect_options
from tests.integration.live_service import (
    HTTP_TIMEOUT_S,
    MODEL,
    NAMESPACE,
    LiveService,
    key,
    metric_values,
    until,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

# Distinct long prompts: each misses the decode worker's cache by far more than the profile's
# local_prefill_max_tokens, so it is prefilled on a prefill worker.
PROMPT = "Request {i}: describe the harbour town of number {i} and its lighthouse keepers. " * 12
MOVE_TIMEOUT_S = 40.0


async def _ask(client: openai.AsyncOpenAI, i: int, max_tokens: int) -> dict[str, Any]:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT.format(i=i)}],
        max_tokens=max_tokens,
        stream=True,
    )
    text, disagg, finish = "", None, None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        disagg = (chunk.model_extra or {}).get("disagg") or disagg
    return {"text": text, "disagg": disagg, "finish": finish}


async def _traffic(client: openai.AsyncOpenAI, stop: asyncio.Event, out: list[Any]) -> None:
    """Waves of 8 concurrent streams until ``stop``: some are always in flight."""
    i = 0
    while not stop.is_set():
        wave = [_ask(client, 1000 + i + k, 48) for k in range(8)]
        i += 8
        out.extend(await asyncio.gather(*wave, return_exceptions=True))


def _metrics(live: LiveService) -> str:
    return httpx.get(live.metrics_url, timeout=HTTP_TIMEOUT_S).text


def test_resplit_moves_a_decode_worker_to_prefill_without_losing_requests(
    live_service: LiveService,
) -> None:
    h = live_service.handles
    before_total = sum(metric_values(_metrics(live_service), "disagg_resplits_total").values())

    async def main() -> tuple[dict[str, Any], list[Any], list[Any], list[dict[str, Any]]]:
        nc = await nats.connect(live_service.nats.url, **connect_options("observer"))
        pools_events: list[dict[str, Any]] = []

        async def on_pools(msg: Any) -> None:
            pools_events.append(json.loads(msg.data))

        await nc.subscribe(f"disagg.{NAMESPACE}.pools", cb=on_pools)
        await nc.flush()
        client = openai.AsyncOpenAI(
            base_url=live_service.url + "/v1", api_key=key("load"), max_retries=0,
            timeout=HTTP_TIMEOUT_S,
        )  # fmt: skip
        during: list[Any] = []
        stop = asyncio.Event()
        traffic = asyncio.ensure_future(_traffic(client, stop, during))
        await asyncio.sleep(0.5)  # requests in flight on both decode workers
        moved = await asyncio.wait_for(
            h.controller.resplit_now.remote("prefill", "integration test"), MOVE_TIMEOUT_S
        )
        stop.set()
        await traffic
        # The new prefill worker takes prefill work: distinct long prompts, several at once.
        after = await asyncio.gather(
            *(_ask(client, 5000 + i, 4) for i in range(24)), return_exceptions=True
        )
        await nc.flush()
        await asyncio.sleep(0.3)
        await nc.close()
        return moved, during, list(after), pools_events

    try:
        moved, during, after, events = asyncio.run(asyncio.wait_for(main(), 90))
        assert moved.result == "warm", moved
        wid = moved.pools.steps[-1].worker_id
        assert moved.pools.prefill == tuple(sorted([0, wid])) and len(moved.pools.decode) == 1

        # No request in flight during the re-split is lost.
        failed = [r for r in during + after if isinstance(r, BaseException)]
        assert not failed, f"{len(failed)} of {len(during) + len(after)} failed: {failed[:3]!r}"
        assert len(during) >= 8 and all(r["text"] and r["finish"] == "length" for r in during)

        # The step sequence on NATS, each listing the pools after it.
        assert [e["action"] for e in events] == ["resplit_start", "drained", "warm"], events
        start, warm = events[0], events[-1]
        assert wid not in start["decode_workers"] + start["prefill_workers"]  # in neither pool
        assert "integration test" in start["reason"] and wid in warm["prefill_workers"]

        # The new prefill worker receives prefill work.
        stats = ray.get(h.router.stats.remote(), timeout=HTTP_TIMEOUT_S)
        assert sorted(stats.workers["prefill"]) == sorted([0, wid]), stats.workers
        assert stats.routed_to["prefill"].get(wid, 0) > 0, stats.routed_to
        served = {r["disagg"]["prefill_worker"] for r in after if r["disagg"]}
        assert wid in served, served

        # /metrics (the metrics server, the controller actor's families merged in; its
        # fetch of the actors is at most a second old).
        def moved() -> bool:
            text = _metrics(live_service)
            pools = metric_values(text, "disagg_pool_workers")
            total = sum(metric_values(text, "disagg_resplits_total").values())
            return pools == {'{role="decode"}': 1.0, '{role="prefill"}': 2.0} and (
                total == before_total + 1
            )

        until(moved, 10, "the re-split on /metrics")

        # The auction's derived bound follows the prefill pool (the controller tells it).
        def slots() -> int:
            auction = ray.get(h.auction.stats.remote(), timeout=HTTP_TIMEOUT_S)
            return int(auction.max_in_prefill)

        per_worker = live_service.service.config.prefill_slots_per_worker()
        until(lambda: slots() == 2 * per_worker, 10, "max_in_prefill for two prefill workers")
    finally:
        # Back to 1P/2D with the same ids, for whatever runs after on the shared service.
        snap = ray.get(h.controller.snapshot.remote(), timeout=HTTP_TIMEOUT_S)
        for w in snap.pools.prefill:
            if w != 0:
                back = ray.get(
                    h.controller.resplit_now.remote("decode", "integration test: restore", w),
                    timeout=MOVE_TIMEOUT_S,
                )
                assert back.result == "warm", back
        live_service.service.refresh_workers()
    restored = live_service.handles
    assert sorted(restored.decode) == [1, 2] and list(restored.prefill) == [0]
