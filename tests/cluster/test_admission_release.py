"""The simulator's admission is the service's queue (cluster/sim/admission.py over
auction/admission.py): one release rule, one price, driven by the simulator's events."""

from __future__ import annotations

import dataclasses

import pytest

from auction import AdmissionQueue, AuctionSettings, batch_seed, prefill_slots_per_worker
from cluster.sim.admission import AuctionAdmission, FcfsAdmission
from cluster.sim.cluster import SimCluster
from cluster.sim.profile import load_profile
from cluster.sim.workloads import make_workload

AUCTION_ALWAYS = AuctionSettings(batch_size=8, batch_window_ms=0.0, queue_threshold=0)


@pytest.fixture(scope="module")
def profile():
    return load_profile("h100-32b")


def _queue(profile, admission, n: int = 24, topology: str = "0P/1D"):
    cluster = SimCluster(profile, topology, seed=0, admission=admission)
    cluster.submit_many(make_workload("mixshare-50", n, users=4, seed=1).sim_requests())
    return cluster


def test_the_simulator_runs_the_services_queue_with_its_defaults() -> None:
    admission = AuctionAdmission()
    assert isinstance(admission.queue, AdmissionQueue)
    assert admission.settings == AuctionSettings()  # the service's defaults, typed once
    assert admission.per_worker is None


def test_a_prefill_slot_is_held_from_release_to_the_first_token(profile) -> None:
    admission = AuctionAdmission(dataclasses.replace(AUCTION_ALWAYS, max_in_prefill=2))
    cluster = _queue(profile, admission)
    assert sum(r.released is not None for r in cluster.records) == 2
    assert admission.depth == 22 and admission.queue.in_prefill == 2
    cluster.loop.run()
    records = cluster.records
    assert all(r.status == "ok" for r in records) and admission.queue.in_prefill == 0
    # At every release, fewer than two others were released and still without a first token.
    for r in records:
        assert r.released is not None and r.first_token is not None
        holding = [
            o for o in records
            if o is not r and o.released <= r.released < o.first_token  # type: ignore[operator]
        ]  # fmt: skip
        assert len(holding) < 2


def test_a_bound_of_the_whole_queue_hands_it_to_the_worker(profile) -> None:
    settings = dataclasses.replace(AUCTION_ALWAYS, scheduler="dfs-uniform", max_in_prefill=24)
    admission = AuctionAdmission(settings, seed=3)
    cluster = _queue(profile, admission)
    assert admission.depth == 0 and admission.batches == 3
    assert all(r.released == 0.0 for r in cluster.records)
    # The worker's queue holds the batches back to back, each in its auction order.
    assert len(admission.planned) == 24 and set(admission.planned) == {
        r.request_id for r in cluster.records
    }
    cluster.loop.run()
    assert all(r.status == "ok" for r in cluster.records)


def test_the_simulator_prices_each_request_as_the_service_does(profile) -> None:
    """The same requests through the service's queue alone and through the simulator: the same
    batches, the same order, the same per-request shares (split by bid, not evenly)."""
    workload = make_workload("mixshare-50", 24, users=4, seed=1)
    queue = AdmissionQueue(AUCTION_ALWAYS, seed=7)
    for r in workload.sim_requests():
        queue.enqueue(r.request_id, r.user, r.bid, r.tokens, 0.0)
    service = {release.request_id: release for release in queue.releasable(0.0)}

    admission = AuctionAdmission(AUCTION_ALWAYS, seed=7)
    cluster = _queue(profile, admission)
    cluster.loop.run()
    assert admission.planned == [rid for rid in service]
    for record in cluster.records:
        release = service[record.request_id]
        assert record.payment == pytest.approx(release.payment)
        assert f"batch-{record.batch_id}" == release.batch_id
    assert sum(r.payment for r in cluster.records) == pytest.approx(admission.revenue)
    assert admission.revenue > 0.0
    # Shares follow bids: a user's two requests in one batch pay in the ratio of their bids.
    by_batch_user: dict[tuple[int | None, str], list] = {}
    for r in cluster.records:
        by_batch_user.setdefault((r.batch_id, r.user), []).append(r)
    pairs = [rs for rs in by_batch_user.values() if len(rs) > 1 and all(x.bid > 0 for x in rs)]
    assert pairs
    for rs in pairs:
        assert rs[0].payment * rs[1].bid == pytest.approx(rs[1].payment * rs[0].bid)


def test_below_saturation_a_short_queue_passes_first_come_and_the_regime_switches_it(
    profile,
) -> None:
    admission = AuctionAdmission()  # queue_threshold 8, regime below
    cluster = _queue(profile, admission, n=4)
    assert admission.batches == 0 and all(r.payment == 0.0 for r in cluster.records)
    assert all(r.batch_id is None for r in cluster.records)
    cluster.loop.run()

    saturated = AuctionAdmission(dataclasses.replace(AuctionSettings(), batch_window_ms=0.0))
    cluster = SimCluster(profile, "0P/1D", seed=0, admission=saturated)
    saturated.set_regime("saturated")  # what the controller tells the service's auction
    cluster.submit_many(make_workload("mixshare-50", 4, users=4, seed=1).sim_requests())
    assert saturated.batches == 1 and all(r.batch_id == 0 for r in cluster.records)
    with pytest.raises(ValueError, match="unknown regime"):
        saturated.set_regime("melting")


def test_a_bound_per_prefill_worker_follows_the_pool(profile) -> None:
    per_worker = prefill_slots_per_worker(profile.prefill.max_batch_requests)
    assert per_worker == 2 * profile.prefill.max_batch_requests
    for topology, workers in (("1P/2D", 1), ("2P/2D", 2), ("0P/1D", 0)):
        admission = AuctionAdmission(slots_per_prefill_worker=per_worker)
        _queue(profile, admission, n=2, topology=topology)
        assert admission.settings.max_in_prefill == max(per_worker * workers, 1)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="slots_per_prefill_worker must be an int >= 1"):
            AuctionAdmission(slots_per_prefill_worker=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="requests_per_iteration must be an int >= 1"):
            prefill_slots_per_worker(bad)  # type: ignore[arg-type]


def test_fcfs_admission_routes_every_request_on_arrival(profile) -> None:
    cluster = _queue(profile, FcfsAdmission())
    assert cluster.admission.depth == 0
    assert all(r.released == 0.0 and r.batch_id is None for r in cluster.records)


def test_every_batch_draws_its_own_ties() -> None:
    seeds = {batch_seed(0, k) for k in range(100)}
    assert len(seeds) == 100 and batch_seed(5, 1) == batch_seed(5, 1) != batch_seed(6, 1)


def test_a_batch_window_lets_close_arrivals_compete_in_one_auction(profile) -> None:
    """With a window, requests arriving within it form one batch (the service's
    ``batch_window_ms``); without, each arrival that finds the queue empty is a batch of one."""
    requests = make_workload("mixshare-50", 6, users=3, seed=2).sim_requests()

    def batches(window_ms: float) -> tuple[int, list[float | None]]:
        settings = dataclasses.replace(AUCTION_ALWAYS, batch_window_ms=window_ms)
        admission = AuctionAdmission(settings)
        cluster = SimCluster(profile, "0P/1D", seed=0, admission=admission)
        for k, request in enumerate(requests):  # one every 10 ms
            cluster.loop.at(0.01 * k, cluster.submit, request)
        cluster.loop.run()
        assert all(r.status == "ok" for r in cluster.records)
        return admission.batches, [r.released for r in cluster.records]

    alone, _ = batches(0.0)
    together, released = batches(100.0)
    assert alone == 6 and together == 1
    assert released == [pytest.approx(0.1)] * 6  # the oldest request's window closed it
