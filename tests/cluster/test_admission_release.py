"""Admission's release rule under its self-explaining name (cluster/sim/admission.py)."""

from __future__ import annotations

import pytest

from cluster.sim.admission import (
    DEFAULT_AUCTION_RELEASE_WHILE_BACKLOG_BELOW,
    AuctionAdmission,
    FcfsAdmission,
    batch_seed,
)
from cluster.sim.cluster import SimCluster
from cluster.sim.profile import load_profile
from cluster.workloads import make_workload


@pytest.fixture(scope="module")
def profile():
    return load_profile("h100-32b")


def _queue(profile, admission, n: int = 24):
    cluster = SimCluster(profile, "0P/1D", seed=0, admission=admission)
    cluster.submit_many(make_workload("mixshare-50", n, users=4, seed=1).sim_requests())
    return cluster


def test_defaults_are_documented_values() -> None:
    assert FcfsAdmission().release_while_backlog_below is None
    assert AuctionAdmission(8).release_while_backlog_below == 1
    assert DEFAULT_AUCTION_RELEASE_WHILE_BACKLOG_BELOW == 1


def test_below_one_keeps_the_queue_in_admission(profile) -> None:
    cluster = _queue(profile, AuctionAdmission(8, "dfs-bid"))
    # The worker started one request at once; one more waits at it; the rest wait in the queue.
    assert cluster.backlog == 1 and cluster.admission.depth == 24 - 2


def test_none_hands_the_whole_queue_to_the_worker(profile) -> None:
    admission = AuctionAdmission(8, "dfs-uniform", None, seed=3)
    cluster = _queue(profile, admission)
    assert admission.depth == 0 and admission.batches == 3
    assert all(r.released == 0.0 for r in cluster.records)
    # The worker's queue holds the batches back to back, each in its auction order.
    assert len(admission.planned) == 24 and set(admission.planned) == {
        r.request_id for r in cluster.records
    }
    cluster.loop.run()
    assert all(r.status == "ok" for r in cluster.records)


def test_bad_release_thresholds_name_the_knob() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="release_while_backlog_below must be an integer"):
            FcfsAdmission(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="release_while_backlog_below must be an integer"):
            AuctionAdmission(8, "dfs-bid", bad)  # type: ignore[arg-type]
    assert FcfsAdmission().release_while_backlog_below is None
    assert AuctionAdmission(8).release_while_backlog_below == 1


def test_every_batch_draws_its_own_ties() -> None:
    seeds = {batch_seed(0, k) for k in range(100)}
    assert len(seeds) == 100 and batch_seed(5, 1) == batch_seed(5, 1) != batch_seed(6, 1)


def test_a_batch_window_lets_close_arrivals_compete_in_one_auction(profile) -> None:
    """With a window, requests arriving within it form one batch (as the service's
    ``batch_window_ms``); without, each arrival that finds the queue empty is a batch of one."""
    requests = make_workload("mixshare-50", 6, users=3, seed=2).sim_requests()

    def batches(window: float) -> tuple[int, list[float | None]]:
        admission = AuctionAdmission(8, "dfs-bid", None, batch_window_s=window)
        cluster = SimCluster(profile, "0P/1D", seed=0, admission=admission)
        for k, request in enumerate(requests):  # one every 10 ms
            cluster.loop.at(0.01 * k, cluster.submit, request)
        cluster.loop.run()
        assert all(r.status == "ok" for r in cluster.records)
        return admission.batches, [r.released for r in cluster.records]

    alone, _ = batches(0.0)
    together, released = batches(0.1)
    assert alone == 6 and together == 1
    assert released == [pytest.approx(0.1)] * 6  # the oldest request's window closed it


def test_a_batch_window_is_bounded() -> None:
    for bad in (-0.1, 61.0):
        with pytest.raises(ValueError, match="batch_window_s"):
            AuctionAdmission(8, batch_window_s=bad)
