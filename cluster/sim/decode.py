"""A decode worker: continuous batching over a block KV cache.

Each iteration every running sequence emits one token; it takes (d0 + d1·batch + d2·kv +
d3·kv²)·ε seconds (``DecodeModel.step_s``), ε lognormal with mean 1 (``jitter`` its
coefficient of variation), plus the local prefill of any sequence admitted with a few uncached
tokens. Waiting sequences are admitted in (priority,
arrival) order (``cluster/sim/engine_queue.py``), the first when the batch has room and the KV
memory holds its prompt and all its output (no preemption; the head of the queue blocks). Its
first token comes at the end of its first iteration.

Work per iteration is O(1) plus the sequences that start or finish: a sequence admitted at
iteration k finishes at k + output_tokens − 1, and the KV held grows by the batch size each
iteration. Iteration durations are kept, so every sequence's inter-token latencies are known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cluster.sim.engine_queue import WaitingQueue
from cluster.sim.jitter import Jitter
from cluster.sim.kv_cache import KvCache, KvEventSink, Lease
from cluster.sim.profile import DecodeModel


@dataclass(eq=False)
class DecodeSeq:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    local_hashes: Sequence[int]
    seq_hashes: Sequence[int]
    prefill_locally: bool = False
    priority: int = 0  # lower first (cluster/sim/engine_queue.py)
    local_prefill_tokens: int = 0  # set at admission, from what the cache holds then
    arrived_at: float = 0.0
    first_iteration: int = -1
    first_token_at: float | None = None
    finished_at: float | None = None
    cached_blocks: int = 0
    lease: Lease | None = field(default=None, repr=False)
    aborted: bool = False  # its consumer left: it leaves the batch when an iteration ends


class DecodeWorker:
    def __init__(
        self,
        worker_id: int,
        model: DecodeModel,
        block_size: int,
        seed: int,
        sink: KvEventSink | None = None,
        attention_s_per_token_pair: float = 0.0,
    ) -> None:
        """``attention_s_per_token_pair`` (e): a locally prefilled prompt also pays its
        attention, e·k·(c + k/2) for k new tokens after c cached ones, as on a prefill worker
        (the same GPUs and kernels; ``cluster/sim/prefill.py``)."""
        self.worker_id = worker_id
        self.attention_s_per_token_pair = attention_s_per_token_pair
        self.model = model
        self.block_size = block_size
        self.cache = KvCache(worker_id, max(1, model.kv_capacity_tokens // block_size), sink)
        self.pending: WaitingQueue[DecodeSeq] = WaitingQueue()
        self.running: list[DecodeSeq] = []
        self.kv_tokens = 0
        self.iteration = 0
        self.iteration_ends: list[float] = []  # end time of iteration k
        self.iteration_batch: list[int] = []
        self._finishing: dict[int, list[DecodeSeq]] = {}
        self._starting: list[DecodeSeq] = []
        self._jitter = Jitter(model.jitter, seed)
        self._aborting = False  # a running sequence was aborted: it leaves at the iteration's end
        self._started_at = 0.0
        self.busy_time = 0.0

    @property
    def active_blocks(self) -> int:
        return self.cache.used

    def uncached_tokens(self, seq_hashes: Sequence[int], prompt_tokens: int) -> int:
        """Prompt tokens this worker's cache lacks right now."""
        return prompt_tokens - self.cache.leading_hits(seq_hashes) * self.block_size

    def submit(self, seq: DecodeSeq, now: float) -> None:
        seq.arrived_at = now
        self.pending.append(seq)

    def start_iteration(self, now: float) -> float | None:
        m = self.model
        local = 0
        attention = 0.0  # Σ k·(c + k/2) over the prompts prefilled in this iteration
        while self.pending and len(self.running) < m.max_batch:
            seq = self.pending[0]
            if not self._reserve(seq, now):
                break
            self.pending.popleft()
            seq.first_iteration = self.iteration
            self._finishing.setdefault(self.iteration + seq.output_tokens - 1, []).append(seq)
            self.running.append(seq)
            self._starting.append(seq)
            self.kv_tokens += seq.prompt_tokens
            k = seq.local_prefill_tokens
            local += k
            attention += k * (seq.prompt_tokens - k + k / 2) if seq.prefill_locally else 0.0
        batch = len(self.running)
        if batch == 0:
            return None
        base = m.step_s(batch, self.kv_tokens)
        duration = (
            base * self._jitter()
            + m.local_prefill_s_per_token * local
            + self.attention_s_per_token_pair * attention
        )
        self._started_at = now
        self.busy_time += duration
        return duration

    def finish_iteration(self, now: float) -> tuple[list[DecodeSeq], list[DecodeSeq]]:
        """Apply the iteration; returns (sequences that got their first token, finished ones)."""
        batch = len(self.running)
        self.iteration_ends.append(now)
        self.iteration_batch.append(batch)
        self.kv_tokens += batch
        first = self._starting
        self._starting = []
        for seq in first:
            seq.first_token_at = now
        done = self._finishing.pop(self.iteration, [])
        for seq in done:
            seq.finished_at = now
            self.running.remove(seq)
            self.kv_tokens -= seq.prompt_tokens + seq.output_tokens
            if seq.lease is not None:
                self.cache.release(seq.lease, now)
        if self._aborting:
            for seq in [s for s in self.running if s.aborted]:
                self._drop(seq, now)
            self._aborting = False
        self.iteration += 1
        return first, done

    def abort(self, seq: DecodeSeq) -> None:
        """Stop a running sequence, as a serving engine aborts a request whose client left: it
        stays in the iteration in progress (that iteration's cost is paid) and leaves the batch
        when it ends, its batch slot and KV blocks freed then, not at its last token."""
        if seq in self.running:
            seq.aborted = True
            self._aborting = True

    def _drop(self, seq: DecodeSeq, now: float) -> None:
        """``seq`` out of the batch after its iterations first_iteration..iteration, each of
        which added one token to ``kv_tokens``."""
        self.running.remove(seq)
        self._finishing[seq.first_iteration + seq.output_tokens - 1].remove(seq)
        self.kv_tokens -= seq.prompt_tokens + (self.iteration - seq.first_iteration + 1)
        seq.finished_at = now
        if seq.lease is not None:
            self.cache.release(seq.lease, now)

    def itl_samples(self, seq: DecodeSeq) -> np.ndarray:
        """Inter-token latencies of a finished sequence: its iterations' end-time differences."""
        k0 = seq.first_iteration
        ends = self.iteration_ends[k0 : k0 + seq.output_tokens]
        return np.diff(np.asarray(ends, dtype=np.float64))

    def _reserve(self, seq: DecodeSeq, now: float) -> bool:
        bs = self.block_size
        prompt_blocks = seq.prompt_tokens // bs
        total_blocks = -(-(seq.prompt_tokens + seq.output_tokens) // bs)
        hits = self.cache.leading_hits(seq.seq_hashes[:prompt_blocks])
        if self.cache.available < total_blocks - hits:
            return False
        lease = self.cache.acquire(
            seq.local_hashes[:prompt_blocks], seq.seq_hashes[:prompt_blocks], now
        )
        if not self.cache.grow(lease, total_blocks - lease.held):
            self.cache.release(lease, now)
            return False
        seq.lease = lease
        seq.cached_blocks = lease.cached
        if seq.prefill_locally:
            seq.local_prefill_tokens = max(1, seq.prompt_tokens - lease.cached * bs)
        return True
