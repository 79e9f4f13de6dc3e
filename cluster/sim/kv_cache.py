"""A worker's block KV cache: a radix of hashed blocks, pinned while in use, evicted LRU.

Blocks are identified as Dynamo identifies them: the sequence hash (``block_hash``: the block and
its whole prefix) and the local hash (``tokens_hash``: the block's tokens only). A block is cached
only under its parent, so a cached prefix is always reachable from the root (SGLang's radix-cache
discipline), and eviction takes the least recently used unpinned leaf block. The KV memory also
holds private blocks (decode growth, partial tail blocks), which are never shared.

The radix is compressed, as SGLang's is: a node (:class:`_Run`) holds a run of consecutive blocks
that share their pins and their LRU stamp, so a 12k-token prompt (750 blocks of 16) is one node
to cache, pin, release and evict, not 750. A run is split where a request's prefix ends inside
it. Eviction still goes block by block in the order a heap of leaf blocks would give: the least
recently used leaf first (ties: the leaf that became one first), a run's tail block before the
one above it. A run is cut at its tail in one slice while no other leaf is as old as it; on a
tie it gives up one block and waits its turn behind the others, as a leaf block's parent would.

Every change is published as a KV event (``router.Stored`` / ``Removed`` / ``Cleared``: the typed
form of Dynamo's ``stored``, ``removed`` and ``cleared``; ``router.to_payload`` gives the wire
dict), so one router index serves simulated and real workers alike.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count

from router import Cleared, KvEvent, Removed, Stored

KvEventSink = Callable[[KvEvent], None]


@dataclass(eq=False, slots=True)
class _Run:
    """Consecutive cached blocks along one prefix, with one pin count and one LRU stamp."""

    seq: list[int]  # the blocks' sequence hashes (block_hash), root side first
    local: list[int]  # their local hashes (tokens_hash)
    parent: _Run | None
    children: dict[int, _Run] = field(default_factory=dict)  # by their first sequence hash
    pins: int = 0  # requests using these blocks now
    last_used: float = 0.0
    tick: int = -1  # the tick of its live LRU entry (-1: none); entries of other ticks are stale


@dataclass
class Lease:
    """The first ``held`` blocks of ``seq`` (the request's sequence hashes) pinned for one
    request, ``cached`` of them hits when it was taken, and ``private`` blocks besides."""

    seq: Sequence[int] = ()
    held: int = 0
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
        self._root = _Run([], [], None)
        self._cached = 0
        self._private = 0
        self._pinned = 0  # blocks with pins > 0; their ancestors are pinned too
        # (last_used, tick, serial, run), lazy: a split hands a run's entry (its last_used and
        # tick) to its tail under a new serial, so no two entries ever compare their runs.
        self._lru: list[tuple[float, int, int, _Run]] = []
        self._ticks = count()
        self._serials = count()
        self.evictions = 0
        self.hits = 0
        self.lookups = 0

    # -- queries -----------------------------------------------------------------------------

    @property
    def used(self) -> int:
        return self._cached + self._private

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def cached_blocks(self) -> int:
        return self._cached

    @property
    def available(self) -> int:
        """Blocks that could be had now: free ones plus every unpinned cached one."""
        return self.free + self._cached - self._pinned

    def leading_hits(self, seq_hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt are cached here (no side effects)."""
        return sum(k for _, k in self._match(seq_hashes))

    def _match(self, seq: Sequence[int]) -> list[tuple[_Run, int]]:
        """The runs along ``seq``'s cached prefix and how many blocks of each it matches (all
        but maybe the last's). Equal sequence hashes mean equal prefixes, so the blocks of a
        run that match form a prefix of it: one comparison says whether all do, else a binary
        search finds where they stop."""
        path: list[tuple[_Run, int]] = []
        node, i, n = self._root, 0, len(seq)
        while i < n:
            run = node.children.get(seq[i])
            if run is None:
                break
            size = len(run.seq)
            top = min(size, n - i)
            if run.seq[top - 1] == seq[i + top - 1]:
                k = top
            else:  # the last matching block lies in [1, top - 1]: run.seq[0] == seq[i]
                lo, hi = 1, top - 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if run.seq[mid - 1] == seq[i + mid - 1]:
                        lo = mid
                    else:
                        hi = mid - 1
                k = lo
            path.append((run, k))
            i += k
            if k < size:
                break
            node = run
        return path

    # -- leases ------------------------------------------------------------------------------

    def acquire(self, local_hashes: Sequence[int], seq_hashes: Sequence[int], now: float) -> Lease:
        """Pin the cached prefix of a prompt and cache (and pin) the rest where memory allows.

        The caller computes the uncached blocks; they are published as ``stored`` right away
        because admission is when an engine allocates them. Blocks that do not fit are computed
        but not cached (the lease simply holds fewer blocks). Room for the whole uncached run
        is made at once (the LRU leaves it needs, in LRU order, one ``removed``): the same
        victims as one block at a time, since the run's own blocks are pinned as they land.
        """
        path = self._match(seq_hashes)
        if path and path[-1][1] < len(path[-1][0].seq):
            run, k = path[-1]
            self._split(run, k)
        k = 0
        parent = self._root
        for run, _ in path:
            if run.pins == 0:
                self._pinned += len(run.seq)
                run.tick = -1  # pinned: its LRU entry, if any, is stale from now on
            run.pins += 1
            run.last_used = now
            k += len(run.seq)
            parent = run
        self.lookups += len(seq_hashes)
        self.hits += k
        lease = Lease(seq_hashes, k, k)
        missing = len(seq_hashes) - k
        if missing == 0 or not self._make_room(missing, partial=True):
            return lease
        fit = min(missing, self.capacity - self._cached - self._private)
        seq, local = list(seq_hashes[k : k + fit]), list(local_hashes[k : k + fit])
        parent.children[seq[0]] = _Run(seq, local, parent, pins=1, last_used=now)
        self._cached += fit
        self._pinned += fit
        lease.held += fit
        parent_hash = parent.seq[-1] if parent is not self._root else None
        self._publish(Stored(self.worker_id, parent_hash, tuple(zip(seq, local, strict=True))))
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
        """Unpin a lease's blocks (they stay cached, most recently used); free its private ones.
        The lease's blocks are whole runs along its prefix (splits since cut them further,
        never across), found again from the root."""
        node, i, seq = self._root, 0, lease.seq
        while i < lease.held:
            run = node.children[seq[i]]
            run.pins -= 1
            run.last_used = now
            if run.pins == 0:
                self._pinned -= len(run.seq)
                if not run.children:
                    self._push(run)
            i += len(run.seq)
            node = run
        self._private -= lease.private
        lease.held, lease.private = 0, 0

    def clear(self) -> None:
        """Drop every unpinned block (an engine's cache reset) and publish ``cleared``."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            for key, run in list(node.children.items()):
                if run.pins == 0:  # its whole subtree is unpinned: pins hold their ancestors
                    del node.children[key]
                    self._cached -= self._subtree_blocks(run)
                else:
                    stack.append(run)
        self._lru = []
        self._publish(Cleared(self.worker_id))

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _subtree_blocks(run: _Run) -> int:
        total, stack = 0, [run]
        while stack:
            node = stack.pop()
            total += len(node.seq)
            stack.extend(node.children.values())
        return total

    def _split(self, run: _Run, k: int) -> None:
        """Cut ``run`` after its ``k``-th block; the tail becomes its only child and takes over
        its children and its LRU entry (the leaf block is the tail's)."""
        tail = _Run(run.seq[k:], run.local[k:], run, run.children, run.pins, run.last_used)
        for child in tail.children.values():
            child.parent = tail
        del run.seq[k:], run.local[k:]
        run.children = {tail.seq[0]: tail}
        if run.tick >= 0:
            tail.tick, run.tick = run.tick, -1
            heapq.heappush(self._lru, (tail.last_used, tail.tick, next(self._serials), tail))

    def _push(self, run: _Run) -> None:
        run.tick = next(self._ticks)
        heapq.heappush(self._lru, (run.last_used, run.tick, next(self._serials), run))

    def _live_top(self) -> tuple[float, int, int, _Run] | None:
        """The heap's first live entry (stale ones dropped on the way): an unpinned leaf run
        whose entry is its current one."""
        heap = self._lru
        while heap:
            _, tick, _, run = heap[0]
            if run.tick == tick and run.pins == 0 and not run.children and run.seq:
                return heap[0]
            heapq.heappop(heap)
        return None

    def _make_room(self, blocks: int, *, partial: bool = False) -> bool:
        """Evict LRU leaf blocks until ``blocks`` are free (one ``removed`` for them all); with
        ``partial``, True as soon as at least one is free (the caller caches what fits)."""
        free = self.capacity - self._cached - self._private
        removed: list[int] = []
        while free < blocks:
            top = self._live_top()
            if top is None:
                break
            last_used, _, _, run = heapq.heappop(self._lru)
            run.tick = -1
            follower = self._live_top()
            size, first = len(run.seq), run.seq[0]
            # Alone at its age, the run's blocks leave tail first, one after another; tied with
            # another leaf, it gives up one block and queues behind (a new entry is newer).
            take = min(size, blocks - free) if follower is None or follower[0] > last_used else 1
            removed.extend(reversed(run.seq[size - take :]))
            del run.seq[size - take :], run.local[size - take :]
            self._cached -= take
            self.evictions += take
            free += take
            if run.seq:
                self._push(run)
                continue
            parent = run.parent
            assert parent is not None
            del parent.children[first]
            if parent is not self._root and parent.pins == 0 and not parent.children:
                self._push(parent)
        if removed:
            self._publish(Removed(self.worker_id, tuple(removed)))
        return free >= (1 if partial else blocks)

    def _publish(self, event: KvEvent) -> None:
        if self._sink is not None:
            self._sink(event)
