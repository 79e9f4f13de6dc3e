"""A trace replayed on the simulator, open loop (cluster/sim/replay.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cluster.sim.cluster import SimCluster
from cluster.sim.profile import load_profile
from cluster.sim.replay import parse_arm, replay_on_sim, trace_calm_thresholds
from cluster.traces import ReplayWindow, TracePrompts, TraceReader, trace_requests
from controller.detector import Thresholds
from router import Policy, Router

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"
PROFILE = load_profile("b200-llama70b-fp8-tp4")


def _requests(n: int, speedup: float = 1.0) -> list:
    return list(trace_requests(TraceReader(SLICE), ReplayWindow(max_requests=n, speedup=speedup)))


def test_requests_arrive_at_their_recorded_times_whatever_the_cluster_does() -> None:
    """Open loop: on one prefill worker the trace overloads the cluster, and still every request
    arrives when the trace says (a closed loop would hold the later ones back)."""
    requests = _requests(150, speedup=4.0)
    run = replay_on_sim(requests, TracePrompts(512), PROFILE, "1P/1D", parse_arm("static:0,1"))
    assert [r.request_id for r in run.records] == [f"t{q.index}" for q in requests]
    assert [r.arrival for r in run.records] == pytest.approx([q.arrival_s for q in requests])
    assert list(run.lines) == [q.line for q in requests]
    assert all(r.finished is not None for r in run.records)
    ttft = [r.ttft for r in run.records if r.ttft is not None]
    assert len(ttft) == 150
    # The queue grew through the replay: the last arrivals waited far longer than the first.
    assert sum(ttft[-30:]) > 5 * sum(ttft[:30])
    summary = run.summary()
    assert summary["requests"] == summary["completed"] == 150
    assert summary["virtual_s"] >= requests[-1].arrival_s


def test_the_same_replay_twice_is_the_same_run() -> None:
    requests = _requests(80)
    arm = parse_arm("static:0,1")
    runs = [replay_on_sim(requests, TracePrompts(512, seed=2), PROFILE, "2P/2D", arm) for _ in "ab"]
    a, b = ([(r.ttft, r.decode_worker, r.cached_tokens) for r in run.records] for run in runs)
    assert a == b


def test_cache_affinity_finds_the_traces_shared_prefixes() -> None:
    """The trace's sharing reaches the caches: KV-aware routing (τ 0, ω 1) reuses more prompt
    tokens than round robin on the same replay."""
    requests = _requests(200)
    affine = replay_on_sim(requests, TracePrompts(512), PROFILE, "3P/3D", parse_arm("static:0,1"))
    spread = replay_on_sim(requests, TracePrompts(512), PROFILE, "3P/3D", parse_arm("round-robin"))
    assert affine.summary()["prefix_reuse"] > spread.summary()["prefix_reuse"] > 0.0
    turns = [r.prefill_worker for r in spread.records if r.prefill_worker is not None][:9]
    assert turns == [0, 1, 2] * 3  # round robin: every router picks in turn


def test_a_static_arm_routes_with_its_policy_and_an_adaptive_arm_needs_thresholds() -> None:
    requests = _requests(30)
    run = replay_on_sim(requests, TracePrompts(512), PROFILE, "2P/2D", parse_arm("static:0.8,0.1"))
    policies = {(r.decision.tau, r.decision.omega) for r in run.records}
    assert policies == {(0.8, 0.1)}
    with pytest.raises(ValueError, match="thresholds"):
        replay_on_sim(requests, TracePrompts(512), PROFILE, "2P/2D", parse_arm("adaptive"))
    adaptive = replay_on_sim(
        requests, TracePrompts(512), PROFILE, "2P/2D", parse_arm("adaptive"),
        thresholds=Thresholds(1.0, 3.0),
    )  # fmt: skip
    assert adaptive.timeline and adaptive.thresholds == Thresholds(1.0, 3.0)
    assert {s.prefill_workers for s in adaptive.timeline} == {2}


def test_arms_by_name() -> None:
    assert parse_arm("static:0,1").name == "static:0,1"
    assert parse_arm("static:0.80,0.10") == parse_arm("static:0.8,0.1")
    assert parse_arm("adaptive", resplit=True).name == "adaptive+resplit"
    assert parse_arm("round-robin").round_robin
    for bad in ("static", "static:1", "static:-1,2", "greedy"):
        with pytest.raises(ValueError, match="unknown policy"):
            parse_arm(bad)
    with pytest.raises(ValueError, match="re-split lever belongs to the controller"):
        parse_arm("static:0,1", resplit=True)


def test_the_calm_baseline_is_the_traces_own_traffic_at_low_load() -> None:
    calm = _requests(64)
    t = trace_calm_thresholds(PROFILE, "1P/5D", calm, TracePrompts(512))
    assert 0.0 < t.theta1 < t.theta2 and math.isfinite(t.theta2)
    # Long prompts take long to prefill even alone: the calm P99 is far above the profile's
    # 128-token calibration workload's (tens of ms).
    assert t.theta1 / 5 > 0.1
    with pytest.raises(ValueError, match="at least one request"):
        trace_calm_thresholds(PROFILE, "1P/5D", [], TracePrompts(512))


def test_round_robin_is_a_router_selection() -> None:
    router = Router(block_size=4, selection="round_robin")
    for w in (3, 1, 2):
        router.add_worker(w)
    picks = [router.decide(f"r{k}", [1, 2, 3, 4], reserve=False).worker for k in range(6)]
    assert picks == [1, 2, 3, 1, 2, 3]
    decision = router.decide("x", [1, 2, 3, 4])
    assert len(decision.costs) == 3 and decision.policy == Policy()  # the breakdown stays
    with pytest.raises(ValueError, match="selection must be one of cost, round_robin"):
        Router(selection="random")  # type: ignore[arg-type]
    assert SimCluster(PROFILE, "2P/2D", selection="round_robin").decode_router.selection == (
        "round_robin"
    )


def test_a_replay_collects_garbage_less_often_and_restores_the_collector() -> None:
    import gc

    from cluster.sim.loop import few_collections

    before = gc.get_threshold()
    with few_collections(50_000):
        assert gc.get_threshold() == (50_000, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), few_collections():
        raise RuntimeError("restored on the way out too")
    assert gc.get_threshold() == before


def test_the_poa_estimate_is_refreshed_at_its_own_period() -> None:
    from cluster.sim.control import ControlLoop
    from cluster.sim.scenario import unloaded_ttft
    from games.poa import MAX_AGE_S, PoaEstimator

    cluster = SimCluster(PROFILE, "2P/2D")
    estimator = PoaEstimator(256, MAX_AGE_S, unloaded_latency_s=unloaded_ttft(PROFILE))
    calls: list[float] = []
    estimate = estimator.estimate
    estimator.estimate = lambda now=None: calls.append(now) or estimate(now)  # type: ignore[method-assign]
    ControlLoop(cluster, None, estimator, until=20.0, poa_every_s=5.0)
    cluster.loop.run(20.0)
    assert calls == [1.0, 6.0, 11.0, 16.0]  # every tick reads the last one in between
    with pytest.raises(ValueError, match="poa_every_s"):
        ControlLoop(cluster, None, estimator, poa_every_s=-1.0)
