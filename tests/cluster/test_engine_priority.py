"""Priority reaches the engine (docs/design.md §1): the simulated workers serve their waiting
requests by (priority, arrival), lower first, and a request carries ``auction.engine_priority``
of its bid, so traffic that bid nothing never stands in front of traffic that bid."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from auction import NON_PAYING, PAYING, engine_priority
from cluster.sim.cluster import SimCluster, SimRequest
from cluster.sim.decode import DecodeSeq, DecodeWorker
from cluster.sim.engine_queue import WaitingQueue
from cluster.sim.prefill import PrefillJob, PrefillWorker
from cluster.sim.profile import load_profile

PROFILE = load_profile("h100-32b")


@dataclass(eq=False)
class Item:
    name: int
    priority: int


@given(st.lists(st.integers(-3, 3), max_size=40))
def test_the_queue_serves_by_priority_then_arrival(priorities: list[int]) -> None:
    queue: WaitingQueue[Item] = WaitingQueue()
    items = [Item(k, p) for k, p in enumerate(priorities)]
    for item in items:
        queue.append(item)
    assert len(queue) == len(items)
    served = [queue.popleft() for _ in range(len(items))]
    assert served == sorted(items, key=lambda i: (i.priority, i.name))  # sorted() is stable
    with pytest.raises(IndexError):
        queue.popleft()


def test_the_queue_removes_what_it_holds_and_refuses_what_it_does_not() -> None:
    queue: WaitingQueue[Item] = WaitingQueue()
    a, b, c = Item(0, 1), Item(1, 0), Item(2, 1)
    for item in (a, b, c):
        queue.append(item)
    queue.remove(a)
    assert a not in queue and list(queue) == [b, c] and queue[0] is b
    with pytest.raises(ValueError, match="not in the waiting queue"):
        queue.remove(a)


def test_the_priority_separates_bidders_from_those_who_bid_nothing() -> None:
    assert engine_priority(1e-6) == engine_priority(100.0) == PAYING < NON_PAYING
    assert engine_priority(0.0) == NON_PAYING


def _job(rid: str, priority: int, first_hash: int) -> PrefillJob:
    hashes = [first_hash + k for k in range(4)]
    return PrefillJob(rid, 4 * PROFILE.block_size, hashes, hashes, priority=priority)


def test_a_prefill_worker_starts_a_later_paying_request_before_earlier_free_ones() -> None:
    # One request per iteration, so the order of starts is the order of the queue.
    model = dataclasses.replace(PROFILE.prefill, max_batch_requests=1, jitter=0.0)
    worker = PrefillWorker(0, model, PROFILE.block_size)
    for k, (rid, priority) in enumerate([("free-1", 1), ("free-2", 1), ("paid", 0)]):
        worker.submit(_job(rid, priority, 100 * k), now=0.0)
    started = []
    t = 0.0
    while (duration := worker.start_iteration(t)) is not None:
        t += duration
        started += [job.request_id for job in worker.finish_iteration(t)]
    assert started == ["paid", "free-1", "free-2"]


def test_a_decode_worker_admits_a_later_paying_sequence_first() -> None:
    model = dataclasses.replace(PROFILE.decode, max_batch=1, jitter=0.0)
    worker = DecodeWorker(0, model, PROFILE.block_size, seed=0)
    for k, (rid, priority) in enumerate([("free", 1), ("paid", 0)]):
        hashes = [500 * k + j for j in range(2)]
        seq = DecodeSeq(rid, 2 * PROFILE.block_size, 3, hashes, hashes, priority=priority)
        worker.submit(seq, now=0.0)
    firsts = []
    t = 0.0
    while (duration := worker.start_iteration(t)) is not None:
        t += duration
        first, _ = worker.finish_iteration(t)
        firsts += [s.request_id for s in first]
    assert firsts == ["paid", "free"]


def test_the_simulated_cluster_gives_each_request_its_bids_priority() -> None:
    # h100-32b prefills on its decode worker: both wait in its queue, the paying one first.
    cluster = SimCluster(PROFILE, "0P/1D", seed=0)
    tokens = np.arange(3000, dtype=np.uint32)
    busy = SimRequest("busy", tokens + 7, 4)
    free = SimRequest("free", tokens, 4)
    paid = SimRequest("paid", tokens + 1, 4, user="gold", bid=2.0)
    cluster.submit_many([busy, free, paid])
    worker = cluster.decode[0]
    assert [(s.request_id, s.priority) for s in worker.pending] == [("paid", 0), ("free", 1)]
    cluster.loop.run()
    assert all(r.status == "ok" for r in cluster.records)
