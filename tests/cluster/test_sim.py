from __future__ import annotations

import numpy as np
import pytest

from auction import AuctionSettings
from cluster.sim.admission import AuctionAdmission
from cluster.sim.cluster import SimCluster, SimRequest, Topology, sim_requests
from cluster.sim.loadgen import ClosedLoop, OpenLoop, Phase
from cluster.sim.loop import EventLoop
from cluster.sim.profile import PROFILE_DIR, load_profile, parse_profile
from cluster.sim.records import summarize
from cluster.sim.template_source import TemplateSource
from cluster.sim.workloads import make_workload

PROFILE = "b200-llama70b-fp8-tp4"


def _closed_run(seed: int, C: int = 24, seconds: float = 8.0, topology: str = "1P/2D"):
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, topology, seed=seed, loop=EventLoop(record=True))
    w = profile.workload
    source = TemplateSource(w.templates, w.template_tokens, w.input_tokens, 32, seed=seed)
    load = ClosedLoop(cluster, source, [Phase(seconds, C, ramp=1.0)])
    cluster.loop.run()  # past the end: every request in flight drains
    return cluster, load


def test_every_request_finishes_once_with_all_its_tokens() -> None:
    cluster, _ = _closed_run(seed=3)
    records = cluster.records
    assert records and all(r.status == "ok" for r in records)
    assert len({r.request_id for r in records}) == len(records)
    for r in records:
        assert r.itl is not None and r.itl.size == r.output_tokens - 1
        assert r.arrival <= r.released <= r.first_token <= r.finished
        if r.prefill_worker is not None:
            assert r.prefill_start <= r.prefill_end <= r.transfer_end <= r.first_token
    done = [line for _, line in cluster.loop.log if line.startswith("done ")]
    assert len(done) == len(records)
    # Every reservation was returned: the routers see no load once the cluster is idle.
    assert cluster.decode_router.loads.prefill_tokens == [0, 0]
    assert cluster.decode_router.loads.decode_blocks == [0, 0]
    for worker in cluster.decode.values():
        assert worker.kv_tokens == 0 and not worker.running and not worker.pending


def test_same_seed_same_history_other_seed_other_history() -> None:
    a, _ = _closed_run(seed=5)
    b, _ = _closed_run(seed=5)
    c, _ = _closed_run(seed=6)
    assert a.loop.log == b.loop.log
    assert a.loop.log != c.loop.log


def test_closed_loop_holds_its_concurrency() -> None:
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, "1P/5D", seed=0)
    w = profile.workload
    source = TemplateSource(w.templates, w.template_tokens, w.input_tokens, 64, seed=0)
    load = ClosedLoop(cluster, source, [Phase(4.0, 10, ramp=1.0), Phase(4.0, 30)])
    cluster.loop.run(3.0)
    assert load.active == 10
    cluster.loop.run(6.0)
    assert load.active == 30


def test_open_loop_rate_schedule_matches_poisson_counts() -> None:
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, "1P/5D", seed=0)
    w = profile.workload
    source = TemplateSource(w.templates, w.template_tokens, w.input_tokens, 16, seed=0)
    OpenLoop(cluster, source, [(0.0, 5.0), (20.0, 30.0)], end=30.0, seed=1)
    cluster.loop.run()
    arrivals = np.array([r.arrival for r in cluster.records])
    calm, spike = np.sum(arrivals < 20.0), np.sum(arrivals >= 20.0)
    assert abs(calm - 100) < 4 * np.sqrt(100)
    assert abs(spike - 300) < 4 * np.sqrt(300)


def test_dfs_order_hits_the_cache_at_least_as_often_as_any_other_order() -> None:
    """Long tree-of-thought prompts do not fit in the 23k-token cache of one H100; serving the
    queued batch in a DFS order reuses more prefix than bid order or arrival order."""
    profile = load_profile("h100-32b")
    batch = make_workload("trees-long", 117, users=6, seed=2).requests  # 3 problems, ~41k tokens
    hit_rate = {}
    for scheduler in ("dfs-bid", "dfs-uniform", "bid-sort", "no-sort"):
        cluster = SimCluster(
            profile, "0P/1D", seed=0, admission=AuctionAdmission(
                AuctionSettings(batch_size=len(batch), scheduler=scheduler, queue_threshold=0)
            ),
        )
        cluster.submit_many(sim_requests(batch, output_tokens=8))
        cluster.loop.run()
        assert all(r.status == "ok" for r in cluster.records)
        hit_rate[scheduler] = summarize(cluster.records, 0.0, float("inf")).cache_hit_rate
    for other in ("bid-sort", "no-sort"):
        assert hit_rate["dfs-uniform"] >= hit_rate[other]
        assert hit_rate["dfs-bid"] >= hit_rate[other]
    assert hit_rate["dfs-uniform"] > max(hit_rate["bid-sort"], hit_rate["no-sort"])


def test_auction_admission_charges_vcg_and_orders_batches() -> None:
    profile = load_profile("h100-32b")
    batch = make_workload("mixshare-50", 24, users=4, seed=1).requests
    admission = AuctionAdmission(AuctionSettings(batch_size=8, queue_threshold=0))
    cluster = SimCluster(profile, "0P/1D", seed=0, admission=admission)
    cluster.submit_many(sim_requests(batch, output_tokens=4))
    cluster.loop.run()
    assert admission.batches == 3
    assert sum(r.payment for r in cluster.records) == pytest.approx(admission.revenue)
    assert {r.batch_id for r in cluster.records} == {0, 1, 2}


def test_topologies_parse_and_reject_nonsense() -> None:
    assert Topology.parse("1P/5D") == Topology(1, 5)
    assert Topology.parse(" 2p / 3d ").gpus(4) == 20
    for bad in ("1P", "P/D", "1P/0D", "-1P/2D"):
        with pytest.raises(ValueError):
            Topology.parse(bad)


def test_bad_profiles_fail_at_load_time_naming_the_field(tmp_path) -> None:
    import yaml

    raw = yaml.safe_load((PROFILE_DIR / f"{PROFILE}.yaml").read_text())
    broken = dict(raw, prefill=dict(raw["prefill"], c_s_per_request=-1.0))
    with pytest.raises(ValueError, match=r"prefill\.c_s_per_request: must be >= 0"):
        parse_profile(broken, where="p")
    missing = dict(raw, decode={k: v for k, v in raw["decode"].items() if k != "d0_s"})
    with pytest.raises(ValueError, match=r"p\.decode\.d0_s: missing field"):
        parse_profile(missing, where="p")
    with pytest.raises(ValueError, match="unknown hardware profile 'nope'"):
        load_profile("nope")
    with pytest.raises(ValueError, match="rate"):
        OpenLoop(SimCluster(load_profile(PROFILE), "1P/1D"), TemplateSource(), [(0, -1.0)], 1.0)


def test_admission_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown scheduler 'lottery'"):
        AuctionAdmission(AuctionSettings(scheduler="lottery"))
    with pytest.raises(ValueError, match="batch_size"):
        AuctionAdmission(AuctionSettings(batch_size=0))
    with pytest.raises(ValueError, match="max_in_prefill"):
        AuctionAdmission(AuctionSettings(max_in_prefill=0))


def test_requests_are_validated() -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        SimRequest("x", np.zeros(0, dtype=np.uint32), 4)
    with pytest.raises(ValueError, match="output_tokens"):
        SimRequest("x", np.ones(3, dtype=np.uint32), 0)
