"""A prefill worker: a (priority, arrival) queue and chunked-prefill iterations over a block
KV cache.

An iteration continues the requests already started, then admits waiting ones, until
``max_batch_tokens`` new tokens or ``max_batch_requests`` requests; it takes
``PrefillModel.iteration_s``·ε seconds (ε: ``Jitter``): a + Σ over its chunks of (b·k +
e·k·(c + k/2) + c_r), k a chunk's new tokens and c the tokens before it. A request's cached
prefix (leading blocks already in this worker's cache) is not recomputed; at least its last token
is, as an engine needs its logits. A request prefilled over several iterations attends, in each,
to everything before its chunk: the cached prefix and its own earlier chunks.

The worker is driven from outside: ``start_iteration(now)`` plans the next iteration and returns
its duration (None when idle), ``finish_iteration(now)`` applies it and returns the finished jobs.
A virtual-time loop or a wall-clock actor can drive it alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.sim.engine_queue import WaitingQueue
from cluster.sim.jitter import Jitter
from cluster.sim.kv_cache import KvCache, KvEventSink, Lease
from cluster.sim.profile import PrefillModel


@dataclass(eq=False)
class PrefillJob:
    request_id: str
    prompt_tokens: int
    local_hashes: Sequence[int]
    seq_hashes: Sequence[int]
    priority: int = 0  # lower first (cluster/sim/engine_queue.py)
    enqueued_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    cached_tokens: int = 0
    remaining: int = 0
    lease: Lease | None = field(default=None, repr=False)


class PrefillWorker:
    def __init__(
        self,
        worker_id: int,
        model: PrefillModel,
        block_size: int,
        seed: int = 0,
        sink: KvEventSink | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.model = model
        self.block_size = block_size
        self.cache = KvCache(worker_id, max(1, model.kv_capacity_tokens // block_size), sink)
        self.waiting: WaitingQueue[PrefillJob] = WaitingQueue()
        self.running: list[PrefillJob] = []
        self._plan: list[tuple[PrefillJob, int]] = []
        self._jitter = Jitter(model.jitter, seed)
        self.busy_time = 0.0
        self.busy_until = 0.0  # the end of the iteration in progress (or of the last one)

    @property
    def queued_tokens(self) -> int:
        """Prompt tokens waiting or in progress (the load a router may weigh)."""
        return sum(j.prompt_tokens for j in self.waiting) + sum(j.remaining for j in self.running)

    @property
    def depth(self) -> int:
        return len(self.waiting) + len(self.running)

    def submit(self, job: PrefillJob, now: float) -> None:
        job.enqueued_at = now
        self.waiting.append(job)

    def start_iteration(self, now: float) -> float | None:
        """Plan one iteration; returns its duration, or None when there is nothing to do."""
        if self._plan:
            raise RuntimeError("start_iteration called twice without finish_iteration")
        m = self.model
        budget = m.max_batch_tokens
        plan: list[tuple[PrefillJob, int]] = []
        for job in self.running:
            if budget <= 0 or len(plan) >= m.max_batch_requests:
                break
            chunk = min(job.remaining, budget)
            plan.append((job, chunk))
            budget -= chunk
        while self.waiting and budget > 0 and len(plan) < m.max_batch_requests:
            job = self.waiting.popleft()
            self._admit(job, now)
            chunk = min(job.remaining, budget)
            plan.append((job, chunk))
            budget -= chunk
        if not plan:
            return None
        self._plan = plan
        # Tokens before a chunk: the cached prefix plus the chunks already computed.
        cost = m.iteration_s((chunk, job.prompt_tokens - job.remaining) for job, chunk in plan)
        duration = cost * self._jitter()
        self.busy_time += duration
        self.busy_until = now + duration
        return duration

    def finish_iteration(self, now: float) -> list[PrefillJob]:
        done: list[PrefillJob] = []
        for job, chunk in self._plan:
            job.remaining -= chunk
            if job.remaining <= 0:
                job.finished_at = now
                self.running.remove(job)
                if job.lease is not None:
                    self.cache.release(job.lease, now)
                done.append(job)
        self._plan = []
        return done

    def _admit(self, job: PrefillJob, now: float) -> None:
        job.started_at = now
        job.lease = self.cache.acquire(job.local_hashes, job.seq_hashes, now)
        job.cached_tokens = min(job.lease.cached * self.block_size, job.prompt_tokens - 1)
        job.remaining = job.prompt_tokens - job.cached_tokens
        self.running.append(job)
