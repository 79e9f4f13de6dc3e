"""A decode worker's shared token streams (cluster/backends/sim/token_streams.py), in-process on
the real
worker actor class (no Ray): orders in batches, frames that carry every request's tokens, the
frame rule, refusals, and requests withdrawn when their consumer leaves."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from cluster.backends.sim import token_streams, workers
from cluster.backends.sim.token_streams import MAX_ORDERS_PER_SUBMIT, DecodeOrder, Frame, StreamPart
from cluster.backends.sim.workers import DecodeWorkerActor
from cluster.model_dir import ChatTokenizer, default_model_dir
from router import block_hashes, sequence_hashes

PROFILE = "b200-llama70b-fp8-tp4"


def _decode(speedup: float = 50.0) -> DecodeWorkerActor:
    return DecodeWorkerActor(1, PROFILE, speedup=speedup, epoch_wall=time.time(), seed=2,
                             nats_url=None)  # fmt: skip


def _order(rid: str, n: int = 8, prompt: int = 48, start: int = 100) -> DecodeOrder:
    local = block_hashes(list(range(start, start + prompt)), 16)
    return DecodeOrder(rid, prompt, tuple(local), tuple(sequence_hashes(local)), n, True)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


async def _until_ended(
    frames: AsyncIterator[Frame], rids: set[str], arrivals: list[tuple[float, Frame]] | None = None,
    *, read: tuple[Frame, ...] = (),
) -> dict[str, list[StreamPart]]:
    """Every part for ``rids`` until each has ended (``read``: frames taken already)."""
    parts: dict[str, list[StreamPart]] = {rid: [] for rid in rids}
    open_ = set(rids)
    seq = 0
    for frame in read:
        seq = frame.seq
        for part in frame.parts:
            parts.setdefault(part.request_id, []).append(part)
    async for frame in frames:
        assert frame.seq == seq + 1  # no frame lost
        seq = frame.seq
        if arrivals is not None:
            arrivals.append((time.monotonic(), frame))
        for part in frame.parts:
            parts.setdefault(part.request_id, []).append(part)
            if part.end is not None:
                open_.discard(part.request_id)
        if not open_:
            return parts
    raise AssertionError("the stream ended early")


def test_one_stream_carries_every_request_tokens_in_order_to_their_end() -> None:
    async def body() -> None:
        worker = _decode()
        async with contextlib.aclosing(worker.frames("r0.a", 0.0)) as frames:
            refused = await worker.submit("r0.a", [_order("x", 12), _order("y", 5, start=900)])
            assert refused == [None, None]
            parts = await _until_ended(frames, {"x", "y"})
        tokenizer = ChatTokenizer.from_dir(default_model_dir())
        for rid, n in (("x", 12), ("y", 5)):
            ids = [t for p in parts[rid] for t in p.token_ids]
            # The same text a request's own stream would carry (seeded by the request id).
            assert ids == tokenizer.sample_output_ids(zlib.crc32(rid.encode()), n)
            assert [p.end for p in parts[rid]][-1] == "done"
            assert all(p.end is None for p in parts[rid][:-1])
        assert worker.streams.running == 0
        await worker.shutdown()

    _run(body)


def test_first_tokens_and_ends_leave_at_once_the_rest_every_interval() -> None:
    async def body() -> None:
        worker = _decode(speedup=1.0)  # ~8.5 ms decode steps in wall time
        interval = 0.05
        arrivals: list[tuple[float, Frame]] = []
        async with contextlib.aclosing(worker.frames("r0.b", interval)) as frames:
            await worker.submit("r0.b", [_order("long", 30)])
            parts = await _until_ended(frames, {"long"}, arrivals)
        ids = [t for p in parts["long"] for t in p.token_ids]
        assert len(ids) == 30  # nothing lost
        # The first token did not wait for the interval...
        assert len(arrivals[0][1].parts[0].token_ids) == 1  # alone, not ~6 of an interval
        # ...and between the first frame and the end the others were gathered per interval:
        # 29 tokens of ~8.5 ms in far fewer frames, each at least an interval after the last.
        middle = [t for t, _ in arrivals[:-1]]
        gaps = [b - a for a, b in itertools.pairwise(middle[1:])]
        assert all(gap >= 0.045 for gap in gaps), gaps
        assert len(arrivals) < 15
        await worker.shutdown()

    _run(body)


def test_a_consumer_that_leaves_withdraws_its_requests_from_the_engine() -> None:
    async def body() -> None:
        worker = _decode()
        frames = worker.frames("r0.c", 0.0)
        await worker.submit("r0.c", [_order("a", 3000), _order("b", 3000, start=700)])
        first = await anext(frames)
        assert {p.request_id for p in first.parts} <= {"a", "b"}
        await frames.aclose()  # what Ray does when the replica goes away
        assert worker.streams.running == 0
        assert await worker.drain(10.0)
        assert (await worker.load()).running == 0
        await worker.shutdown()

    _run(body)


def test_a_withdrawn_request_stops_and_its_neighbour_runs_on() -> None:
    async def body() -> None:
        worker = _decode()
        async with contextlib.aclosing(worker.frames("r0.d", 0.0)) as frames:
            await worker.submit("r0.d", [_order("stay", 40), _order("go", 3000, start=700)])
            first = await anext(frames)
            assert await worker.submit("r0.d", [], ["go"]) == []
            parts = await _until_ended(frames, {"stay"}, read=(first,))
        assert sum(len(p.token_ids) for p in parts["stay"]) == 40
        assert parts["stay"][-1].end == "done"
        assert all(p.end is None for p in parts.get("go", []))  # withdrawn: no end, no more
        assert worker.streams.running == 0
        await worker.shutdown()

    _run(body)


@pytest.mark.parametrize(
    ("order", "field"),
    [
        (_order("r", n=0), "output_tokens"),
        (DecodeOrder("", 48, (), (), 4, True), "request_id"),
        (DecodeOrder("r", 0, (), (), 4, True), "prompt_tokens"),
        (DecodeOrder("r", 48, ("x",), (), 4, True), "local_hashes"),  # type: ignore[arg-type]
        (DecodeOrder("r", 48, (), (), 4, 1), "prefill_locally"),  # type: ignore[arg-type]
        ("not an order", "DecodeOrder"),
    ],
)
def test_a_bad_order_is_refused_naming_the_field_and_starts_nothing(order: Any, field: str) -> None:
    async def body() -> None:
        worker = _decode()
        refused = await worker.submit("r0.e", [order, _order("fine", 2)])
        assert refused[0] is not None and field in refused[0] and refused[1] is None
        assert worker.streams.running <= 1
        await worker.shutdown()

    _run(body)


def test_bad_streams_and_batches_are_refused() -> None:
    async def body() -> None:
        worker = _decode()
        for stream_id in ("", "a b", "x" * 129, 5):
            with pytest.raises(ValueError, match="stream_id"):
                await worker.submit(stream_id, [])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="at most"):
            await worker.submit("r0.f", [_order(f"q{i}") for i in range(MAX_ORDERS_PER_SUBMIT + 1)])
        with pytest.raises(ValueError, match="interval_s"):
            await anext(worker.frames("r0.f", -1.0))
        assert await worker.submit("r0.f", [_order("dup", 3000)]) == [None]
        assert "already running" in str((await worker.submit("r0.f", [_order("dup")]))[0])
        frames = worker.frames("r0.f", 0.0)
        await anext(frames)
        with pytest.raises(ValueError, match="open already"):
            await anext(worker.frames("r0.f", 0.0))
        await frames.aclose()
        await worker.shutdown()

    _run(body)


def test_a_draining_engine_ends_new_orders_with_the_reason() -> None:
    async def body() -> None:
        worker = _decode()
        assert await worker.drain(1.0)
        async with contextlib.aclosing(worker.frames("r0.g", 0.0)) as frames:
            await worker.submit("r0.g", [_order("late", 2)])
            parts = await _until_ended(frames, {"late"})
        assert parts["late"][-1].end == "draining" and parts["late"][-1].token_ids == ()
        await worker.shutdown()

    _run(body)


def test_a_stream_nobody_reads_is_dropped_with_its_requests(monkeypatch: Any) -> None:
    monkeypatch.setattr(token_streams, "ATTACH_TIMEOUT_S", 0.05)

    async def body() -> None:
        worker = _decode()
        await worker.submit("r0.h", [_order("orphan", 3000)])
        assert worker.streams.running == 1
        await asyncio.sleep(0.2)
        assert worker.streams.running == 0
        assert await worker.drain(10.0)
        await worker.shutdown()

    _run(body)


def test_a_drain_waits_until_the_consumer_has_the_last_frame() -> None:
    """The engine may finish before its stream has sent the last tokens; the worker reports
    drained (and a re-split may stop it) only once they have left."""

    async def body() -> None:
        worker = _decode()
        async with contextlib.aclosing(worker.frames("r0.d", 0.0)) as frames:
            await worker.submit("r0.d", [_order("last", 6)])
            first = await anext(frames)  # the first token; the rest wait, unread
            drain = asyncio.ensure_future(worker.drain(10.0))
            await asyncio.wait_for(worker.engine.drain(10.0), 10.0)  # the engine is done...
            await asyncio.sleep(0.05)
            assert not drain.done() and not worker.streams.delivered  # ...its stream is not
            parts = await _until_ended(frames, {"last"}, read=(first,))
            # Then the worker says it is leaving, and waits for the consumer to close.
            closing = await asyncio.wait_for(anext(frames), 5.0)
            assert closing.closing and closing.parts == ()
            await asyncio.sleep(0.05)
            assert not drain.done()
        assert await asyncio.wait_for(drain, 5.0) is True  # closed: the acknowledgement
        assert sum(len(p.token_ids) for p in parts["last"]) == 6
        await worker.shutdown()

    _run(body)


def test_a_drain_does_not_wait_forever_for_a_consumer_that_never_closes(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(workers, "CLOSE_ACK_S", 0.2)

    async def body() -> None:
        worker = _decode()
        async with contextlib.aclosing(worker.frames("r0.s", 0.0)) as frames:
            await worker.submit("r0.s", [_order("one", 2)])
            await _until_ended(frames, {"one"})
            reading = asyncio.ensure_future(anext(frames))  # reads on, never closes
            assert await asyncio.wait_for(worker.drain(10.0), 5.0) is True
            assert worker.streams.attached == 1  # it ended without the acknowledgement
            assert (await reading).closing
            # A stream that opens after the drain is told at once, and refuses its orders.
            async with contextlib.aclosing(worker.frames("r1.s", 0.0)) as late:
                await worker.submit("r1.s", [_order("late", 2)])
                parts = await _until_ended(late, {"late"})
            assert parts["late"][-1].end == "draining"
        await worker.shutdown()

    _run(body)


def test_a_drain_given_up_by_resume_ends_false_and_leaves_the_streams_open() -> None:
    async def body() -> None:
        worker = _decode()
        async with contextlib.aclosing(worker.frames("r0.u", 0.0)) as frames:
            await worker.submit("r0.u", [_order("long", 200)])
            first = await anext(frames)
            drain = asyncio.ensure_future(worker.drain(30.0))
            await asyncio.sleep(0.02)
            assert await worker.resume() and not drain.done()
            parts = await _until_ended(frames, {"long"}, read=(first,))
            assert await asyncio.wait_for(drain, 5.0) is False  # given up: nothing may stop
            assert parts["long"][-1].end == "done" and not worker.streams.closing
        async with contextlib.aclosing(worker.frames("r0.v", 0.0)) as frames:
            await worker.submit("r0.v", [_order("next", 2, start=500)])  # it takes work again
            parts = await _until_ended(frames, {"next"})
            assert parts["next"][-1].end == "done"
        await worker.shutdown()

    _run(body)
