"""The worker actors in-process (no Ray): the classes are instantiated directly and their async
methods run under asyncio.run. Without NATS their KV messages reach ``bus.local``; one test runs
them through an embedded nats-server."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from cluster.actor_bus import ActorBus
from cluster.backends.sim.workers import DecodeWorkerActor, PrefillWorkerActor, kv_messages
from cluster.bus import EventBus
from cluster.kv_wire import kv_subject
from cluster.model_dir import ChatTokenizer, default_model_dir
from cluster.nats_server import NatsServer
from cluster.ray.actor_support import MAX_PROMPT_TOKENS
from cluster.sim.engines import PrefillResult
from cluster.sim.wallclock import EngineClosed, EngineDraining, EngineLoad
from router import KvIndex, Removed, Stored, block_hashes, parse_kv_event, sequence_hashes
from telemetry.metrics import EVENTS_DROPPED

PROFILE = "b200-llama70b-fp8-tp4"
SPEEDUP = 50.0  # an 8.5 ms decode step lasts 0.17 ms of wall time


def _prompt(n: int, start: int = 100) -> tuple[list[int], list[int], list[int]]:
    tokens = list(range(start, start + n))
    local = block_hashes(tokens, 16)
    return tokens, local, sequence_hashes(local)


def _prefill(worker_id: int = 0, **kw: Any) -> PrefillWorkerActor:
    args = {"speedup": SPEEDUP, "epoch_wall": time.time(), "seed": 1, "nats_url": None} | kw
    return PrefillWorkerActor(worker_id, PROFILE, **args)


def _decode(worker_id: int = 1, **kw: Any) -> DecodeWorkerActor:
    args = {"speedup": SPEEDUP, "epoch_wall": time.time(), "seed": 2, "nats_url": None} | kw
    return DecodeWorkerActor(worker_id, PROFILE, **args)


def _record(actor: PrefillWorkerActor | DecodeWorkerActor) -> list[tuple[str, list[Any]]]:
    seen: list[tuple[str, list[Any]]] = []
    actor.bus.local.append(lambda subject, payloads: seen.append((subject, payloads)))
    return seen


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


async def _collect(chunks: AsyncIterator[list[list[Any]]]) -> list[list[list[Any]]]:
    return [chunk async for chunk in chunks]


# -- KV messages -------------------------------------------------------------------------------


def test_kv_messages_split_long_events_into_chained_parts_that_index_the_same() -> None:
    blocks = tuple((1000 + i, 2000 + i) for i in range(10))
    stored = Stored(7, None, blocks)
    messages = kv_messages([stored, Removed(7, (1009, 1008, 1007)), Stored(7, 1006, ())], 4)
    # Weights (blocks; an event without any weighs 1): 4 | 4 | 2 | 3 removed + 1 empty store.
    assert [len(m) for m in messages] == [1, 1, 1, 2]
    parts = [parse_kv_event(p) for m in messages for p in m]
    assert [p.parent_hash for p in parts[:3]] == [None, 1003, 1007]  # type: ignore[union-attr]
    for message in messages:
        assert sum(max(1, len(getattr(p, "blocks", ()))) for p in map(parse_kv_event, message)) <= 4
    whole, split = KvIndex(16), KvIndex(16)
    for index in (whole, split):
        index.add_worker(7)
    whole.apply(stored)
    for part in parts[:3]:
        assert split.apply(part)
    assert split.cached_blocks(7) == whole.cached_blocks(7) == 10


def test_kv_messages_of_a_million_token_prompt_stay_under_the_nats_limit() -> None:
    from cluster.kv_wire import MAX_KV_MESSAGE_BYTES, encode_kv_events

    _, local, seq = _prompt(MAX_PROMPT_TOKENS)
    stored = Stored(3, None, tuple(zip(seq, local, strict=True)))
    messages = kv_messages([stored])
    assert len(messages) == len(seq) // 4096
    assert max(len(encode_kv_events(m, 3, 1)) for m in messages) < MAX_KV_MESSAGE_BYTES // 4


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    async def body() -> None:
        bus = ActorBus(None, "disagg", role="worker", name="t", max_pending=2)
        got: list[Any] = []
        bus.local.append(lambda subject, item: got.append(item))
        before = EVENTS_DROPPED.labels("buffer_full")._value.get()
        assert [bus.publish_kv("s", [{"x": i}], 0) for i in range(3)] == [True, True, False]
        assert EVENTS_DROPPED.labels("buffer_full")._value.get() == before + 1
        assert bus.dropped == 1
        await bus.flush()
        assert got == [[{"x": 0}], [{"x": 1}]]
        await bus.close()

    _run(body)


# -- prefill -----------------------------------------------------------------------------------


def test_prefill_returns_its_result_and_publishes_cleared_then_one_batch_per_iteration() -> None:
    async def body() -> None:
        # Real time (speedup 1): the first prefill's iteration lasts ~31 ms, long enough for
        # the next two to arrive during it and start together in the next iteration.
        worker = _prefill(worker_id=4, speedup=1.0)
        seen = _record(worker)
        info = await worker.ready()
        assert info.worker_id == 4 and info.role == "prefill" and info.pid > 0
        assert info.nats is None
        _, lx, sx = _prompt(320, 9000)
        _, la, sa = _prompt(320, 100)
        _, lb, sb = _prompt(160, 5000)
        first = asyncio.ensure_future(worker.prefill("x", 320, lx, sx))
        await asyncio.sleep(0.005)
        a, b = await asyncio.gather(
            worker.prefill("a", 320, la, sa), worker.prefill("b", 160, lb, sb)
        )
        x = await first
        assert isinstance(a, PrefillResult) and a.cached_tokens == 0
        assert 0 <= x.started_at < x.finished_at <= a.started_at < a.finished_at
        assert a.finished_at == b.finished_at
        await worker.bus.flush()
        assert all(s == kv_subject("disagg", "prefill") for s, _ in seen)
        events = [[parse_kv_event(p) for p in payloads] for _, payloads in seen]
        assert events[0] == [parse_kv_event({"worker_id": 4, "data": "cleared"})]
        # One message per iteration: x alone, then a and b (admitted together) in one.
        assert [len(e) for e in events] == [1, 1, 2]
        stored = events[2]
        assert all(isinstance(e, Stored) for e in stored)
        assert [h for _, h in stored[0].blocks] == la and [h for h, _ in stored[0].blocks] == sa
        again = await worker.prefill("a2", 320, la, sa)  # the same prompt is cached now
        assert again.cached_tokens == 320 - 1  # the last token is always recomputed
        load = await worker.load()
        assert isinstance(load, EngineLoad) and load.kv_used_blocks > 0
        await worker.shutdown()

    _run(body)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt_tokens": 0}, "prompt_tokens"),
        ({"prompt_tokens": MAX_PROMPT_TOKENS + 1}, "prompt_tokens"),
        ({"prompt_tokens": True}, "prompt_tokens"),
        ({"request_id": ""}, "request_id"),
        ({"request_id": 5}, "request_id"),
        ({"local_hashes": ["x"]}, "local_hashes"),
        ({"seq_hashes": [-1]}, "seq_hashes"),
        ({"seq_hashes": "abc"}, "seq_hashes"),
    ],
)
def test_prefill_refuses_bad_arguments_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    _, local, seq = _prompt(32)
    args = {"request_id": "r", "prompt_tokens": 32, "local_hashes": local, "seq_hashes": seq}

    async def body() -> None:
        worker = _prefill()
        with pytest.raises(ValueError, match=field):
            await worker.prefill(**(args | kwargs))
        await worker.shutdown()

    _run(body)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"epoch_wall": math.nan}, "epoch_wall"),
        ({"epoch_wall": "now"}, "epoch_wall"),
        ({"speedup": 0.0}, "speedup"),
        ({"seed": -1}, "seed"),
        ({"namespace": "a.b"}, "namespace"),
    ],
)
def test_constructors_refuse_bad_settings(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _prefill(**kwargs)
    with pytest.raises(ValueError, match="worker_id"):
        _decode(worker_id=-1)
    with pytest.raises(ValueError, match="unknown hardware profile"):
        PrefillWorkerActor(0, "nope", speedup=1.0, epoch_wall=time.time(), seed=0, nats_url=None)


# -- decode ------------------------------------------------------------------------------------


def test_generate_streams_every_token_in_order_as_readable_text() -> None:
    async def body() -> None:
        worker = _decode()
        _, local, seq = _prompt(100)
        chunks = await _collect(worker.generate("req-1", 100, local, seq, 40, True))
        rows = [row for chunk in chunks for row in chunk]
        assert all(chunk for chunk in chunks)
        assert [r[0] for r in rows] == list(range(40))
        times = [r[2] for r in rows]
        assert times == sorted(times) and times[0] > 0
        tokenizer = ChatTokenizer.from_dir(default_model_dir())
        ids = [r[1] for r in rows]
        assert ids == tokenizer.sample_output_ids(zlib.crc32(b"req-1"), 40)
        assert len(tokenizer.decode(ids).split()) >= 30  # words, not noise
        # Its prompt is cached now: the KV a transfer would bring is only the partial tail.
        assert await worker.uncached_tokens(seq, 100) == 100 - 6 * 16
        assert await worker.uncached_tokens([], 100) == 100
        await worker.shutdown()

    _run(body)


def test_a_chunk_interval_spaces_the_chunks_and_loses_nothing() -> None:
    async def body() -> None:
        worker = _decode(speedup=1.0)  # 8.5 ms decode steps in wall time
        _, local, seq = _prompt(48)
        arrivals: list[float] = []
        chunks: list[list[list[Any]]] = []
        async for chunk in worker.generate("few", 48, local, seq, 30, True, 0.05):
            arrivals.append(time.monotonic())
            chunks.append(chunk)
        rows = [r for c in chunks for r in c]
        assert [r[0] for r in rows] == list(range(30))  # nothing lost, in order
        # After a chunk the worker waits the interval (only the sequence's end cuts it short),
        # so every gap but the last is at least 50 ms, and 29 tokens of ~8.5 ms need few chunks.
        gaps = [b - a for a, b in itertools.pairwise(arrivals[:-1])]
        assert all(gap >= 0.045 for gap in gaps), gaps
        assert len(chunks) < 30
        await worker.shutdown()

    _run(body)


def test_generate_after_a_transfer_and_the_decode_kv_events_it_causes() -> None:
    async def body() -> None:
        worker = _decode(worker_id=9)
        seen = _record(worker)
        _, local, seq = _prompt(64)
        rows = [
            r for c in await _collect(worker.generate("t", 64, local, seq, 3, False)) for r in c
        ]
        assert len(rows) == 3
        await worker.bus.flush()
        assert {s for s, _ in seen} == {kv_subject("disagg", "decode")}
        stored = [parse_kv_event(p) for _, ps in seen for p in ps]
        assert isinstance(stored[0], type(parse_kv_event({"worker_id": 9, "data": "cleared"})))
        assert any(isinstance(e, Stored) and e.worker == 9 for e in stored)
        await worker.shutdown()

    _run(body)


def test_a_consumer_that_leaves_closes_the_engine_stream() -> None:
    async def body() -> None:
        worker = _decode()
        _, local, seq = _prompt(48)
        stream = worker.generate("gone", 48, local, seq, 400, True)
        first = await anext(stream)
        assert first[0][0] == 0
        await stream.aclose()  # what Ray does when the caller cancels
        # Admitted sequences run to their end inside the model, their tokens dropped (see
        # cluster/sim/engines.py); the engine then drains with nothing left behind.
        assert await worker.drain(10.0)
        assert (await worker.load()).running == 0
        assert worker.engine._streams == {}
        await worker.shutdown()

    _run(body)


def test_a_request_cancelled_before_its_first_token_leaves_nothing_behind() -> None:
    async def body() -> None:
        worker = _decode(speedup=1.0)  # real time: the first iteration lasts ~9 ms
        _, local, seq = _prompt(48)
        task = asyncio.ensure_future(_collect(worker.generate("c", 48, local, seq, 5, True)))
        await asyncio.sleep(0.002)  # submitted and in its first iteration, no token yet
        assert worker.engine.in_flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await worker.drain(5.0)
        assert worker.engine._streams == {} and (await worker.load()).running == 0
        await worker.shutdown()

    _run(body)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"output_tokens": 0}, "output_tokens"),
        ({"output_tokens": 10**6}, "output_tokens"),
        ({"output_tokens": 2.0}, "output_tokens"),
        ({"prefill_locally": 1}, "prefill_locally"),
        ({"prompt_tokens": -3}, "prompt_tokens"),
        ({"chunk_interval_s": -0.1}, "chunk_interval_s"),
        ({"chunk_interval_s": math.nan}, "chunk_interval_s"),
        ({"chunk_interval_s": True}, "chunk_interval_s"),
    ],
)
def test_generate_refuses_bad_arguments_naming_the_field(
    kwargs: dict[str, Any], field: str
) -> None:
    _, local, seq = _prompt(32)
    args = {
        "request_id": "r", "prompt_tokens": 32, "local_hashes": local, "seq_hashes": seq,
        "output_tokens": 4, "prefill_locally": True,
    }  # fmt: skip

    async def body() -> None:
        worker = _decode()
        with pytest.raises(ValueError, match=field):
            await _collect(worker.generate(**(args | kwargs)))
        with pytest.raises(ValueError, match="seq_hashes"):
            await worker.uncached_tokens([1.5], 32)  # type: ignore[list-item]
        await worker.shutdown()

    _run(body)


def test_drain_refuses_new_work_and_shutdown_closes_the_engine() -> None:
    async def body() -> None:
        worker = _decode()
        _, local, seq = _prompt(32)
        with pytest.raises(ValueError, match="timeout_s"):
            await worker.drain(-1.0)
        assert await worker.drain(1.0)
        with pytest.raises(EngineDraining):
            await _collect(worker.generate("late", 32, local, seq, 2, True))
        await worker.shutdown()
        prefill = _prefill()
        await prefill.shutdown()
        with pytest.raises(EngineClosed):
            await prefill.prefill("x", 32, local, seq)

    _run(body)


def test_a_restarted_worker_tells_the_router_to_forget_its_old_cache() -> None:
    async def body() -> None:
        index = KvIndex(16)
        index.add_worker(1)
        _, local, seq = _prompt(64)
        for life in range(2):  # the second instance is what Ray's restart builds
            worker = _decode()
            worker.bus.local.append(lambda s, ps: index.apply_events(ps))
            if life == 0:
                await _collect(worker.generate("a", 64, local, seq, 2, True))
                await worker.bus.flush()
                assert index.cached_blocks(1) == 4
            else:
                await worker.ready()
                await worker.bus.flush()
                assert index.cached_blocks(1) == 0
            await worker.shutdown()

    _run(body)


def test_metrics_text_holds_only_what_workers_own() -> None:
    async def body() -> None:
        text = await _decode().metrics_text()
        assert "disagg_events_dropped_total" in text
        assert "disagg_routing_cost" not in text and "disagg_ttft_seconds" not in text

    _run(body)


# -- over NATS ---------------------------------------------------------------------------------


def test_kv_events_go_out_on_nats_in_dynamo_envelopes() -> None:
    async def body(url: str) -> None:
        listener = EventBus(url, "wk", role="observer")
        await listener.connect()
        got: list[Any] = []
        await listener.subscribe_kv(kv_subject("wk", "prefill"), got.append)
        worker = _prefill(worker_id=2, nats_url=url, namespace="wk")
        assert (await worker.ready()).nats is True
        _, local, seq = _prompt(64)
        await worker.prefill("n", 64, local, seq)
        await worker.bus.flush()
        for _ in range(100):
            if len(got) >= 2:
                break
            await asyncio.sleep(0.02)
        events = [parse_kv_event(p) for p in got]
        assert events[0].worker == 2 and not isinstance(events[0], Stored)  # cleared first
        assert isinstance(events[1], Stored) and len(events[1].blocks) == 4
        await worker.shutdown()
        await listener.close()

    with NatsServer() as server:
        asyncio.run(asyncio.wait_for(body(server.url), 30))


def test_the_engines_load_snapshots_go_out_on_nats() -> None:
    async def body(url: str) -> None:
        listener = EventBus(url, "wk", role="observer")
        await listener.connect()
        got: list[Any] = []
        await listener.subscribe(got.append, kinds=("engine_load",))
        worker = _decode(worker_id=4, nats_url=url, namespace="wk")
        assert (await worker.ready()).nats is True
        _, local, seq = _prompt(64)
        stream = worker.generate("e", 64, local, seq, 400, True)
        await anext(stream)  # the sequence runs: the engine holds it
        for _ in range(200):
            if any(e.requests == 1 for e in got):
                break
            await asyncio.sleep(0.02)
        held = next(e for e in got if e.requests == 1)
        assert (held.worker_id, held.role) == (4, "decode") and held.decode_blocks >= 4
        await stream.aclose()
        await worker.shutdown()
        await listener.close()

    with NatsServer() as server:
        asyncio.run(asyncio.wait_for(body(server.url), 30))
