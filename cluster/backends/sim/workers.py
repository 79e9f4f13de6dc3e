"""Prefill and decode worker actors: the simulator's wall-time engines behind Ray (docs/design.md
"Serve runtime"; interface: the serve spec's "Actor APIs").

Each actor wraps one ``cluster.sim.engines`` engine, driven by a ``Clock`` every actor of the
service shares: the composer passes ``epoch_wall`` (``time.time()`` at service start) and the
speed-up, so virtual times from different processes (a prefill end, a decode token) compare.

KV events: the engine's KV cache calls the sink synchronously from the engine's driver. The sink
only appends; the events of one engine iteration are turned into Dynamo payloads and queued as
one message when the loop next runs (``loop.call_soon``), and ``ActorBus`` publishes them on
``kv_subject(ns, "prefill"|"decode")`` in the background, so a slow or absent NATS never stalls
an iteration. A long prompt's events are split (chained ``stored`` parts) to stay far below
NATS's 1 MiB message limit. On start every worker first publishes ``cleared``: a worker that Ray
restarted holds nothing, and the router must forget what its previous life cached.

Plain classes: the composer decorates them (``ray.remote(PrefillWorkerActor).options(...)``), and
the unit tests instantiate them directly. Arguments and results are JSON-able values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

from cluster.actor_bus import ActorBus, KvPayloads
from cluster.backends.sim.token_streams import DecodeOrder, Frame, StreamHost
from cluster.coalesce import coalesced
from cluster.dataplane.engine_loads import EngineReporter
from cluster.dataplane.routing import Role
from cluster.events import MAX_WORKER_ID
from cluster.kv_wire import kv_subject
from cluster.model_dir import ChatTokenizer, default_model_dir
from cluster.ray.actor_support import (
    MAX_PROMPT_TOKENS,
    Ready,
    check_hashes,
    check_int,
    check_request_id,
    ready_record,
)
from cluster.ray.metrics_export import OWNERS, owned_metrics_text
from cluster.sim.engines import DecodeEngine, PrefillEngine, PrefillResult, Token
from cluster.sim.profile import HardwareProfile, load_profile
from cluster.sim.wallclock import Clock, EngineLoad
from router import Cleared, KvEvent, Removed, Stored, to_payload

__all__ = ["MAX_BLOCKS_PER_MESSAGE", "DecodeWorkerActor", "PrefillWorkerActor", "kv_messages"]

log = logging.getLogger(__name__)

# ~42 msgpack bytes per stored block: 4096 blocks make ~170 KB, well under NATS's 1 MiB.
MAX_BLOCKS_PER_MESSAGE = 4096
PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # an engine's priority is a signed 32-bit int
READY_TIMEOUT_S = 10.0  # how long ready() waits for NATS before answering "not connected"


def _clock(speedup: float, epoch_wall: float) -> Clock:
    """The service's shared virtual clock: virtual 0 is ``epoch_wall`` on every node."""
    if type(epoch_wall) not in (int, float) or not (math.isfinite(epoch_wall) and epoch_wall > 0):
        raise ValueError(f"epoch_wall must be a finite time.time() reading, got {epoch_wall!r}")
    return Clock(speedup, t0=time.monotonic() - (time.time() - epoch_wall))


def _split(event: KvEvent, n: int) -> Iterator[KvEvent]:
    """``event`` in parts of at most ``n`` blocks; stored parts chain through ``parent_hash``."""
    if isinstance(event, Stored) and len(event.blocks) > n:
        parent = event.parent_hash
        for i in range(0, len(event.blocks), n):
            part = event.blocks[i : i + n]
            yield Stored(event.worker, parent, part)
            parent = part[-1][0]  # the next part hangs under this part's last block
    elif isinstance(event, Removed) and len(event.block_hashes) > n:
        for i in range(0, len(event.block_hashes), n):
            yield Removed(event.worker, event.block_hashes[i : i + n])
    else:
        yield event


def kv_messages(
    events: Sequence[KvEvent], max_blocks: int = MAX_BLOCKS_PER_MESSAGE
) -> list[KvPayloads]:
    """Flattened payloads of ``events``, in order, grouped into messages of at most
    ``max_blocks`` blocks (an event without blocks weighs one)."""
    messages: list[KvPayloads] = []
    current: KvPayloads = []
    weight = 0
    for event in events:
        for part in _split(event, max_blocks):
            if isinstance(part, Stored):
                w = len(part.blocks)
            elif isinstance(part, Removed):
                w = len(part.block_hashes)
            else:
                w = 0
            w = max(1, w)
            if current and weight + w > max_blocks:
                messages.append(current)
                current, weight = [], 0
            current.append(to_payload(part))
            weight += w
    if current:
        messages.append(current)
    return messages


class _WorkerActor:
    """What both roles share: clock, profile, KV publishing, load, drain, shutdown."""

    role: ClassVar[Role]
    engine: PrefillEngine | DecodeEngine

    def __init__(
        self, worker_id: int, profile: str, *, speedup: float, epoch_wall: float, seed: int,
        nats_url: str | None, namespace: str,
    ) -> None:  # fmt: skip
        self.worker_id = check_int("worker_id", worker_id, 0, MAX_WORKER_ID)
        self.seed = check_int("seed", seed, 0, 2**63 - 1)
        self.profile: HardwareProfile = load_profile(profile)
        self.clock = _clock(speedup, epoch_wall)
        self.bus = ActorBus(nats_url, namespace, role="worker", name=f"{self.role}-{worker_id}")
        self.kv_subject = kv_subject(namespace, component=self.role)
        self._pending: list[KvEvent] = []
        self._flush_scheduled = False
        self._started = False
        self.kv_events = 0  # events the engine emitted
        self._max_blocks = MAX_PROMPT_TOKENS // self.profile.block_size
        # The engine's own load for the replicas' views (cluster/dataplane/engine_loads.py).
        self.load_reporter = EngineReporter(
            self.worker_id, self.role, self._engine_load, self.bus.publish
        )
        self._reporting: asyncio.Task[None] | None = None

    def _start(self) -> None:
        """First call from the actor's loop: start publishing, led by ``cleared``."""
        if not self._started:
            self._started = True
            self.bus.start()
            self._sink(Cleared(self.worker_id))
            if self.bus.bus is not None:  # without NATS nobody would read the snapshots
                self._reporting = asyncio.get_running_loop().create_task(self.load_reporter.run())

    def _engine_load(self) -> tuple[int, int, int]:
        load = self.engine.load()
        return load.active_prefill_tokens, load.active_decode_blocks, load.waiting + load.running

    def _sink(self, event: KvEvent) -> None:
        self._pending.append(event)
        self.kv_events += 1
        if not self._flush_scheduled:
            try:
                asyncio.get_running_loop().call_soon(self._flush_kv)
                self._flush_scheduled = True
            except RuntimeError:  # no loop running: the next flush takes it
                pass

    def _flush_kv(self) -> None:
        """Queue the iteration's events (everything the sink got since the last flush)."""
        self._flush_scheduled = False
        events, self._pending = self._pending, []
        for payloads in kv_messages(events):
            self.bus.publish_kv(self.kv_subject, payloads, self.worker_id)

    def _check_prompt(
        self, request_id: object, prompt_tokens: object, local_hashes: object, seq_hashes: object
    ) -> tuple[str, int, list[int], list[int]]:
        self._start()
        return (
            check_request_id(request_id),
            check_int("prompt_tokens", prompt_tokens, 1, MAX_PROMPT_TOKENS),
            check_hashes("local_hashes", local_hashes, self._max_blocks),
            check_hashes("seq_hashes", seq_hashes, self._max_blocks),
        )

    async def ready(self) -> Ready:
        self._start()
        connected = await self.bus.wait_connected(READY_TIMEOUT_S)
        nats = connected if self.bus.bus is not None else None  # None: running without NATS
        return ready_record(self.role, nats=nats, worker_id=self.worker_id)

    async def load(self) -> EngineLoad:
        self._start()
        return self.engine.load()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait up to ``timeout_s`` wall seconds for what is in flight."""
        self._start()
        if type(timeout_s) not in (int, float) or not (math.isfinite(timeout_s) and timeout_s >= 0):
            raise ValueError(f"timeout_s must be a finite number >= 0, got {timeout_s!r}")
        return await self.engine.drain(timeout_s)

    async def resume(self) -> bool:
        """Take new work again after a ``drain`` (a re-split abandoned because the drain timed
        out, cluster/ray/pools.py). False if the engine is closed."""
        self._start()
        return self.engine.resume()

    async def metrics_text(self) -> str:
        """Workers own no family of their own: only the drops every process exports."""
        return owned_metrics_text(OWNERS["worker"])

    async def shutdown(self) -> None:
        if self._reporting is not None:
            self._reporting.cancel()
        await self.engine.close()
        self._flush_kv()  # what the last iteration emitted still goes out
        await self.bus.close()


class PrefillWorkerActor(_WorkerActor):
    role: ClassVar[Role] = "prefill"

    def __init__(
        self, worker_id: int, profile: str, *, speedup: float, epoch_wall: float, seed: int,
        nats_url: str | None, namespace: str = "disagg",
    ) -> None:  # fmt: skip
        super().__init__(
            worker_id, profile, speedup=speedup, epoch_wall=epoch_wall, seed=seed,
            nats_url=nats_url, namespace=namespace,
        )  # fmt: skip
        self.engine: PrefillEngine = PrefillEngine(
            self.worker_id, self.profile, clock=self.clock, seed=self.seed, kv_sink=self._sink
        )

    async def prefill(
        self, request_id: str, prompt_tokens: int, local_hashes: list[int],
        seq_hashes: list[int], priority: int = 0,
    ) -> PrefillResult:  # fmt: skip
        """Prefill a prompt; returns when its KV is on this worker (virtual seconds).
        ``priority``: lower first in the worker's queue."""
        args = self._check_prompt(request_id, prompt_tokens, local_hashes, seq_hashes)
        rank = check_int("priority", priority, *PRIORITY_RANGE)
        return await self.engine.prefill(*args, priority=rank)


class DecodeWorkerActor(_WorkerActor):
    role: ClassVar[Role] = "decode"

    def __init__(
        self, worker_id: int, profile: str, *, speedup: float, epoch_wall: float, seed: int,
        nats_url: str | None, namespace: str = "disagg", model_dir: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(
            worker_id, profile, speedup=speedup, epoch_wall=epoch_wall, seed=seed,
            nats_url=nats_url, namespace=namespace,
        )  # fmt: skip
        path = (
            Path(model_dir)
            if model_dir is not None
            else default_model_dir(self.profile.context_tokens)
        )
        self.tokenizer = ChatTokenizer.from_dir(path)
        self.engine: DecodeEngine = DecodeEngine(
            self.worker_id, self.profile, clock=self.clock, seed=self.seed, kv_sink=self._sink,
            token_sampler=self._sample,
        )  # fmt: skip
        self.streams = StreamHost(self._order_ids, self._check_order)

    def _sample(self, request_id: str, n: int) -> list[int]:
        # Seeded by the request id alone: a retry on another worker streams the same text.
        return self.tokenizer.sample_output_ids(zlib.crc32(request_id.encode()), n)

    async def uncached_tokens(self, seq_hashes: list[int], prompt_tokens: int) -> int:
        """Prompt tokens this worker's cache lacks now (what a KV transfer must bring)."""
        self._start()
        prompt = check_int("prompt_tokens", prompt_tokens, 1, MAX_PROMPT_TOKENS)
        hashes = check_hashes("seq_hashes", seq_hashes, self._max_blocks)
        return self.engine.uncached_tokens(hashes, prompt)

    # -- the replicas' shared streams (cluster/backends/sim/token_streams.py)
    # ---------------------------

    def _check_order(self, order: DecodeOrder) -> None:
        self._check_prompt(order.request_id, order.prompt_tokens, list(order.local_hashes),
                           list(order.seq_hashes))  # fmt: skip
        check_int("output_tokens", order.output_tokens, 1, self.tokenizer.context_tokens)
        check_int("priority", order.priority, *PRIORITY_RANGE)
        if type(order.prefill_locally) is not bool:
            raise ValueError(f"prefill_locally must be a bool, got {order.prefill_locally!r}")

    async def _order_ids(self, order: DecodeOrder) -> AsyncGenerator[int, None]:
        tokens = self.engine.generate(
            order.request_id, order.prompt_tokens, list(order.local_hashes),
            list(order.seq_hashes), order.output_tokens, prefill_locally=order.prefill_locally,
            priority=order.priority,
        )  # fmt: skip
        async with contextlib.aclosing(tokens):
            async for token in tokens:
                yield token.token_id

    async def submit(
        self, stream_id: str, orders: list[DecodeOrder], withdrawn: list[str] | None = None
    ) -> list[str | None]:
        """Start ``orders`` for the stream ``stream_id`` and stop its ``withdrawn`` requests;
        per order None, or why it was refused."""
        self._start()
        return self.streams.submit(stream_id, orders, withdrawn or ())

    async def frames(self, stream_id: str, interval_s: float) -> AsyncGenerator[Frame, None]:
        """The stream's frames (a Ray streaming generator), until its consumer leaves."""
        self._start()
        interval = _check_interval(interval_s, "interval_s")
        async with contextlib.aclosing(self.streams.frames(stream_id, interval)) as frames:
            async for frame in frames:
                yield frame

    async def drain(self, timeout_s: float) -> bool:
        """As the engine's drain, then until the streams have sent every token and end, then
        until their consumers have closed them (``StreamHost.close_streams``): a role switch
        that stopped this actor while a last frame was still on its way would cut it off,
        and its requests would fail mid-stream. A consumer that has not closed its stream
        within ``CLOSE_ACK_S`` of being told is gone or hung: the drain ends without it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s if isinstance(timeout_s, int | float) else 0.0)
        if not await super().drain(timeout_s):
            return False
        while not self.streams.delivered:
            if loop.time() >= deadline or not self.engine.draining:  # timed out, or resumed
                return False
            await asyncio.sleep(0.01)
        self.streams.close_streams()
        acked_by = loop.time() + CLOSE_ACK_S
        while self.streams.attached and loop.time() < acked_by:
            await asyncio.sleep(0.01)
        if self.streams.attached:
            log.warning("decode worker %d: %d token streams still open after the drain",
                        self.worker_id, self.streams.attached)  # fmt: skip
        return True

    async def shutdown(self) -> None:
        self.streams.close()
        await super().shutdown()

    async def generate(
        self, request_id: str, prompt_tokens: int, local_hashes: list[int],
        seq_hashes: list[int], output_tokens: int, prefill_locally: bool,
        chunk_interval_s: float = 0.0,
    ) -> AsyncGenerator[list[TokenRow], None]:  # fmt: skip
        """Decode ``output_tokens`` tokens; yields chunks ``[[index, token_id, t_virtual], ...]``.

        One request's own stream, with the virtual time of each token: for a caller that holds
        no shared stream (tools, tests). The service's replicas share one stream per worker
        (``submit`` and ``frames`` above), which bounds the Ray objects a worker sends.

        A chunk holds the tokens produced since the previous one was taken. The first token
        leaves at once (the TTFT); after it, a chunk leaves at most every ``chunk_interval_s``
        wall seconds, holding every token decoded meanwhile, and the last one as soon as the
        sequence ends (0: one chunk per decode iteration). Each chunk is one Ray object, the
        measured cost of a stream (docs/design.md "Data flow"). Under Ray this is a streaming
        generator. A consumer that goes away (``ray.cancel``, ``aclose``) stops the engine's
        generator, which withdraws or abandons the sequence.
        """
        args = self._check_prompt(request_id, prompt_tokens, local_hashes, seq_hashes)
        n = check_int("output_tokens", output_tokens, 1, self.tokenizer.context_tokens)
        if type(prefill_locally) is not bool:
            raise ValueError(f"prefill_locally must be a bool, got {prefill_locally!r}")
        interval = _check_interval(chunk_interval_s)
        tokens = self.engine.generate(*args, n, prefill_locally=prefill_locally)
        async with contextlib.aclosing(coalesced(_rows(tokens), interval)) as chunks:
            async for chunk in chunks:
                yield chunk


MAX_CHUNK_INTERVAL_S = 1.0
TokenRow = list[int | float]  # [index, token id, virtual time]
# One frame's round trip is milliseconds; a consumer silent for this long will not answer.
CLOSE_ACK_S = 5.0


def _check_interval(value: object, name: str = "chunk_interval_s") -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0.0 <= value <= MAX_CHUNK_INTERVAL_S
    ):
        raise ValueError(f"{name} must be a number in [0, {MAX_CHUNK_INTERVAL_S}], got {value!r}")
    return float(value)


async def _rows(tokens: AsyncIterator[Token]) -> AsyncGenerator[list[TokenRow], None]:
    async with contextlib.aclosing(tokens):  # type: ignore[type-var]
        async for token in tokens:
            yield [_row(token)]


def _row(token: Token) -> TokenRow:
    return [token.index, token.token_id, token.t_virtual]
