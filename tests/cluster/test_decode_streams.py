"""An ingress replica's links to its decode workers (cluster/backends/sim/decode_streams.py),
against the
stand-in worker of test_request_path (the real StreamHost behind fake actor calls): requests
share one stream and batch their orders, a consumer that leaves is withdrawn, a dead worker
fails every request of its stream and the next request opens a fresh one."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from cluster.backends.sim import decode_streams
from cluster.backends.sim.decode_streams import DecodeStreams
from cluster.backends.sim.token_streams import DecodeOrder
from cluster.ray.worker_handles import Workers
from cluster.serve.backend import WorkerFailed
from tests.cluster.test_request_path import Decode


def _order(rid: str, n: int = 4) -> DecodeOrder:
    return DecodeOrder(rid, 32, (), (), n, True)


def _streams(decode: Any) -> tuple[DecodeStreams, collections.Counter[str]]:
    calls: collections.Counter[str] = collections.Counter()
    return DecodeStreams(Workers({}, {1: decode}), "r0", interval_s=0.0, calls=calls), calls


async def _after(gate: asyncio.Event, value: Any) -> Any:
    await gate.wait()
    return value


async def _tokens(streams: DecodeStreams, order: DecodeOrder) -> list[int]:
    return [t async for ids in streams.tokens(1, order) for t in ids]


def test_concurrent_requests_share_one_stream_and_batch_their_orders() -> None:
    async def body() -> None:
        decode = Decode()
        streams, calls = _streams(decode)
        got = await asyncio.gather(*(_tokens(streams, _order(f"q{i}", 3 + i)) for i in range(10)))
        assert got == [[100 + j for j in range(3 + i)] for i in range(10)]
        assert len(decode.frames.calls) == 1  # one stream for all ten
        # All ten joined before the link's send ran: one submit carried them.
        assert calls["submit"] == len(decode.submit.calls) == 1
        # One more while a submit is in flight waits for it, then goes in the next.
        gate = asyncio.Event()
        held = decode.submit.impl
        decode.submit.impl = lambda *a: _after(gate, held(*a))
        first = asyncio.ensure_future(_tokens(streams, _order("x")))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(_tokens(streams, _order("y")))
        await asyncio.sleep(0.01)
        assert len(decode.submit.calls) == 2  # x's submit in flight; y waits
        gate.set()
        assert await first == await second == [100, 101, 102, 103]
        assert len(decode.submit.calls) == 3
        await streams.aclose()

    asyncio.run(body())


def test_a_request_whose_consumer_leaves_is_withdrawn_from_the_worker() -> None:
    async def body() -> None:
        decode = Decode()
        streams, _ = _streams(decode)
        tokens = streams.tokens(1, _order("gone", 10_000))
        assert await anext(tokens) == (100,)
        await tokens.aclose()
        for _ in range(100):  # the withdrawal rides the link's next submit
            if decode.host.running == 0:
                break
            await asyncio.sleep(0.01)
        assert decode.submit.calls[-1][2] == ["gone"] and decode.host.running == 0
        assert await _tokens(streams, _order("next", 2)) == [100, 101]  # the stream lives on
        await streams.aclose()

    asyncio.run(body())


def test_a_dead_worker_fails_its_stream_and_the_next_request_opens_a_new_one() -> None:
    async def body() -> None:
        decode = Decode(die_after=1)
        streams, _ = _streams(decode)
        with pytest.raises(WorkerFailed, match="decode worker 1: ActorDiedError"):
            await _tokens(streams, _order("a", 50))
        assert streams.workers.decode == {}  # forgotten: the next request looks it up again
        streams.workers.decode[1] = revived = Decode()
        assert await _tokens(streams, _order("b", 2)) == [100, 101]
        assert len(revived.frames.calls) == 1
        await streams.aclose()

    asyncio.run(body())


def test_a_refused_order_raises_the_worker_reason() -> None:
    async def body() -> None:
        decode = Decode()
        def refuse(order: DecodeOrder) -> None:
            raise ValueError("output_tokens bad")

        decode.host._check = refuse
        streams, _ = _streams(decode)
        with pytest.raises(ValueError, match="decode worker 1: output_tokens bad"):
            await _tokens(streams, _order("bad"))
        await streams.aclose()

    asyncio.run(body())


def test_a_worker_that_leaves_its_role_has_its_stream_closed_once_its_requests_end(
    monkeypatch: Any,
) -> None:
    """The closing frame (a re-split's drain): requests on the stream run to their end, a new
    one is sent elsewhere, and the link closes (the worker's acknowledgement) once empty."""
    cancelled: list[Any] = []
    monkeypatch.setattr(decode_streams, "ray_cancel", cancelled.append)

    async def body() -> None:
        decode = Decode()
        streams, _ = _streams(decode)
        running = streams.tokens(1, _order("running", 50))
        assert await anext(running) == (100,)
        link = streams._links[1]
        decode.host.close_streams()
        while not link.closing:
            await asyncio.sleep(0.001)
        with pytest.raises(WorkerFailed, match="decode worker 1: is leaving its role"):
            await _tokens(streams, _order("new"))
        assert link.failed is None  # still open: "running" has not ended
        rest = [t async for ids in running for t in ids]
        assert [100, *rest] == [100 + j for j in range(50)]
        assert link.failed is not None and cancelled == [link.frames]
        await asyncio.wait_for(asyncio.gather(link.reader, return_exceptions=True), 1.0)
        assert 1 not in streams._links  # the next request opens a new stream
        await streams.aclose()

    asyncio.run(body())


def test_a_submit_that_never_returns_fails_its_requests_within_the_deadline() -> None:
    """[21] 3: a decode worker whose ``submit`` never returns (a wedged engine) gives every
    request of its stream a ``WorkerFailed`` naming it within ``submit_timeout_s`` (the path
    places the request again before its first token, else answers 503 naming the worker)."""

    async def body() -> None:
        decode = Decode()
        decode.submit.impl = lambda *a: asyncio.sleep(3600)
        streams = DecodeStreams(Workers({}, {1: decode}), "r0", interval_s=0.0,
                                submit_timeout_s=0.2)  # fmt: skip
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(WorkerFailed, match=r"decode worker 1: .*did not take its orders"):
            await asyncio.wait_for(_tokens(streams, _order("stuck")), timeout=5.0)
        assert loop.time() - t0 < 1.0
        await streams.aclose()

    asyncio.run(body())
