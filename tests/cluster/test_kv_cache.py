from __future__ import annotations

from cluster.sim.kv_cache import KvCache
from router import Cleared, KvIndex, Removed, block_hashes, sequence_hashes, to_payload


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
    assert lease_c.blocks == [] and cache.used == 4
    cache.release(lease_a, now=3.0)
    cache.release(lease_b, now=4.0)
    # A was used least recently: its leaf goes first, then its root, never B.
    lease_c = cache.acquire(*c, now=5.0)
    assert len(lease_c.blocks) == 1
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
    assert lease.cached == 2 and len(lease.blocks) == 3
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
    assert cache.cached_blocks == 1 and held.blocks
