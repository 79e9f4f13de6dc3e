"""Prefill and decode engines: the simulator's workers serving requests in wall time
(docs/design.md §6; the driver, clock and shutdown are in ``cluster.sim.wallclock``).

``PrefillEngine`` wraps a ``PrefillWorker`` (chunked prefill, iteration (a + b·tokens +
c·requests)·ε): ``await prefill(...)`` returns when the iteration that computes the prompt's last
chunk ends. ``DecodeEngine`` wraps a ``DecodeWorker`` (continuous batching, iteration (d0 +
d1·batch + d2·kv)·ε plus local prefill): ``generate(...)`` yields one ``Token`` per iteration the
sequence is in, as that iteration ends. Every running sequence gets one token per iteration, so
the driver takes the running list before ``finish_iteration``; a sequence admitted at iteration
k yields tokens 0..n−1 at the ends of iterations k..k+n−1 (first at k, last at k+n−1).

``seed`` seeds the worker's iteration jitter; ``SimCluster`` gives worker w the seed
seed·7919 + w, so engines built with those seeds replay its history (same virtual times).

Between the engines a caller moves the KV itself (as ``SimCluster`` does): a transfer of
link.latency_s + missing·kv_bytes_per_token / link bytes per second, ``missing`` being
``DecodeEngine.uncached_tokens``, then ``generate(..., prefill_locally=False)``.

Cancellation. A consumer that stops (``aclose()``, task cancellation, a client's disconnect) is
handled by where its request is:
- not yet admitted (engine inbox, ``PrefillWorker.waiting``, ``DecodeWorker.pending``): removed;
  it holds no KV lease yet, so nothing else changes;
- admitted to a decode worker: aborted (``DecodeWorker.abort``): it leaves the batch when the
  iteration in progress ends, its slot and KV blocks freed then, as a serving engine frees an
  aborted request's (vLLM's ``abort_request``); the model's KV accounting stays exact. A
  prefill in progress runs to its end (one iteration or a few chunks) and its result is
  dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cluster.sim.decode import DecodeSeq, DecodeWorker
from cluster.sim.kv_cache import KvEventSink
from cluster.sim.prefill import PrefillJob, PrefillWorker
from cluster.sim.profile import HardwareProfile
from cluster.sim.wallclock import Clock, EngineClosed, EngineLoad, WallEngine

VOCAB = 32000  # default token ids are uniform over [0, VOCAB)

TokenSampler = Callable[[str, int], Sequence[int]]  # (request_id, n) -> n token ids


@dataclass(frozen=True)
class PrefillResult:
    """A finished prefill, in virtual seconds; ``queued_s``: from arrival to its first chunk."""

    cached_tokens: int
    queued_s: float
    started_at: float
    finished_at: float


@dataclass(frozen=True)
class Token:
    """Output token ``index`` (0-based) of a sequence, produced by the iteration ending at
    ``t_virtual``; ``first``/``last``: the sequence's first/last token."""

    index: int
    token_id: int
    t_virtual: float
    first: bool
    last: bool


def _check_prompt(
    request_id: str,
    prompt_tokens: int,
    local_hashes: Sequence[int],
    seq_hashes: Sequence[int],
    block_size: int,
) -> None:
    if prompt_tokens < 1:
        raise ValueError(f"request {request_id!r}: prompt_tokens must be >= 1, got {prompt_tokens}")
    if len(local_hashes) != len(seq_hashes):
        raise ValueError(f"request {request_id!r}: local and sequence hashes differ in length")
    if len(seq_hashes) * block_size > prompt_tokens:
        raise ValueError(f"request {request_id!r}: more block hashes than complete prompt blocks")


class PrefillEngine(WallEngine[PrefillJob]):
    def __init__(
        self,
        worker_id: int,
        profile: HardwareProfile,
        *,
        clock: Clock,
        seed: int = 0,
        kv_sink: KvEventSink | None = None,
    ) -> None:
        super().__init__(worker_id, clock)
        self.worker = PrefillWorker(
            worker_id, profile.prefill, profile.block_size, seed=seed, sink=kv_sink
        )
        self._futures: dict[PrefillJob, asyncio.Future[PrefillResult]] = {}

    async def prefill(
        self,
        request_id: str,
        prompt_tokens: int,
        local_hashes: Sequence[int],
        seq_hashes: Sequence[int],
        *,
        arrival: float | None = None,
        priority: int = 0,
    ) -> PrefillResult:
        """Prefill a prompt; returns when its last chunk is computed (KV then on this worker).
        ``arrival``: virtual arrival time, default now (see ``WallEngine._accept``); ``priority``:
        its place in the worker's queue, lower first (``cluster/sim/engine_queue.py``)."""
        _check_prompt(request_id, prompt_tokens, local_hashes, seq_hashes, self.worker.block_size)
        job = PrefillJob(request_id, prompt_tokens, local_hashes, seq_hashes, priority=priority)
        future: asyncio.Future[PrefillResult] = asyncio.get_running_loop().create_future()
        self._accept(job, arrival)
        self._futures[job] = future
        try:
            return await future
        except asyncio.CancelledError:
            # Not yet admitted: forget it. Admitted: it finishes in the model, result dropped.
            if self._withdraw(job):
                self._futures.pop(job, None)
            elif job in self.worker.waiting:  # queued in the worker, no lease yet
                self.worker.waiting.remove(job)
                self._futures.pop(job, None)
                self._wake.set()
            raise

    def load(self) -> EngineLoad:
        inbox = sum(job.prompt_tokens for _, _, job in self._inbox)
        w = self.worker
        return EngineLoad(
            active_prefill_tokens=w.queued_tokens + inbox,
            active_decode_blocks=0,
            kv_used_blocks=w.cache.used,
            kv_total_blocks=w.cache.capacity,
            waiting=len(self._inbox) + len(w.waiting),
            running=len(w.running),
        )

    def _busy(self) -> bool:
        return bool(self.worker.waiting or self.worker.running)

    def _submit(self, item: PrefillJob, arrival: float) -> None:
        self.worker.submit(item, arrival)

    def _start(self, t: float) -> float | None:
        return self.worker.start_iteration(t)

    def _finish(self, t: float) -> None:
        for job in self.worker.finish_iteration(t):
            future = self._futures.pop(job, None)
            if future is None or future.done():  # its caller was cancelled
                continue
            assert job.started_at is not None and job.finished_at is not None
            future.set_result(
                PrefillResult(
                    cached_tokens=job.cached_tokens,
                    queued_s=job.started_at - job.enqueued_at,
                    started_at=job.started_at,
                    finished_at=job.finished_at,
                )
            )

    def _fail_waiters(self, error: Callable[[], EngineClosed]) -> None:
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(error())


@dataclass(eq=False)
class _Stream:
    """One generate() call: its sequence, its token ids, and the queue its tokens go to."""

    seq: DecodeSeq
    ids: list[int]
    queue: asyncio.Queue[Token | EngineClosed]
    emitted: int = 0
    finished: bool = False  # its last token was produced
    abandoned: bool = False  # its consumer stopped: tokens are dropped


class DecodeEngine(WallEngine[DecodeSeq]):
    def __init__(
        self,
        worker_id: int,
        profile: HardwareProfile,
        *,
        clock: Clock,
        seed: int = 0,
        kv_sink: KvEventSink | None = None,
        token_sampler: TokenSampler | None = None,
    ) -> None:
        super().__init__(worker_id, clock)
        self.worker = DecodeWorker(
            worker_id,
            profile.decode,
            profile.block_size,
            seed=seed,
            sink=kv_sink,
            attention_s_per_token_pair=profile.prefill.e_s_per_token_pair,
        )
        if token_sampler is None:
            # Its own stream, not the worker's jitter stream: token ids never change timings.
            rng = np.random.default_rng((seed, 1))

            def token_sampler(request_id: str, n: int) -> Sequence[int]:
                return [int(x) for x in rng.integers(0, VOCAB, size=n)]

        self._sampler: TokenSampler = token_sampler
        self._streams: dict[str, _Stream] = {}

    def uncached_tokens(self, seq_hashes: Sequence[int], prompt_tokens: int) -> int:
        """Prompt tokens this worker's cache lacks now (what a KV transfer must bring)."""
        return self.worker.uncached_tokens(seq_hashes, prompt_tokens)

    async def generate(
        self,
        request_id: str,
        prompt_tokens: int,
        local_hashes: Sequence[int],
        seq_hashes: Sequence[int],
        output_tokens: int,
        *,
        prefill_locally: bool,
        arrival: float | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[Token, None]:
        """Decode ``output_tokens`` tokens, yielding each as its iteration ends.

        The request is submitted on the first ``__anext__`` (an async generator runs nothing
        before); ``priority`` orders it in the worker's queue, lower first. Stopping early
        (``aclose()``, cancellation; wrap in ``contextlib.aclosing`` for prompt cleanup after
        ``break``) withdraws or abandons the sequence, see the module doc.
        """
        stream = self._open(
            request_id,
            prompt_tokens,
            local_hashes,
            seq_hashes,
            output_tokens,
            prefill_locally,
            arrival,
            priority,
        )
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, EngineClosed):
                    raise item
                yield item
                if item.last:
                    return
        finally:
            if not stream.finished:
                self._abandon(stream)

    def load(self) -> EngineLoad:
        w = self.worker
        waiting = [seq for _, _, seq in self._inbox] + list(w.pending)
        # Local prefill still to do: waiting prompts (against the cache now) and sequences
        # admitted into the iteration in progress (their first token not out yet).
        prefill = sum(
            w.uncached_tokens(s.seq_hashes, s.prompt_tokens) for s in waiting if s.prefill_locally
        ) + sum(s.local_prefill_tokens for s in w.running if s.first_token_at is None)
        # Per sequence, as Dynamo counts it: a prefix shared by k sequences counts k times.
        blocks = sum(s.lease.held + s.lease.private for s in w.running if s.lease)
        return EngineLoad(
            active_prefill_tokens=prefill,
            active_decode_blocks=blocks,
            kv_used_blocks=w.cache.used,
            kv_total_blocks=w.cache.capacity,
            waiting=len(waiting),
            running=len(w.running),
        )

    def _open(
        self,
        request_id: str,
        prompt_tokens: int,
        local_hashes: Sequence[int],
        seq_hashes: Sequence[int],
        output_tokens: int,
        prefill_locally: bool,
        arrival: float | None,
        priority: int,
    ) -> _Stream:
        self._check_open()
        bs = self.worker.block_size
        _check_prompt(request_id, prompt_tokens, local_hashes, seq_hashes, bs)
        if output_tokens < 1:
            raise ValueError(f"request {request_id!r}: output_tokens must be >= 1")
        if request_id in self._streams:
            raise ValueError(f"request {request_id!r} is already decoding on this engine")
        # The worker admits a sequence only when prompt + output fit (no preemption); one that
        # never fits would block its FCFS queue for ever.
        blocks = -(-(prompt_tokens + output_tokens) // bs)
        if blocks > self.worker.cache.capacity:
            raise ValueError(
                f"request {request_id!r}: needs {blocks} KV blocks, the worker has "
                f"{self.worker.cache.capacity}"
            )
        ids = [int(x) for x in self._sampler(request_id, output_tokens)]
        if len(ids) != output_tokens:
            raise ValueError(f"token_sampler gave {len(ids)} ids for {output_tokens} tokens")
        seq = DecodeSeq(
            request_id,
            prompt_tokens,
            output_tokens,
            local_hashes,
            seq_hashes,
            prefill_locally=prefill_locally,
            priority=priority,
        )
        stream = _Stream(seq, ids, asyncio.Queue())
        self._accept(seq, arrival)
        self._streams[request_id] = stream
        return stream

    def _abandon(self, stream: _Stream) -> None:
        stream.abandoned = True
        if self._streams.get(stream.seq.request_id) is not stream:
            return  # closed, or already finished
        if self._withdraw(stream.seq):
            del self._streams[stream.seq.request_id]
        elif stream.seq in self.worker.pending:  # queued in the worker, no lease yet
            self.worker.pending.remove(stream.seq)
            del self._streams[stream.seq.request_id]
            self._wake.set()
        else:  # admitted: out of the batch when the iteration in progress ends (``_finish``)
            self.worker.abort(stream.seq)

    def _busy(self) -> bool:
        return bool(self.worker.pending or self.worker.running)

    def _submit(self, item: DecodeSeq, arrival: float) -> None:
        self.worker.submit(item, arrival)

    def _start(self, t: float) -> float | None:
        return self.worker.start_iteration(t)

    def _finish(self, t: float) -> None:
        batch = list(self.worker.running)  # the iteration's batch: one token each
        first, done = self.worker.finish_iteration(t)
        started = finished = 0
        for seq in batch:
            stream = self._streams[seq.request_id]
            i = stream.emitted
            stream.emitted = i + 1
            started += i == 0
            last = stream.emitted == seq.output_tokens
            if last:
                stream.finished = True
                del self._streams[seq.request_id]
                finished += 1
            elif seq.aborted:  # it left the batch with this iteration
                del self._streams[seq.request_id]
            if not stream.abandoned:
                stream.queue.put_nowait(Token(i, stream.ids[i], t, first=i == 0, last=last))
        if (started, finished) != (len(first), len(done)):  # our counts and the model's agree
            raise RuntimeError(
                f"worker {self.worker_id}: {started} started and {finished} ended, the model "
                f"says {len(first)} and {len(done)}"
            )

    def _fail_waiters(self, error: Callable[[], EngineClosed]) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            if not stream.abandoned:
                stream.queue.put_nowait(error())
