"""The wall-clock engines (cluster.sim.wallclock, cluster.sim.engines): the simulator's workers
serving in wall time. Each test runs its own event loop (``asyncio.run``, no plugin) at a high
speedup, under a wall timeout so a hang fails instead of blocking the suite."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest

from cluster.sim.cluster import SimCluster, SimRequest
from cluster.sim.engines import DecodeEngine, PrefillEngine, PrefillResult, Token
from cluster.sim.profile import HardwareProfile, load_profile
from cluster.sim.wallclock import MAX_SPEEDUP, Clock, EngineClosed, EngineDraining, EngineLoad
from router import KvEvent, Removed, Stored, block_hashes, sequence_hashes
from tests import waiting

# Some states the tests wait for last a few engine steps only: poll every millisecond.
until = functools.partial(waiting.until, interval_s=0.001)

PROFILE = load_profile("b200-llama70b-fp8-tp4")
T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def _prompt(first: int, n: int = 128) -> tuple[np.ndarray, list[int], list[int]]:
    tokens = np.arange(first, first + n, dtype=np.uint32)
    local = block_hashes(tokens, PROFILE.block_size)
    return tokens, local, sequence_hashes(local)


def _transfer_s(profile: HardwareProfile, missing: int) -> float:
    """The KV transfer SimCluster models: latency + bytes / link bandwidth."""
    link = profile.link
    return link.latency_s + missing * profile.kv_bytes_per_token / (link.bandwidth_gbps * 1e9 / 8)


def _small_decode(capacity_tokens: int) -> HardwareProfile:
    decode = dataclasses.replace(PROFILE.decode, kv_capacity_tokens=capacity_tokens)
    return dataclasses.replace(PROFILE, decode=decode)


async def _collect(stream: Any) -> list[Token]:
    return [token async for token in stream]


def _sim_ttft(topology: str, prompt: np.ndarray, output_tokens: int) -> tuple[float, np.ndarray]:
    cluster = SimCluster(PROFILE, topology, seed=0)
    record = cluster.submit(SimRequest("r", prompt, output_tokens))
    cluster.loop.run()
    assert record.ttft is not None and record.itl is not None
    return record.ttft, record.itl


# -- clock ----------------------------------------------------------------------------------


@pytest.mark.parametrize("speedup", [0.0, -1.0, math.inf, math.nan, MAX_SPEEDUP * 10])
def test_clock_rejects_speedups_out_of_bounds(speedup: float) -> None:
    with pytest.raises(ValueError, match="speedup"):
        Clock(speedup)


def test_clock_runs_speedup_times_faster_than_wall() -> None:
    async def main() -> tuple[float, float]:
        clock = Clock(20.0)
        v0, w0 = clock.now(), time.monotonic()
        await clock.sleep_virtual(1.0)  # 50 ms wall
        return clock.now() - v0, time.monotonic() - w0

    virtual, wall = _run(main())
    # Exact by construction up to the instants at which the two clocks are read; a loaded
    # machine may preempt between the reads, so the tolerance is absolute (10 ms wall).
    assert wall >= 0.05 and virtual >= 1.0
    assert virtual == pytest.approx(wall * 20.0, abs=20.0 * 0.010)


# -- streaming and timing -------------------------------------------------------------------


def test_tokens_stream_in_order_with_first_and_last_flags() -> None:
    tokens, local, seq = _prompt(0)

    async def main() -> tuple[list[Token], list[Token], int]:
        clock = Clock(100.0)
        engine = DecodeEngine(0, PROFILE, clock=clock, token_sampler=lambda r, n: range(7, 7 + n))
        stream = engine.generate("a", len(tokens), local, seq, 20, prefill_locally=True)
        first = await anext(stream)
        running = engine.load().running  # mid-stream: the sequence is in the batch
        got = [first, *[t async for t in stream]]
        default = DecodeEngine(1, PROFILE, clock=clock, seed=3)
        ids = await _collect(default.generate("b", 128, local, seq, 50, prefill_locally=True))
        await engine.close()
        await default.close()
        return got, ids, running

    got, default_ids, running = _run(main())
    assert running == 1
    assert [t.index for t in got] == list(range(20))
    assert [t.token_id for t in got] == list(range(7, 27))
    assert [t.first for t in got] == [True] + [False] * 19
    assert [t.last for t in got] == [False] * 19 + [True]
    assert all(b.t_virtual > a.t_virtual for a, b in itertools.pairwise(got))
    assert len(default_ids) == 50 and all(0 <= t.token_id < 32000 for t in default_ids)


def test_local_prefill_ttft_and_itl_equal_the_virtual_time_simulator() -> None:
    """Virtual stamps are the model's schedule (start + duration), not wake-up readings, so with
    the SimCluster worker's seed the stream repeats SimCluster's history: the tolerance is float
    rounding only, whatever the scheduler jitter at 100×."""
    tokens, local, seq = _prompt(1000)
    sim_ttft, sim_itl = _sim_ttft("0P/1D", tokens, 8)  # decode worker 0, seed 0

    async def main() -> tuple[float, list[Token]]:
        clock = Clock(100.0)
        engine = DecodeEngine(0, PROFILE, clock=clock, seed=0)
        t0 = clock.now()
        stream = engine.generate("r", len(tokens), local, seq, 8, prefill_locally=True, arrival=t0)
        got = await _collect(stream)
        await engine.close()
        return t0, got

    t0, got = _run(main())
    assert got[0].t_virtual - t0 == pytest.approx(sim_ttft, abs=1e-9)
    itl = np.diff([t.t_virtual for t in got])
    np.testing.assert_allclose(itl, sim_itl, atol=1e-9)


def test_remote_prefill_by_hand_matches_simcluster_ttft() -> None:
    """prefill engine → KV transfer sleep → decode engine, composed by hand as SimCluster does
    it (1P/1D: prefill worker 0 seed 0, decode worker 1 seed 1). With arrivals stamped where
    they happened (prefill end + transfer) the TTFT is SimCluster's to float rounding."""
    tokens, local, seq = _prompt(1000)
    n = len(tokens)
    sim_ttft, _ = _sim_ttft("1P/1D", tokens, 8)

    async def main() -> tuple[float, PrefillResult, list[Token], float]:
        clock = Clock(100.0)
        prefill = PrefillEngine(0, PROFILE, clock=clock, seed=0)
        decode = DecodeEngine(1, PROFILE, clock=clock, seed=1)
        t0 = clock.now()
        result = await prefill.prefill("r", n, local, seq, arrival=t0)
        transfer = _transfer_s(PROFILE, decode.uncached_tokens(seq, n))
        await clock.sleep_virtual(transfer)
        arrival = result.finished_at + transfer
        stream = decode.generate("r", n, local, seq, 8, prefill_locally=False, arrival=arrival)
        got = await _collect(stream)
        lag = clock.now() - got[-1].t_virtual  # how late the last token was delivered
        await prefill.close()
        await decode.close()
        return t0, result, got, lag

    t0, result, got, lag = _run(main())
    assert result.cached_tokens == 0 and result.queued_s == 0.0
    assert got[0].t_virtual - t0 == pytest.approx(sim_ttft, abs=1e-9)
    assert len(got) == 8 and got[-1].last
    assert lag >= 0.0  # never delivered before its time (how late is the machine's, not ours)


def test_concurrent_requests_share_decode_iterations() -> None:
    """Eight sequences submitted together share decode iterations: one iteration serves all
    eight, and in virtual time they take about as long as one does alone."""
    speedup, out = 20.0, 64
    _, local, seq = _prompt(0)

    async def one(engine: DecodeEngine, rid: str) -> list[Token]:
        return await _collect(engine.generate(rid, 128, local, seq, out, prefill_locally=True))

    async def main() -> tuple[list[Token], list[list[Token]], list[int]]:
        engine = DecodeEngine(0, PROFILE, clock=Clock(speedup))
        solo = await one(engine, "solo")
        many = await asyncio.gather(*(one(engine, f"r{i}") for i in range(8)))
        batches = engine.worker.iteration_batch
        await engine.close()
        return solo, many, batches

    solo, many, batches = _run(main())
    assert all(len(tokens) == out and tokens[-1].last for tokens in many)
    assert max(batches) == 8  # one iteration served all eight sequences
    span_solo = solo[-1].t_virtual - solo[0].t_virtual
    span_eight = max(t[-1].t_virtual for t in many) - min(t[0].t_virtual for t in many)
    assert span_eight < 1.2 * span_solo  # virtual: ≈ one sequence's time, not eight


# -- KV events ------------------------------------------------------------------------------


def test_kv_events_reach_the_sink_stored_then_removed_on_eviction() -> None:
    profile = _small_decode(12 * PROFILE.block_size)  # 12 blocks: two prompts do not fit
    _, local_a, seq_a = _prompt(0)
    _, local_b, seq_b = _prompt(5000)
    decode_events: list[KvEvent] = []
    prefill_events: list[KvEvent] = []

    async def main() -> None:
        clock = Clock(100.0)
        decode = DecodeEngine(3, profile, clock=clock, kv_sink=decode_events.append)
        prefill = PrefillEngine(4, profile, clock=clock, kv_sink=prefill_events.append)
        await prefill.prefill("p", 128, local_a, seq_a)
        await _collect(decode.generate("a", 128, local_a, seq_a, 16, prefill_locally=True))
        await _collect(decode.generate("b", 128, local_b, seq_b, 16, prefill_locally=True))
        await decode.close()
        await prefill.close()

    _run(main())
    assert prefill_events == [Stored(4, None, tuple(zip(seq_a, local_a, strict=True)))]
    stored = [e for e in decode_events if isinstance(e, Stored)]
    removed = [h for e in decode_events if isinstance(e, Removed) for h in e.block_hashes]
    assert [e.blocks[0][0] for e in stored if e.parent_hash is None] == [seq_a[0], seq_b[0]]
    assert removed and set(removed) <= set(seq_a)  # b's admission evicted a's cached blocks


# -- cancellation ---------------------------------------------------------------------------


def test_cancelled_streams_release_their_kv_lease() -> None:
    _, local, seq = _prompt(0)
    profile = _small_decode(12 * PROFILE.block_size)  # one sequence at a time

    async def main() -> None:
        engine = DecodeEngine(0, profile, clock=Clock(100.0))
        cache, worker = engine.worker.cache, engine.worker
        available = cache.available
        # 1. aclose() after three tokens: aborted, it leaves the batch when the iteration in
        # progress ends, 57 iterations before its last token would have.
        stream = engine.generate("a", 128, local, seq, 60, prefill_locally=True)
        assert [(await anext(stream)).index for _ in range(3)] == [0, 1, 2]
        # Its lease: 8 prompt blocks + 4 private ones for 60 outputs, the whole (tiny) cache.
        assert engine.load() == EngineLoad(0, 12, 12, 12, waiting=0, running=1)
        at_abort = worker.iteration
        await stream.aclose()
        assert engine.load().running == 1  # in the iteration in progress until it ends
        await until(lambda: not engine.in_flight)
        assert worker.iteration <= at_abort + 2 and engine.load().running == 0
        assert cache.available == available and worker.kv_tokens == 0
        assert cache.free + cache.cached_blocks == cache.capacity  # no private block leaked
        # 2. a consumer task cancelled mid-stream, and one cancelled while still pending.
        running = asyncio.create_task(
            _collect(engine.generate("b", 128, local, seq, 60, prefill_locally=True))
        )
        pending = asyncio.create_task(
            _collect(engine.generate("c", 128, local, seq, 60, prefill_locally=True))
        )
        await until(lambda: len(worker.running) == 1 and len(worker.pending) == 1)
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        assert not worker.pending and engine.load().waiting == 0  # withdrawn, never admitted
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await until(lambda: not engine.in_flight)
        assert cache.available == available and worker.kv_tokens == 0
        # The engine still serves.
        assert (
            len(await _collect(engine.generate("d", 128, local, seq, 5, prefill_locally=True))) == 5
        )
        await engine.close()

    _run(main())


def test_cancelled_prefill_callers_are_withdrawn_from_the_queues() -> None:
    big = PROFILE.prefill.max_batch_tokens  # one full iteration each: the others must wait
    _, local_a, seq_a = _prompt(0, big)
    _, local_b, seq_b = _prompt(big, big)

    async def main() -> None:
        clock = Clock(2.0)  # an iteration of `big` tokens lasts ~0.1 s wall
        engine = PrefillEngine(0, PROFILE, clock=clock)
        stamp = clock.now()  # a and b arrive together: both reach the worker, b waits there
        a = asyncio.create_task(engine.prefill("a", big, local_a, seq_a, arrival=stamp))
        b = asyncio.create_task(engine.prefill("b", big, local_b, seq_b, arrival=stamp))
        await until(lambda: len(engine.worker.waiting) == 1)
        c = asyncio.create_task(engine.prefill("c", big, local_b, seq_b))  # in the engine inbox
        await until(lambda: engine.load().waiting == 2)
        kv_total = PROFILE.prefill.kv_capacity_tokens // PROFILE.block_size
        assert engine.load() == EngineLoad(
            3 * big, 0, big // PROFILE.block_size, kv_total, waiting=2, running=1
        )
        for task in (b, c):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert not engine.worker.waiting and engine.load().waiting == 0
        assert engine.load().running == 1 and not a.done()
        assert (await a).cached_tokens == 0
        await until(lambda: not engine.in_flight)
        await engine.close()

    _run(main())


# -- close and drain ------------------------------------------------------------------------


def test_close_fails_every_waiting_caller_promptly() -> None:
    _, local, seq = _prompt(0)
    big = PROFILE.prefill.max_batch_tokens
    _, local_big, seq_big = _prompt(0, big)

    async def expect_closed(call: Awaitable[Any]) -> float:
        with pytest.raises(EngineClosed):
            await call
        return time.monotonic()

    async def main() -> None:
        clock = Clock(1.0)  # real time: nothing below finishes on its own within the test
        prefill = PrefillEngine(0, PROFILE, clock=clock)
        decode = DecodeEngine(1, PROFILE, clock=clock)
        callers = [
            asyncio.create_task(expect_closed(prefill.prefill(f"p{i}", big, local_big, seq_big)))
            for i in range(3)
        ] + [
            asyncio.create_task(
                expect_closed(
                    _collect(
                        decode.generate(f"d{i}", 128, local, seq, 10_000, prefill_locally=True)
                    )
                )
            )
            for i in range(2)
        ]
        await until(lambda: prefill.worker.running and len(decode.worker.running) == 2)
        t_close = time.monotonic()
        await prefill.close()
        await decode.close()
        failed_at = await asyncio.gather(*callers)
        # Failed by close() itself, not by a timeout: every caller fails after close began and
        # before the test's own 60 s guard.
        assert min(failed_at) >= t_close
        with pytest.raises(EngineClosed):
            await prefill.prefill("late", 128, local, seq)
        with pytest.raises(EngineClosed):
            await anext(decode.generate("late", 128, local, seq, 4, prefill_locally=True))
        await decode.close()  # idempotent

    _run(main())


def test_drain_waits_for_in_flight_work_and_refuses_new() -> None:
    _, local, seq = _prompt(0)
    big = PROFILE.prefill.max_batch_tokens
    _, lb, sb = _prompt(0, big)

    async def main() -> None:
        clock = Clock(100.0)
        decode = DecodeEngine(0, PROFILE, clock=clock)
        prefill = PrefillEngine(1, PROFILE, clock=clock)
        streams = [
            asyncio.create_task(
                _collect(decode.generate(f"r{i}", 128, local, seq, 200, prefill_locally=True))
            )
            for i in range(3)
        ]
        prefills = [asyncio.create_task(prefill.prefill(f"p{i}", big, lb, sb)) for i in (0, 1)]
        await asyncio.sleep(0)  # the callers submit
        assert decode.in_flight and prefill.in_flight
        assert await decode.drain(timeout=5.0) and await prefill.drain(timeout=5.0)
        assert all(task.done() for task in [*streams, *prefills])  # drained = all delivered
        assert [len(task.result()) for task in streams] == [200, 200, 200]
        assert decode.load().running == 0 and decode.load().waiting == 0
        with pytest.raises(EngineDraining):
            await anext(decode.generate("late", 128, local, seq, 4, prefill_locally=True))
        with pytest.raises(EngineDraining):
            await prefill.prefill("late", 128, local, seq)
        # A drain that cannot finish in time says so; close() then stops the work.
        slow = DecodeEngine(2, PROFILE, clock=Clock(1.0))
        task = asyncio.create_task(
            _collect(slow.generate("s", 128, local, seq, 10_000, prefill_locally=True))
        )
        await until(lambda: slow.worker.running)
        assert not await slow.drain(timeout=0.01)
        # A drain given up (an abandoned re-split): resume takes new work again, in-flight
        # work went on all along.
        assert slow.resume() and slow.worker.running
        extra = asyncio.create_task(
            _collect(slow.generate("s2", 128, local, seq, 2, prefill_locally=True))
        )
        await until(extra.done)
        assert len(extra.result()) == 2
        await slow.close()
        assert not slow.resume()  # closed is final
        with pytest.raises(EngineClosed):
            await task
        for engine in (decode, prefill):
            await engine.close()

    _run(main())


def test_a_failing_driver_fails_its_callers_with_the_cause() -> None:
    """A KV sink that raises (a bus down) inside an iteration must not leave callers hanging."""
    _, local, seq = _prompt(0)

    def broken_sink(event: KvEvent) -> None:
        raise ConnectionError("bus down")

    async def main() -> None:
        engine = DecodeEngine(0, PROFILE, clock=Clock(100.0), kv_sink=broken_sink)
        with pytest.raises(EngineClosed, match="driver failed") as caught:
            await _collect(engine.generate("a", 128, local, seq, 4, prefill_locally=True))
        assert isinstance(caught.value.__cause__, ConnectionError)
        assert engine.closed
        with pytest.raises(EngineClosed):
            await anext(engine.generate("b", 128, local, seq, 4, prefill_locally=True))
        await engine.close()

    _run(main())
