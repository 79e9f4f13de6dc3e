"""The live service on real Dynamo processes (``--backend dynamo``; docs/design.md §6).

One service, 1P/2D ``dynamo.mocker`` pools with a small KV cache (so evictions happen), its own
NATS, the session's Ray. Through the ingress with the official ``openai`` client:

- requests are answered, and Dynamo's KV events reach our router in shadow: its index's overlaps
  equal Dynamo's own (``KvRouter.get_overlap_scores``) for the same prompts;
- every request has a route event with our breakdown, and the shadow agrees with Dynamo;
- a load ramp saturates the service: the regime switches and the next requests carry the new
  policy (the response's ``disagg.policy_version`` and ``regime``);
- clients that hang up after one chunk leave no request in flight on the mockers;
- a SIGKILLed mocker is restarted with a new instance id, re-bound in the router, and serves;
  requests sent while it was dead are answered elsewhere or fail with a clear 503;
- a re-split stops a decode mocker and starts a prefill one on the same slot, then moves back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray

from bench.dynamo import agreement_counts
from cluster.backends.dynamo.routing import DynamoRoutes
from cluster.config import ServeConfig
from cluster.model_dir import ChatTokenizer, default_model_dir
from cluster.nats_server import free_port
from cluster.ray.metrics_server import PUSH_PERIOD_S
from cluster.ray.status import RouterStats
from cluster.service import Service
from tests.dynamo.conftest import pid_gone

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODEL = "disagg-tiny"
BLOCKS = 64  # KV blocks per mocker: eight distinct system prompts overflow it
SYSTEM = "You are assistant number {k}, careful about harbours, lighthouses and tides. " * 6


@pytest.fixture(scope="module")
def service(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("dynamo-serve")
    config = ServeConfig.model_validate({
        "backend": "dynamo",
        "topology": "1P/2D",
        "namespace": "dyn-test",
        "ledger_path": str(tmp / "ledger.sqlite"),
        "metrics_port": 0,
        "dynamo": {"num_gpu_blocks": BLOCKS, "speedup_ratio": 1.0},
        # Thresholds of wall TTFT on this 2-core machine: one client at a time is served in
        # ~0.1 s; 48 at once queue for seconds (measured when written).
        "controller": {
            "theta1_s": 0.5, "theta2_s": 1.0, "min_samples": 10, "window_s": 5.0,
            "resplit": {"enabled": False},
        },
    })  # fmt: skip
    svc = Service(config)
    try:
        svc.start(port=free_port())
        yield svc
    finally:
        svc.stop()


def _messages(i: int, k: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM.format(k=k)},
        {"role": "user", "content": f"Question {i}: when is the next high tide?"},
    ]


async def _ask(client: openai.AsyncOpenAI, i: int, k: int, max_tokens: int = 8) -> dict[str, Any]:
    stream = await client.chat.completions.create(
        model=MODEL, messages=_messages(i, k), max_tokens=max_tokens, stream=True
    )
    text, disagg = "", None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
        disagg = (chunk.model_extra or {}).get("disagg") or disagg
    return {"text": text, "disagg": disagg}


def _client(svc: Service) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{svc.url}/v1", api_key="none", max_retries=0)


def _stats(svc: Service) -> RouterStats:
    return ray.get(svc.handles.router.stats.remote())


def test_requests_are_answered_and_overlaps_equal_dynamos(service: Service) -> None:
    client = openai.OpenAI(base_url=f"{service.url}/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=_messages(0, 0), max_tokens=8)
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 8

    async def traffic() -> list[dict[str, Any]]:
        c = _client(service)
        return [await _ask(c, i, k=i % 8) for i in range(24)]  # eight prompts: evictions

    answers = asyncio.run(traffic())
    assert all(a["text"] for a in answers)
    assert {a["disagg"]["prefill_worker"] for a in answers} == {0}
    assert {a["disagg"]["decode_worker"] for a in answers} <= {1, 2}
    kv = _stats(service).kv_events["prefill"].applied
    assert kv.get("stored", 0) > 0 and kv.get("removed", 0) > 0, kv  # the cache evicted

    tokenizer = ChatTokenizer.from_dir(default_model_dir())
    prompts = [tokenizer.encode_chat(_messages(99, k)) for k in range(8)]

    async def compare() -> tuple[list[dict[int, int]], list[dict[int, int]]]:
        routes = DynamoRoutes(
            service.config.dynamo, nats_url=service.nats_url or "",
            discovery=service.engines.discovery, model_name=MODEL,
        )  # fmt: skip
        await routes.start()
        try:
            deadline = time.monotonic() + 10.0
            while True:  # both consume the same events, each at its own pace: let them settle
                theirs = [await _dynamo_overlaps(routes, p) for p in prompts]
                ours = [
                    {w: b for w, b in (await service.handles.router.overlaps.remote(
                        "prefill", p)).items() if b}
                    for p in prompts
                ]  # fmt: skip
                if ours == theirs or time.monotonic() > deadline:
                    return ours, theirs
                await asyncio.sleep(0.2)
        finally:
            routes.close()

    ours, theirs = asyncio.run(compare())
    assert ours == theirs
    assert any(o for o in ours) and not all(o for o in ours)  # some cached, some evicted


async def _dynamo_overlaps(routes: DynamoRoutes, tokens: list[int]) -> dict[int, int]:
    scores = await routes.routers["prefill"].get_overlap_scores(tokens)
    return {int(w["worker_id"]): int(w["device_blocks"]) for w in scores["workers"]
            if w["device_blocks"]}  # fmt: skip


def test_every_request_gets_our_breakdown_and_agreement_is_counted(
    service: Service,
) -> None:
    assert service.metrics_url is not None
    metrics_url = service.metrics_url
    time.sleep(PUSH_PERIOD_S + 0.5)  # the replica's last push holds every earlier request
    before = agreement_counts(metrics_url)

    async def traffic() -> None:
        c = _client(service)
        await asyncio.gather(*(_ask(c, 100 + i, k=i % 3) for i in range(12)))

    asyncio.run(traffic())
    # Counted in the ingress replica, pushed to the metrics server every second.
    deadline = time.monotonic() + 10.0
    while True:
        after = agreement_counts(metrics_url)
        counted = [sum(after[r].values()) - sum(before[r].values()) for r in ("prefill", "decode")]
        if counted == [12, 12] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert counted == [12, 12], (before, after)
    # One prefill worker: the two routers cannot differ there.
    assert after["prefill"]["different"] == 0
    text = httpx.get(metrics_url, timeout=10).text
    assert 'disagg_dynamo_router_agreement_total{agree="same",role="prefill"}' in text
    assert 'disagg_dynamo_router_cost_gap_count{role="prefill"}' in text
    # The workers' own Dynamo metrics, merged into the one /metrics: a series per instance.
    served = {
        int(line.split('worker_id="')[1].split('"')[0], 16)
        for line in text.splitlines()
        if line.startswith("dynamo_component_requests_total{")
        and 'dynamo_endpoint="generate"' in line
    }
    assert set(_stats(service).binding.instances.values()) <= served, served
    # The replica's load reports reach the shadow router actor: the fleet's routing in its stats.
    deadline = time.monotonic() + 10.0
    while sum((stats := _stats(service)).routed_by_replica.values()) < 12:
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    assert sum(stats.routed_to["decode"].values()) >= 12, stats


def test_a_ramp_switches_the_regime_and_the_next_requests_carry_the_override(
    service: Service,
) -> None:
    start = _stats(service).policy
    assert start.regime == "below" and start.tau == 0.0

    async def ramp() -> list[dict[str, Any]]:
        c = _client(service)
        deadline = time.monotonic() + 90.0
        i = 1000
        while _stats(service).policy.regime != "saturated":
            assert time.monotonic() < deadline, "the ramp did not saturate the service"
            await asyncio.gather(*(_ask(c, i + j, k=j % 8, max_tokens=16) for j in range(48)))
            i += 48
        return [await _ask(c, 5000 + j, k=j % 8) for j in range(3)]

    after = asyncio.run(ramp())
    policy = _stats(service).policy
    assert policy.tau > 0 and policy.version > start.version
    for answer in after:
        assert answer["disagg"]["regime"] == "saturated"
        assert answer["disagg"]["policy_version"] == policy.version
    # The PoA estimator joins our route events with the ingress's first tokens, as on the
    # simulated backend: an estimate over the decode slots, every completion attributed.
    deadline = time.monotonic() + 30.0
    while (poa := ray.get(service.handles.poa.snapshot.remote())).poa_hat is None:
        assert time.monotonic() < deadline, poa
        time.sleep(0.5)
    assert poa.n > 0 and set(poa.workers) <= {1, 2} and poa.impossible == ()
    assert poa.attribution_rate == 1.0
    override = ray.get(service.handles.router.policy.remote()).override
    assert override == {
        "router_temperature": policy.tau, "overlap_score_weight": policy.omega
    }


def _decode_inflight(svc: Service) -> list[float | None]:
    """Requests in flight on each decode mocker's generate endpoint (its ``/metrics``)."""
    return [ray.get(w.load.remote()).inflight for w in svc.handles.decode.values()]


def test_clients_that_hang_up_after_one_chunk_stop_the_mockers(service: Service) -> None:
    """A disconnect stops the work on Dynamo too: the ingress closes the request's stream from
    the decode worker, Dynamo's runtime cancels the request there, and the mocker frees it within
    2 s, long before its ``max_tokens`` would have run out (a 400-token answer read to its end
    took 9.2 s here when this was written)."""
    clients = 12

    async def hang_up(i: int) -> str:
        client = _client(service)
        stream = await client.chat.completions.create(
            model=MODEL, messages=_messages(9000 + i, k=i % 3), max_tokens=400, stream=True
        )
        async for chunk in stream:
            if any(c.delta.content for c in chunk.choices):
                break
        await stream.close()  # the client leaves after its first chunk of text
        await client.close()
        return "left"

    async def seen_decoding() -> float:
        """What the metric reads while a stream is open: it does count a decoding request."""
        client = _client(service)
        stream = await client.chat.completions.create(
            model=MODEL, messages=_messages(8999, k=0), max_tokens=400, stream=True
        )
        seen = 0.0
        async for _ in stream:
            seen = sum(n or 0 for n in await asyncio.to_thread(_decode_inflight, service))
            if seen:
                break
        await stream.close()
        await client.close()
        return seen

    async def main() -> tuple[float, list[str], list[float | None]]:
        seen = await seen_decoding()
        left = await asyncio.gather(*(hang_up(i) for i in range(clients)))
        return seen, left, await asyncio.to_thread(_decode_inflight, service)

    seen, left, at_hang_up = asyncio.run(main())
    assert seen >= 1 and left == ["left"] * clients
    assert all(n is not None for n in at_hang_up)
    hung_up = time.monotonic()
    while any(n for n in _decode_inflight(service)):
        assert time.monotonic() - hung_up < 2.0, (at_hang_up, _decode_inflight(service))
        time.sleep(0.1)
    # The next client is served in full.
    answer = asyncio.run(_ask(_client(service), 9100, k=0, max_tokens=8))
    assert answer["text"]


def test_a_killed_mocker_is_restarted_and_rebound(service: Service) -> None:
    worker = service.handles.decode[1]
    old = ray.get(worker.info.remote())
    pid = ray.get(worker.kill_engine.remote())
    assert pid == old.pid

    async def during() -> list[Any]:
        client = _client(service)
        return await asyncio.gather(
            *(_ask(client, 7000 + j, k=j % 3) for j in range(6)), return_exceptions=True
        )

    results = asyncio.run(during())
    for r in results:  # answered (elsewhere, or by the restarted worker) or a clear 503
        if isinstance(r, BaseException):
            assert isinstance(r, openai.APIStatusError) and r.status_code == 503, r
            assert "decode instance" in str(r.message) or "worker" in str(r.message), r
        else:
            assert r["text"]
    deadline = time.monotonic() + 60.0
    while True:
        new = ray.get(worker.info.remote())
        bound = _stats(service).binding.instances.get("decode/1")
        renewed = new.instance_id != old.instance_id
        if new.alive and renewed and bound == new.instance_id:
            break
        assert time.monotonic() < deadline, (old, new, bound)
        time.sleep(0.2)
    assert pid_gone(pid) and new.restarts == old.restarts + 1
    assert Path(new.log).is_file()

    async def after() -> list[dict[str, Any]]:
        client = _client(service)
        return [await _ask(client, 8000 + j, k=j % 3) for j in range(8)]

    assert all(r["text"] for r in asyncio.run(after()))


def test_a_resplit_stops_a_decode_mocker_and_starts_a_prefill_one(
    service: Service,
) -> None:
    controller = service.handles.controller
    moved = ray.get(controller.resplit_now.remote("prefill", "test", 2), timeout=120)
    assert moved.result == "warm", moved
    assert moved.pools.prefill == (0, 2) and moved.pools.decode == (1,)
    stats = _stats(service)
    assert stats.workers == {"prefill": (0, 2), "decode": (1,)}
    assert "prefill/2" in stats.binding.instances

    async def traffic() -> list[dict[str, Any]]:
        c = _client(service)
        return await asyncio.gather(*(_ask(c, 9000 + j, k=j % 8) for j in range(16)))

    answers = asyncio.run(traffic())
    assert all(a["text"] for a in answers)
    assert {a["disagg"]["decode_worker"] for a in answers} == {1}
    back = ray.get(controller.resplit_now.remote("decode", "test", 2), timeout=120)
    assert back.result == "warm", back
    assert _stats(service).workers == {"prefill": (0,), "decode": (1, 2)}
