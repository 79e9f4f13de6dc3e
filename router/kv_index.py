"""Per-worker index of cached KV blocks, fed by Dynamo KV events (docs/design.md §2).

The index is a radix tree over *local* block hashes, like Dynamo's RadixTree: a node stands
for the prefix spelled by the local hashes on its path from the root, and records which
workers hold that prefix's last block. Events name blocks by the engine's own ``block_hash``
(a sequence hash), so each worker also has a map ``block_hash → node``; a ``stored`` run hangs
under the node its ``parent_hash`` maps to (the root when there is none).

overlap(r, w) = number of leading blocks of r cached on w, i.e. the largest k such that w holds
every prefix of r's first k blocks. One walk down the prompt's local hashes scores every
worker at once: the set of workers still matching only shrinks along the path.

Semantics, which the property tests check against a brute-force model:

- ``stored``: unknown parent → the whole event is dropped (``unknown_parent``); otherwise each
  block's ``block_hash`` is (re)bound to the child prefix. Re-binding a known hash moves it.
- ``removed``: unbinds each hash; an unknown hash is counted (``unknown_block``), the others
  still apply. (Dynamo stops at the first unknown hash; we lose less state.)
- ``cleared``: unbinds all of the worker's hashes; the worker stays registered.
- Events for workers never added are dropped (``unknown_worker``), malformed payloads are
  dropped (``malformed``). No event raises into the caller.
- Bounded: with ``max_blocks_per_worker`` a ``stored`` event that would take a worker past it is
  dropped (``over_capacity``). An engine evicts (``removed``) before it stores into a full cache,
  so a real worker's stream stays under its cache's size; only a publisher that invents blocks
  runs into the bound, and then the index stops growing instead of the process.

A worker may bind several block hashes to one prefix (engines can re-store a block under a new
hash); the node counts the extra ones per worker so that removing one of them does not forget
the other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from router.events import Cleared, KvEvent, MalformedEventError, Removed, Stored, parse_kv_event
from router.hashing import DEFAULT_BLOCK_SIZE, U64_MASK, Tokens, block_hashes


class _Node:
    """One prefix: the path of local hashes from the root to it (``key`` is its last)."""

    __slots__ = ("extra", "key", "kid", "kids", "parent", "workers")

    def __init__(self, parent: _Node | None, key: int, workers: frozenset[int]) -> None:
        # Children: the first in ``kid``, any others in ``kids`` by key (None until a second
        # arrives). Most prefixes continue one way or not at all, and an index of millions of
        # blocks would otherwise spend a dict on every one; ``kid`` is None only for a leaf.
        self.kid: _Node | None = None
        self.kids: dict[int, _Node] | None = None
        # Interned (shared) frozenset of the workers holding this prefix: the overlap walk
        # compares these by identity, so a run of blocks held by the same workers costs no
        # set operation.
        self.workers = workers
        # worker -> how many more of its block hashes name this prefix beyond the first
        # (engines can re-store a block under a new hash); None, the usual case, when none do.
        self.extra: dict[int, int] | None = None
        self.parent = parent
        self.key = key

    def child(self, key: int) -> _Node | None:
        kid = self.kid
        if kid is None or kid.key == key:
            return kid
        return None if self.kids is None else self.kids.get(key)

    def adopt(self, child: _Node) -> None:
        if self.kid is None:
            self.kid = child
        elif self.kids is None:
            self.kids = {child.key: child}
        else:
            self.kids[child.key] = child

    def drop(self, child: _Node) -> None:
        """Forget ``child``; a remaining child takes the first place if it was the first's."""
        if self.kid is child:
            self.kid = self.kids.popitem()[1] if self.kids else None
        else:
            assert self.kids is not None
            del self.kids[child.key]
        if not self.kids:
            self.kids = None

    def children(self) -> list[_Node]:
        if self.kid is None:
            return []
        return [self.kid, *(self.kids.values() if self.kids else ())]


class KvIndex:
    """Cached blocks per worker; ``overlap(tokens) -> {worker: leading cached blocks}``."""

    def __init__(
        self, block_size: int = DEFAULT_BLOCK_SIZE, max_blocks_per_worker: int | None = None
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if max_blocks_per_worker is not None and max_blocks_per_worker < 1:
            raise ValueError(f"max_blocks_per_worker must be >= 1, got {max_blocks_per_worker}")
        self.block_size = block_size
        self.max_blocks_per_worker = max_blocks_per_worker
        self._interned: dict[frozenset[int], frozenset[int]] = {}
        # Interned set -> worker -> the interned set with (without) that worker: binding a
        # block then costs two dict lookups, not a new frozenset.
        self._plus: dict[frozenset[int], dict[int, frozenset[int]]] = {}
        self._minus: dict[frozenset[int], dict[int, frozenset[int]]] = {}
        self._root = _Node(None, 0, self._intern(frozenset()))
        self._lookup: dict[int, dict[int, _Node]] = {}
        self._workers: tuple[int, ...] = ()  # ascending; overlap columns follow this order
        self._slot: dict[int, int] = {}
        self.applied: Counter[str] = Counter()  # events applied, by kind
        self.dropped: Counter[str] = Counter()  # events (or removed hashes) skipped, by reason

    # -- workers -----------------------------------------------------------------------------

    @property
    def workers(self) -> tuple[int, ...]:
        """Registered workers, ascending (the order of ``overlap_column``)."""
        return self._workers

    def _set_workers(self) -> None:
        self._workers = tuple(sorted(self._lookup))
        self._slot = {w: i for i, w in enumerate(self._workers)}

    def add_worker(self, worker: int) -> None:
        """Start accepting events for ``worker`` (idempotent)."""
        if type(worker) is not int or not 0 <= worker <= U64_MASK:
            raise ValueError(f"worker id must be an int in [0, 2**64), got {worker!r}")
        if worker not in self._lookup:
            self._lookup[worker] = {}
            self._set_workers()

    def remove_worker(self, worker: int) -> None:
        """Forget ``worker`` and everything it cached."""
        if worker not in self._lookup:
            raise ValueError(f"unknown worker {worker!r}")
        self._clear(worker)
        del self._lookup[worker]
        self._set_workers()
        # No node refers to a set holding the worker any more: let those sets go.
        self._interned = {s: s for s in self._interned if worker not in s}
        self._plus, self._minus = {}, {}

    def cached_blocks(self, worker: int) -> int:
        """Blocks ``worker`` holds (Dynamo's tree size, used to break cost ties)."""
        try:
            return len(self._lookup[worker])
        except KeyError:
            raise ValueError(f"unknown worker {worker!r}") from None

    def node_count(self) -> int:
        """Prefixes stored in the tree, the root excluded (a memory gauge)."""
        count, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            below = node.children()
            count += len(below)
            stack.extend(below)
        return count

    # -- events ------------------------------------------------------------------------------

    def apply_event(self, payload: object) -> bool:
        """Apply one KV event given as a plain dict; False (and counted) when skipped."""
        try:
            event = parse_kv_event(payload)
        except MalformedEventError:
            self.dropped["malformed"] += 1
            return False
        return self.apply(event)

    def apply_events(self, payloads: Iterable[object]) -> int:
        """Apply events in order; returns how many were applied."""
        return sum(self.apply_event(p) for p in payloads)

    def apply(self, event: KvEvent) -> bool:
        """Apply one parsed event; False (and counted) when skipped."""
        lookup = self._lookup.get(event.worker)
        if lookup is None:
            self.dropped["unknown_worker"] += 1
            return False
        if isinstance(event, Stored):
            cap = self.max_blocks_per_worker
            if cap is not None and len(lookup) + len(event.blocks) > cap:
                self.dropped["over_capacity"] += 1
                return False
            if not self._store(event, lookup):
                self.dropped["unknown_parent"] += 1
                return False
            self.applied["stored"] += 1
        elif isinstance(event, Removed):
            self._remove(event, lookup)
            self.applied["removed"] += 1
        else:
            assert isinstance(event, Cleared)
            self._clear(event.worker)
            self.applied["cleared"] += 1
        return True

    def _store(self, event: Stored, lookup: dict[int, _Node]) -> bool:
        if event.parent_hash is None:
            node = self._root
        else:
            found = lookup.get(event.parent_hash)
            if found is None:
                return False
            node = found
        worker = event.worker
        empty = self._root.workers
        alone = self._with(empty, worker)  # a new prefix's holders: the usual case, hoisted
        blocks = event.blocks
        for k, (block_hash, tokens_hash) in enumerate(blocks):
            child = node.child(tokens_hash)
            if child is None:
                if self._grow(node, blocks[k:], lookup, alone):
                    return True
                child = _Node(node, tokens_hash, empty)
                node.adopt(child)
            old = lookup.get(block_hash)
            if old is not child:
                # Bind first: the new child then holds the path, so unbinding the old node
                # can never prune a node we are standing on.
                lookup[block_hash] = child
                if child.workers is empty:
                    child.workers = alone
                else:
                    self._bind(child, worker)
                if old is not None:
                    self._unbind(old, worker)
            node = child
        return True

    @staticmethod
    def _grow(
        node: _Node,
        blocks: Sequence[tuple[int, int]],
        lookup: dict[int, _Node],
        alone: frozenset[int],
    ) -> bool:
        """The usual tail of a ``stored`` run: prefixes the tree lacks (``node`` has no child for
        the first), none of whose block hashes the worker has bound elsewhere. Then every block
        is a new node held by the worker alone, made in one pass, and bound in one update;
        False (nothing done) when a hash is bound already, or twice in the run, and the general
        path must move it."""
        hashes = [h for h, _ in blocks]
        if not lookup.keys().isdisjoint(hashes) or len(set(hashes)) < len(hashes):
            return False
        made: list[_Node] = []
        first = _Node(node, blocks[0][1], alone)
        node.adopt(first)
        made.append(first)
        parent = first
        for _, tokens_hash in blocks[1:]:  # below a new node: each is its parent's only child
            child = parent.kid = _Node(parent, tokens_hash, alone)
            made.append(child)
            parent = child
        lookup.update(zip(hashes, made, strict=True))
        return True

    def _remove(self, event: Removed, lookup: dict[int, _Node]) -> None:
        """``_unbind`` of each named block, with the usual case (the worker's only hash of the
        prefix) written out: an engine evicts hundreds of blocks in one event."""
        worker = event.worker
        pop, minus = lookup.pop, self._minus
        unknown = 0
        for block_hash in event.block_hashes:
            node = pop(block_hash, None)
            if node is None:
                unknown += 1
                continue
            if node.extra is not None and worker in node.extra:
                self._unbind(node, worker)
                continue
            step = minus.get(node.workers)
            fewer = None if step is None else step.get(worker)
            node.workers = fewer if fewer is not None else self._without(node.workers, worker)
            while node.parent is not None and not node.workers and node.kid is None:
                node.parent.drop(node)
                node = node.parent
        if unknown:
            self.dropped["unknown_block"] += unknown

    def _clear(self, worker: int) -> None:
        lookup = self._lookup[worker]
        for node in lookup.values():
            self._unbind(node, worker)
        lookup.clear()

    def _bind(self, node: _Node, worker: int) -> None:
        if worker not in node.workers:
            node.workers = self._with(node.workers, worker)
        elif node.extra is None:
            node.extra = {worker: 1}
        else:
            node.extra[worker] = node.extra.get(worker, 0) + 1

    def _unbind(self, node: _Node, worker: int) -> None:
        extra = node.extra
        if extra is not None and worker in extra:
            if extra[worker] > 1:
                extra[worker] -= 1
            else:
                del extra[worker]
                if not extra:
                    node.extra = None
            return
        node.workers = self._without(node.workers, worker)
        # Drop prefixes nobody holds and nothing hangs under.
        while node.parent is not None and not node.workers and node.kid is None:
            node.parent.drop(node)
            node = node.parent

    def _with(self, workers: frozenset[int], worker: int) -> frozenset[int]:
        step = self._plus.get(workers)
        if step is None:
            step = self._plus[workers] = {}
        found = step.get(worker)
        if found is None:
            found = step[worker] = self._intern(workers | {worker})
        return found

    def _without(self, workers: frozenset[int], worker: int) -> frozenset[int]:
        step = self._minus.get(workers)
        if step is None:
            step = self._minus[workers] = {}
        found = step.get(worker)
        if found is None:
            found = step[worker] = self._intern(workers - {worker})
        return found

    def _intern(self, workers: frozenset[int]) -> frozenset[int]:
        return self._interned.setdefault(workers, workers)

    # -- queries -----------------------------------------------------------------------------

    def overlap(self, tokens: Tokens) -> dict[int, int]:
        """{worker: leading cached blocks of ``tokens``} for every registered worker."""
        return self.overlap_hashes(block_hashes(tokens, self.block_size))

    def overlap_hashes(self, local_hashes: Sequence[int]) -> dict[int, int]:
        """As ``overlap``, from the prompt's local block hashes."""
        return dict(zip(self._workers, self.overlap_column(local_hashes), strict=True))

    def leading_matches(self, local_hashes: Sequence[int]) -> dict[int, int]:
        """{worker: leading cached blocks}, listing only workers with at least one."""
        column = self.overlap_column(local_hashes)
        return {w: n for w, n in zip(self._workers, column, strict=True) if n}

    def overlap_column(self, local_hashes: Sequence[int]) -> list[int]:
        """Leading cached blocks per worker, in ``workers`` order (the router's hot path)."""
        scores = [0] * len(self._workers)
        if not local_hashes:
            return scores
        first = self._root.child(local_hashes[0])
        if first is None or not first.workers:
            return scores
        slot, interned = self._slot, self._interned
        active = first.workers
        node = first
        matched = 1  # blocks matched so far
        for h in local_hashes[1:]:
            kid = node.kid
            if kid is None:
                break
            if kid.key != h:
                kid = None if node.kids is None else node.kids.get(h)
                if kid is None:
                    break
            node = kid
            workers = node.workers
            if workers is not active:
                kept = active & workers
                if len(kept) != len(active):
                    for w in active - kept:
                        scores[slot[w]] = matched
                    if not kept:
                        return scores
                # The interned instance keeps the identity test above working.
                active = interned.get(kept, kept)
            matched += 1
        for w in active:
            scores[slot[w]] = matched
        return scores
