"""The controller actor's traffic reading (cluster/ray/live_traffic.py): λ as given, the shape of
the completions in the window, the prefill engines' queues while their snapshots hold."""

from __future__ import annotations

import pytest

from cluster.events import CompleteEvent, EngineLoadEvent
from cluster.ray.live_traffic import MAX_COMPLETES, LiveTraffic
from controller.traffic import TrafficShape


def complete(i: int, prompt: int, cached: int, output: int) -> CompleteEvent:
    return CompleteEvent(
        request_id=f"r{i}", t=float(i), worker_id=3, prefill_worker_id=0, ttft_s=0.5,
        itl_s=0.01, e2e_s=2.0, prompt_tokens=prompt, cached_tokens=cached,
        output_tokens=output, status="ok",
    )  # fmt: skip


def load(worker: int, role: str, tokens: int, ttl_s: float = 5.0) -> EngineLoadEvent:
    return EngineLoadEvent(
        worker_id=worker, role=role, t=0.0, ttl_s=ttl_s, prefill_tokens=tokens,
        decode_blocks=0, requests=1,
    )  # fmt: skip


def test_the_shape_is_the_windows_completions_token_weighted() -> None:
    live = LiveTraffic(window_s=30.0)
    live.complete(0.0, complete(0, 10_000, 2_000, 300))
    live.complete(10.0, complete(1, 30_000, 13_000, 500))
    reading = live.reading(20.0, arrival_rate=2.5)
    assert reading.arrival_rate == 2.5
    # Mean prompt 20,000, mean output 400, reuse 15,000 / 40,000 of the prompt tokens.
    assert reading.shape == TrafficShape(20_000.0, 400.0, 0.375)
    assert live.reading(35.0, 2.5).shape == TrafficShape(30_000.0, 500.0, 13_000 / 30_000)
    assert live.reading(45.0, 2.5).shape is None  # nothing finished in the window


def test_the_queue_is_the_prefill_engines_latest_snapshots_while_they_hold() -> None:
    live = LiveTraffic()
    live.engine_load(0.0, load(0, "prefill", 40_000))
    live.engine_load(1.0, load(1, "prefill", 8_000, ttl_s=2.0))
    live.engine_load(1.0, load(5, "decode", 123))  # a decode engine queues no prefill
    live.engine_load(2.0, load(0, "prefill", 30_000))  # the newer snapshot replaces the older
    assert live.reading(2.5, 1.0).queued_prefill_tokens == 38_000.0
    assert live.reading(4.0, 1.0).queued_prefill_tokens == 30_000.0  # worker 1's expired
    live.engine_load(4.5, load(0, "decode", 0))  # worker 0 turned decode (a re-split)
    assert live.reading(5.0, 1.0).queued_prefill_tokens == 0.0


def test_the_window_is_bounded() -> None:
    live = LiveTraffic(window_s=1e9)
    for i in range(MAX_COMPLETES + 10):
        live.complete(0.0, complete(i, 100, 0, 10))
    assert len(live._done) == MAX_COMPLETES
    with pytest.raises(ValueError, match="window_s"):
        LiveTraffic(window_s=0.0)
