from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cluster.sim.kv_cache import KvCache
from router import Cleared, KvIndex, Removed, Stored, block_hashes, sequence_hashes, to_payload
from tests.cluster.kv_cache_reference import KvCache as ReferenceKvCache


def _hashes(tokens: list[int], bs: int = 2) -> tuple[list[int], list[int]]:
    local = block_hashes(tokens, bs)
    return local, sequence_hashes(local)


def test_hits_pin_and_lru_eviction_order() -> None:
    events: list = []
    cache = KvCache(worker_id=7, capacity=4, sink=events.append)
    a = _hashes([1, 1, 2, 2])  # blocks A1 A2
    b = _hashes([3, 3, 4, 4])  # blocks B1 B2
    lease_a = cache.acquire(*a, now=0.0)
    lease_b = cache.acquire(*b, now=1.0)
    assert (lease_a.cached, lease_b.cached, cache.used) == (0, 0, 4)
    # Full and pinned: nothing can be cached for a third prompt.
    c = _hashes([5, 5])
    lease_c = cache.acquire(*c, now=2.0)
    assert lease_c.held == 0 and cache.used == 4
    cache.release(lease_a, now=3.0)
    cache.release(lease_b, now=4.0)
    # A was used least recently: its leaf goes first, then its root, never B.
    lease_c = cache.acquire(*c, now=5.0)
    assert lease_c.held == 1
    removed = [list(e.block_hashes) for e in events if isinstance(e, Removed)]
    assert removed == [[a[1][1]]]
    d = _hashes([6, 6])
    cache.acquire(*d, now=6.0)
    removed = [list(e.block_hashes) for e in events if isinstance(e, Removed)]
    assert removed[-1] == [a[1][0]]
    assert cache.leading_hits(b[1]) == 2 and cache.leading_hits(a[1]) == 0


def test_a_reused_prefix_hits_and_is_refreshed() -> None:
    cache = KvCache(worker_id=1, capacity=8)
    p = _hashes([1, 1, 2, 2, 3, 3])
    cache.release(cache.acquire(*p, now=0.0), now=0.0)
    q = _hashes([1, 1, 2, 2, 9, 9])
    lease = cache.acquire(*q, now=1.0)
    assert lease.cached == 2 and lease.held == 3
    assert cache.hits == 2 and cache.lookups == 6


def test_events_rebuild_the_same_index_as_the_cache() -> None:
    """The router's index fed by the cache's events, as Dynamo wire payloads, agrees with the
    cache on every prompt."""
    index = KvIndex(block_size=2)
    index.add_worker(3)
    cache = KvCache(worker_id=3, capacity=6, sink=lambda e: index.apply_event(to_payload(e)))
    prompts = [[1, 1, 2, 2, 3, 3], [1, 1, 2, 2, 4, 4], [5, 5, 6, 6], [1, 1, 7, 7], [8, 8, 9, 9]]
    for t, tokens in enumerate(prompts):
        cache.release(cache.acquire(*_hashes(tokens), now=float(t)), now=float(t))
        for probe in prompts:
            assert index.overlap(probe).get(3, 0) == cache.leading_hits(_hashes(probe)[1])
    assert sum(index.dropped.values()) == 0


def test_clear_publishes_cleared_and_keeps_pinned_blocks() -> None:
    events: list = []
    cache = KvCache(worker_id=2, capacity=4, sink=events.append)
    held = cache.acquire(*_hashes([1, 1]), now=0.0)
    cache.release(cache.acquire(*_hashes([2, 2]), now=0.0), now=0.0)
    cache.clear()
    assert events[-1] == Cleared(2)
    assert to_payload(events[-1]) == {"worker_id": 2, "data": "cleared"}
    assert cache.cached_blocks == 1 and held.held == 1


# -- the compressed radix against the per-block reference -----------------------------------------

# Prompts over a small alphabet of blocks, so that prefixes are shared, diverge inside runs, and
# the cache fills and evicts; times repeat, so LRU ties happen (several releases at one instant).
_prompt = st.lists(st.integers(0, 3), min_size=1, max_size=12)
_op = st.one_of(
    st.tuples(st.just("acquire"), _prompt, st.integers(0, 3)),
    st.tuples(st.just("release"), st.integers(0, 20), st.integers(0, 3)),
    st.tuples(st.just("grow"), st.integers(0, 20), st.integers(0, 4)),
    st.tuples(st.just("clear"), st.just(0), st.just(0)),
)


def _chain_hashes(prompt: list[int]) -> tuple[list[int], list[int]]:
    """Blocks named by their value; a block's sequence hash is its whole prefix's."""
    local = [1000 + b for b in prompt]
    return local, sequence_hashes(local)


def _event_key(event: object) -> object:
    if isinstance(event, Stored):
        return ("stored", event.parent_hash, tuple(event.blocks))
    if isinstance(event, Removed):
        return ("removed", tuple(event.block_hashes))
    return ("cleared",)


@given(ops=st.lists(_op, max_size=60), capacity=st.integers(1, 24))
def test_runs_decide_as_the_per_block_cache_does(
    ops: list[tuple[str, Any, int]], capacity: int
) -> None:
    """Every operation gives the same lease, the same events (same victims, same order) and the
    same hits on every prompt seen, whatever runs the compressed radix holds."""
    fast_events: list[object] = []
    slow_events: list[object] = []
    fast = KvCache(5, capacity, fast_events.append)
    slow = ReferenceKvCache(5, capacity, slow_events.append)
    leases: list[tuple[Any, Any]] = []
    seen: list[list[int]] = []
    for step, (kind, arg, t) in enumerate(ops):
        now = float(step // 2 + t)  # repeats: ties in the LRU
        if kind == "acquire":
            prompt = list(arg)
            seen.append(prompt)
            hashes = _chain_hashes(prompt)
            a, b = fast.acquire(*hashes, now), slow.acquire(*hashes, now)
            assert (a.cached, a.held) == (b.cached, len(b.blocks))
            leases.append((a, b))
        elif kind == "release" and leases:
            a, b = leases.pop(int(arg) % len(leases))
            fast.release(a, now)
            slow.release(b, now)
        elif kind == "grow" and leases:
            a, b = leases[int(arg) % len(leases)]
            assert fast.grow(a, t) == slow.grow(b, t)
        elif kind == "clear":
            fast.clear()
            slow.clear()
        assert [_event_key(e) for e in fast_events] == [_event_key(e) for e in slow_events]
        assert (fast.used, fast.free, fast.available, fast.cached_blocks, fast.evictions) == (
            slow.used, slow.free, slow.available, slow.cached_blocks, slow.evictions
        )
        for prompt in seen:
            seq = _chain_hashes(prompt)[1]
            assert fast.leading_hits(seq) == slow.leading_hits(seq)
    assert (fast.hits, fast.lookups) == (slow.hits, slow.lookups)
