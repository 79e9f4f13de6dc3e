"""KvIndex: overlap after stored/removed/cleared events, against hand examples and brute force."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import KvIndex, block_hashes, sequence_hashes


def stored(worker: int, blocks: list[tuple[int, int]], parent: int | None = None) -> dict[str, Any]:
    """A flat-shape stored event; blocks are (block_hash, tokens_hash)."""
    body = {
        "parent_hash": parent,
        "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks],
    }
    return {"worker_id": worker, "data": {"stored": body}}


def removed(worker: int, hashes: list[int]) -> dict[str, Any]:
    return {"worker_id": worker, "data": {"removed": {"block_hashes": hashes}}}


def cleared(worker: int) -> dict[str, Any]:
    return {"worker_id": worker, "data": "cleared"}


def stored_prompt(worker: int, tokens: list[int], block_size: int = 4) -> dict[str, Any]:
    """What an engine publishes after caching ``tokens``: Dynamo's hashes for each block."""
    local = block_hashes(tokens, block_size)
    return stored(worker, list(zip(sequence_hashes(local), local, strict=True)))


def index_with(*workers: int) -> KvIndex:
    index = KvIndex(block_size=4)
    for w in workers:
        index.add_worker(w)
    return index


# -- hand examples ---------------------------------------------------------------------------

PROMPT = list(range(16))  # four blocks of 4


def test_overlap_counts_leading_cached_blocks_per_worker() -> None:
    index = index_with(1, 2, 3)
    assert index.apply_event(stored_prompt(1, PROMPT))
    assert index.apply_event(stored_prompt(2, PROMPT[:8]))
    assert index.overlap(PROMPT) == {1: 4, 2: 2, 3: 0}
    assert index.overlap(PROMPT[:10]) == {1: 2, 2: 2, 3: 0}  # partial tail not counted
    assert index.overlap(PROMPT[:4] + [99] * 12) == {1: 1, 2: 1, 3: 0}
    assert index.overlap([99] * 16) == {1: 0, 2: 0, 3: 0}
    assert index.cached_blocks(1) == 4 and index.cached_blocks(2) == 2
    assert index.node_count() == 4  # the shared prefix is stored once


def test_stored_run_continues_under_its_parent() -> None:
    index = index_with(1)
    local = block_hashes(PROMPT, 4)
    seq = sequence_hashes(local)
    index.apply_event(stored(1, [(seq[0], local[0]), (seq[1], local[1])]))
    index.apply_event(stored(1, [(seq[2], local[2]), (seq[3], local[3])], parent=seq[1]))
    assert index.overlap(PROMPT) == {1: 4}


def test_removing_a_middle_block_cuts_the_overlap_there() -> None:
    index = index_with(1, 2)
    index.apply_event(stored_prompt(1, PROMPT))
    index.apply_event(stored_prompt(2, PROMPT))
    seq = sequence_hashes(block_hashes(PROMPT, 4))
    index.apply_event(removed(1, [seq[2]]))
    assert index.overlap(PROMPT) == {1: 2, 2: 4}
    index.apply_event(removed(2, [seq[0]]))
    assert index.overlap(PROMPT) == {1: 2, 2: 0}
    # A child of the removed block cannot be stored against it any more.
    assert not index.apply_event(stored(1, [(77, 5)], parent=seq[2]))
    assert index.dropped == Counter(unknown_parent=1)


def test_cleared_forgets_blocks_but_keeps_the_worker() -> None:
    index = index_with(1, 2)
    index.apply_event(stored_prompt(1, PROMPT))
    index.apply_event(stored_prompt(2, PROMPT[:8]))
    assert index.apply_event(cleared(1))
    assert index.overlap(PROMPT) == {1: 0, 2: 2}
    assert index.workers == (1, 2)
    assert index.apply_event(stored_prompt(1, PROMPT[:4]))
    assert index.overlap(PROMPT) == {1: 1, 2: 2}


def test_remove_worker_drops_its_state() -> None:
    index = index_with(1, 2)
    index.apply_event(stored_prompt(1, PROMPT))
    index.apply_event(stored_prompt(2, PROMPT[:8]))
    index.remove_worker(1)
    assert index.workers == (2,)
    assert index.overlap(PROMPT) == {2: 2}
    assert index.node_count() == 2  # the blocks only worker 1 held are gone
    assert not index.apply_event(stored_prompt(1, PROMPT))
    assert index.dropped == Counter(unknown_worker=1)
    index.remove_worker(2)
    assert index.node_count() == 0
    with pytest.raises(ValueError):
        index.remove_worker(2)


def test_rebinding_a_block_hash_moves_it() -> None:
    index = index_with(1)
    index.apply_event(stored(1, [(10, 1), (11, 2)]))
    index.apply_event(stored(1, [(11, 3)], parent=10))  # hash 11 now names prefix (1, 3)
    assert index.overlap_hashes([1, 2]) == {1: 1}
    assert index.overlap_hashes([1, 3]) == {1: 2}
    assert index.cached_blocks(1) == 2


def test_two_hashes_for_one_prefix_survive_one_removal() -> None:
    index = index_with(1)
    index.apply_event(stored(1, [(10, 1)]))
    index.apply_event(stored(1, [(20, 1)]))  # the engine re-stored the block under a new hash
    index.apply_event(removed(1, [10]))
    assert index.overlap_hashes([1]) == {1: 1}
    index.apply_event(removed(1, [20]))
    assert index.overlap_hashes([1]) == {1: 0}
    assert index.node_count() == 0


def test_leading_matches_lists_only_hits() -> None:
    index = index_with(1, 2)
    index.apply_event(stored_prompt(2, PROMPT))
    assert index.leading_matches(block_hashes(PROMPT, 4)) == {2: 4}
    assert index.leading_matches([]) == {}


# -- bad events ------------------------------------------------------------------------------


def test_bad_events_are_skipped_and_counted_by_reason() -> None:
    index = index_with(1)
    index.apply_event(stored(1, [(10, 1), (11, 2)]))
    before = index.overlap_hashes([1, 2, 3])
    bad: list[object] = [
        None,
        {"worker_id": 1},
        {"worker_id": 1, "data": {"stored": {"blocks": [{"block_hash": "x", "tokens_hash": 3}]}}},
        {"worker_id": 1, "data": {"bogus": {}}},
        stored(9, [(12, 3)]),  # unknown worker
        removed(9, [10]),
        cleared(9),
        stored(1, [(12, 3)], parent=999),  # unknown parent: nothing of it applies
    ]
    assert [index.apply_event(e) for e in bad] == [False] * len(bad)
    assert index.overlap_hashes([1, 2, 3]) == before
    # A removal naming unknown hashes still applies the known ones.
    assert index.apply_event(removed(1, [998, 11, 999]))
    assert index.overlap_hashes([1, 2, 3]) == {1: 1}
    assert index.dropped == Counter(
        malformed=4, unknown_worker=3, unknown_parent=1, unknown_block=2
    )
    assert index.applied == Counter(stored=1, removed=1)
    assert index.apply_events([cleared(1), None, cleared(1)]) == 2


def test_add_worker_rejects_non_ids() -> None:
    index = KvIndex()
    for bad in (-1, 2**64, "a", 1.0, True):
        with pytest.raises(ValueError):
            index.add_worker(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        index.cached_blocks(3)
    with pytest.raises(ValueError):
        KvIndex(block_size=0)


# -- property: the index equals a brute-force recomputation ----------------------------------


class BruteForce:
    """Each worker maps block_hash -> the path of local hashes it names; nothing else."""

    def __init__(self, workers: list[int]) -> None:
        self.maps: dict[int, dict[int, tuple[int, ...]]] = {w: {} for w in workers}
        self.dropped: Counter[str] = Counter()

    def apply(self, op: tuple[Any, ...]) -> None:
        kind, worker = op[0], op[1]
        if kind == "add":
            self.maps.setdefault(worker, {})
            return
        if worker not in self.maps:
            self.dropped["malformed" if kind == "garbage" else "unknown_worker"] += 1
            return
        mapping = self.maps[worker]
        if kind == "remove_worker":
            del self.maps[worker]
        elif kind == "garbage":
            self.dropped["malformed"] += 1
        elif kind == "cleared":
            mapping.clear()
        elif kind == "removed":
            for h in op[2]:
                if mapping.pop(h, None) is None:
                    self.dropped["unknown_block"] += 1
        else:
            parent, blocks = op[2], op[3]
            if parent is not None and parent not in mapping:
                self.dropped["unknown_parent"] += 1
                return
            path = () if parent is None else mapping[parent]
            for block_hash, tokens_hash in blocks:
                path = (*path, tokens_hash)
                mapping[block_hash] = path

    def overlap(self, query: tuple[int, ...]) -> dict[int, int]:
        result = {}
        for worker, mapping in self.maps.items():
            held, k = set(mapping.values()), 0
            while k < len(query) and query[: k + 1] in held:
                k += 1
            result[worker] = k
        return result

    def prefixes(self) -> set[tuple[int, ...]]:
        return {p[:k] for m in self.maps.values() for p in m.values() for k in range(1, len(p) + 1)}


WORKERS = st.sampled_from([1, 2, 3])
BLOCK_HASH = st.integers(0, 11)  # few names, so hashes get re-bound and removed often
TOKENS_HASH = st.integers(0, 3)  # few contents, so prefixes are shared and diverge
OPS = st.one_of(
    st.tuples(
        st.just("stored"),
        WORKERS,
        st.none() | BLOCK_HASH,
        st.lists(st.tuples(BLOCK_HASH, TOKENS_HASH), max_size=5),
    ),
    st.tuples(st.just("removed"), WORKERS, st.lists(BLOCK_HASH, max_size=4)),
    st.tuples(st.just("cleared"), WORKERS),
    st.tuples(st.just("garbage"), WORKERS),
    st.tuples(st.just("remove_worker"), WORKERS),
    st.tuples(st.just("add"), WORKERS),
)


def apply_op(index: KvIndex, op: tuple[Any, ...]) -> None:
    kind, worker = op[0], op[1]
    if kind == "add":
        index.add_worker(worker)
    elif kind == "remove_worker":
        if worker in index.workers:
            index.remove_worker(worker)
        else:
            index.apply_event(cleared(worker))  # counted as unknown_worker, like the model
    elif kind == "garbage":
        index.apply_event({"worker_id": worker, "data": {"stored": {"blocks": [{}]}}})
    elif kind == "cleared":
        index.apply_event(cleared(worker))
    elif kind == "removed":
        index.apply_event(removed(worker, op[2]))
    else:
        index.apply_event(stored(worker, op[3], parent=op[2]))


@settings(max_examples=120, deadline=None)
@given(st.lists(OPS, max_size=30), st.lists(st.lists(TOKENS_HASH, max_size=6), max_size=5))
def test_overlap_matches_brute_force(ops: list[tuple[Any, ...]], extra: list[list[int]]) -> None:
    index = index_with(1, 2)
    model = BruteForce([1, 2])
    for op in ops:
        apply_op(index, op)
        model.apply(op)
        queries = model.prefixes() | {tuple(q) for q in extra}
        queries |= {(*q, t) for q in list(queries) for t in range(4)}
        for query in queries:
            assert index.overlap_hashes(query) == model.overlap(query), (op, query)
        assert index.workers == tuple(sorted(model.maps))
        for worker, mapping in model.maps.items():
            assert index.cached_blocks(worker) == len(mapping)
        # Nodes nobody holds and nothing hangs under are pruned: exactly the held prefixes stay.
        assert index.node_count() == len(model.prefixes())
    assert index.dropped == model.dropped
