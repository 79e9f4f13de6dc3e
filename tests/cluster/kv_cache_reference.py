"""The per-block KV cache the simulator ran before its radix was compressed into runs: the
reference ``cluster.sim.kv_cache`` is tested against (tests/cluster/test_kv_cache.py), decision
for decision and event for event. One object per block; every rule spelled out per block.

A worker's block KV cache: a radix of hashed blocks, pinned while in use, evicted LRU.

Blocks are identified as Dynamo identifies them: the sequence hash (``block_hash``: the block and
its whole prefix) and the local hash (``tokens_hash``: the block's tokens only). A block is cached
only under its parent, so a cached prefix is always reachable from the root (SGLang's radix-cache
discipline), and eviction takes the least recently used unpinned leaf. The KV memory also holds
private blocks (decode growth, partial tail blocks), which are never shared.

Every change is published as a KV event (``router.Stored`` / ``Removed`` / ``Cleared``: the typed
form of Dynamo's ``stored``, ``removed`` and ``cleared``; ``router.to_payload`` gives the wire
dict), so one router index serves simulated and real workers alike.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from router import Cleared, KvEvent, Removed, Stored

KvEventSink = Callable[[KvEvent], None]


@dataclass(eq=False, slots=True)
class _Block:
    seq_hash: int
    local_hash: int
    parent: _Block | None
    children: int = 0  # cached children: a block with children is never evicted
    pins: int = 0  # requests using it now
    last_used: float = 0.0


@dataclass
class Lease:
    """Blocks pinned for one request; ``cached`` of them were hits when it was taken."""

    blocks: list[_Block] = field(default_factory=list)
    cached: int = 0
    private: int = 0


class KvCache:
    """Block cache of ``capacity`` blocks for worker ``worker_id``."""

    def __init__(self, worker_id: int, capacity: int, sink: KvEventSink | None = None) -> None:
        if capacity <= 0:
            raise ValueError(f"KV capacity must be positive, got {capacity} blocks")
        self.worker_id = worker_id
        self.capacity = capacity
        self._sink = sink
        self._blocks: dict[int, _Block] = {}
        self._private = 0
        self._pinned = 0  # blocks with pins > 0; their ancestors are pinned too
        self._lru: list[tuple[float, int, int]] = []  # (last_used, tiebreak, seq_hash), lazy
        self._tick = 0
        self.evictions = 0
        self.hits = 0
        self.lookups = 0

    # -- queries -----------------------------------------------------------------------------

    @property
    def used(self) -> int:
        return len(self._blocks) + self._private

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    @property
    def available(self) -> int:
        """Blocks that could be had now: free ones plus every unpinned cached one."""
        return self.free + len(self._blocks) - self._pinned

    def leading_hits(self, seq_hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt are cached here (no side effects)."""
        hits = 0
        for h in seq_hashes:
            if h not in self._blocks:
                break
            hits += 1
        return hits

    # -- leases ------------------------------------------------------------------------------

    def acquire(self, local_hashes: Sequence[int], seq_hashes: Sequence[int], now: float) -> Lease:
        """Pin the cached prefix of a prompt and cache (and pin) the rest where memory allows.

        The caller computes the uncached blocks; they are published as ``stored`` right away
        because admission is when an engine allocates them. Blocks that do not fit are computed
        but not cached (the lease simply holds fewer blocks). Room for the whole uncached run
        is made at once (the LRU leaves it needs, in LRU order, one ``removed``): the same
        victims as one block at a time, since the run's own blocks are pinned as they land.
        """
        lease = Lease()
        held = lease.blocks
        blocks = self._blocks
        parent: _Block | None = None
        newly_pinned = 0
        # Per-block loops are the simulator's hot path (a 12k-token prompt is 750 blocks):
        # pins and LRU stamps are written inline.
        for h in seq_hashes:
            block = blocks.get(h)
            if block is None:
                break
            if block.pins == 0:
                newly_pinned += 1
            block.pins += 1
            block.last_used = now
            held.append(block)
            parent = block
        k = len(held)
        lease.cached = k
        self.lookups += len(seq_hashes)
        self.hits += k
        missing = len(seq_hashes) - k
        if missing == 0 or not self._make_room(missing, partial=True):
            self._pinned += newly_pinned
            return lease
        fit = min(missing, self.capacity - len(blocks) - self._private)
        parent_hash = parent.seq_hash if parent is not None else None
        stored: list[tuple[int, int]] = []
        for j in range(k, k + fit):
            seq_hash, local_hash = seq_hashes[j], local_hashes[j]
            block = _Block(seq_hash, local_hash, parent, pins=1, last_used=now)
            blocks[seq_hash] = block
            if parent is not None:
                parent.children += 1
            held.append(block)
            stored.append((seq_hash, local_hash))
            parent = block
        self._pinned += newly_pinned + fit
        self._publish(Stored(self.worker_id, parent_hash, tuple(stored)))
        return lease

    def grow(self, lease: Lease, blocks: int) -> bool:
        """Reserve private blocks for a lease (decode growth); False if memory is exhausted."""
        if blocks <= 0:
            return True
        if not self._make_room(blocks):
            return False
        self._private += blocks
        lease.private += blocks
        return True

    def release(self, lease: Lease, now: float) -> None:
        """Unpin a lease's blocks (they stay cached, most recently used); free its private ones."""
        for block in lease.blocks:
            block.pins -= 1
            block.last_used = now
            if block.pins == 0:
                self._pinned -= 1
                if block.children == 0:
                    self._push_lru(block)
        self._private -= lease.private
        lease.blocks, lease.private = [], 0

    def clear(self) -> None:
        """Drop every unpinned block (an engine's cache reset) and publish ``cleared``."""
        for h in [h for h, b in self._blocks.items() if b.pins == 0]:
            self._blocks.pop(h)
        for block in self._blocks.values():
            block.children = 0
        for block in self._blocks.values():
            if block.parent is not None and block.parent.seq_hash in self._blocks:
                block.parent.children += 1
        self._lru = []
        self._publish(Cleared(self.worker_id))

    # -- internals ---------------------------------------------------------------------------

    def _push_lru(self, block: _Block) -> None:
        self._tick += 1
        heapq.heappush(self._lru, (block.last_used, self._tick, block.seq_hash))

    def _make_room(self, blocks: int, *, partial: bool = False) -> bool:
        """Evict LRU leaves until ``blocks`` are free (one ``removed`` for them all); with
        ``partial``, True as soon as at least one is free (the caller caches what fits)."""
        free = self.capacity - len(self._blocks) - self._private
        removed: list[int] = []
        while free < blocks:
            victim = self._pop_lru()
            if victim is None:
                break
            removed.append(victim.seq_hash)
            free += 1
        if removed:
            self._publish(Removed(self.worker_id, tuple(removed)))
        return free >= (1 if partial else blocks)

    def _pop_lru(self) -> _Block | None:
        while self._lru:
            last_used, _, h = heapq.heappop(self._lru)
            block = self._blocks.get(h)
            # Stale entries: re-pinned, re-used since, gained children, or already gone.
            if block is None or block.pins or block.children or block.last_used != last_used:
                continue
            del self._blocks[h]
            self.evictions += 1
            parent = block.parent
            if parent is not None and parent.seq_hash in self._blocks:
                parent.children -= 1
                if parent.children == 0 and parent.pins == 0:
                    self._push_lru(parent)
            return block
        return None

    def _publish(self, event: KvEvent) -> None:
        if self._sink is not None:
            self._sink(event)
