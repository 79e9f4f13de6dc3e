"""Our re-split as a scaling policy of Dynamo's offline replay
(cluster/backends/dynamo/scaling.py): a role switch is a decode worker drained, then a prefill
worker started, so the pools never hold more than their six workers, and in Dynamo's own replay
of Mooncake's trace the policy moves workers to prefill when the traffic overloads 1P/5D."""

from __future__ import annotations

import os
from pathlib import Path

from bench.controller import write_mooncake
from cluster.backends.dynamo.replay import engines_of
from cluster.backends.dynamo.scaling import ReplayPools, ResplitScaling, snapshot_traffic
from cluster.sim.planning import GameOnePlanner
from cluster.sim.pools import Topology
from cluster.sim.profile import load_profile
from controller.detector import Thresholds
from controller.resplit import Pools
from controller.traffic import TrafficShape
from games.pd_allocation import SloTargets

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"


def snapshot(
    p: int, d: int, starting: tuple[int, int] = (0, 0), draining: tuple[int, int] = (0, 0)
) -> dict[str, object]:
    """A replay snapshot's pool counts: ``p``, ``d`` ready (Dynamo's ``active``), the others
    starting or draining."""
    return {
        "active_prefill_count": p, "active_decode_count": d,
        "starting_prefill_count": starting[0], "starting_decode_count": starting[1],
        "draining_prefill_count": draining[0], "draining_decode_count": draining[1],
    }  # fmt: skip


def test_a_switch_drains_a_decode_worker_before_it_starts_a_prefill_worker() -> None:
    pools = ReplayPools(Pools(1, 5), switch_s=30.0)
    pools.observe(snapshot(1, 5))
    pools.resplit("prefill", "test")
    assert pools.answer() == (1, 4) and pools.resplitting()  # first the drain
    pools.observe(snapshot(1, 4, draining=(0, 1)))  # still draining: no start yet
    assert pools.answer() == (1, 4) and pools.pools() == Pools(1, 4)
    pools.observe(snapshot(1, 4))  # drained and removed: now the start
    assert pools.answer() == (2, 4)
    pools.observe(snapshot(1, 4, starting=(1, 0)))
    assert pools.resplitting() and pools.pools() == Pools(1, 4)
    pools.observe(snapshot(2, 4))  # ready
    assert not pools.resplitting() and pools.answer() == (None, None) and pools.moves == 1
    assert not pools.cancel("too late")  # Dynamo drains to removal


def test_the_snapshots_traffic_is_weighted_by_each_windows_counts() -> None:
    windows = [
        {"duration_s": 1.0, "num_req": 2, "avg_isl": 10_000.0, "avg_osl": 300.0,
         "shape_count": 1, "avg_kv_hit_rate": 0.5, "hit_rate_count": 1},
        {"duration_s": 1.0, "num_req": 4, "avg_isl": 4_000.0, "avg_osl": 100.0,
         "shape_count": 3, "avg_kv_hit_rate": 0.1, "hit_rate_count": 1},
    ]  # fmt: skip
    fpm = {0: {"sum_queued_prefill_tokens": 5_000, "sum_prefill_tokens": 1_000}}
    traffic = snapshot_traffic(windows, fpm)
    assert traffic.arrival_rate == 3.0
    assert traffic.shape == TrafficShape(5_500.0, 150.0, 0.3)
    assert traffic.queued_prefill_tokens == 6_000.0


def test_in_dynamos_replay_the_policy_moves_workers_to_prefill_within_the_budget(
    tmp_path: Path,
) -> None:
    os.environ.setdefault("DYN_LOG", "warn")
    from dynamo._core import KvRouterConfig, run_mocker_trace_replay

    profile = load_profile("b200-llama70b-fp8-tp4")
    window = write_mooncake(str(SLICE), 240.0, tmp_path / "w.jsonl")
    prefill, decode = engines_of(profile, tmp_path)
    slo = SloTargets(ttft_s=2.0, itl_s=0.05, attainment=0.99)
    planner = GameOnePlanner(profile, Topology(1, 5), slo)
    policy = ResplitScaling(planner, Pools(1, 5), Thresholds(20.0, 60.0), profile.role_switch_s)
    switch = {"startup_time": profile.role_switch_s}
    result = run_mocker_trace_replay(
        [str(window)], prefill_engine_args={"engine": prefill, **switch},
        decode_engine_args={"engine": decode, **switch}, num_prefill_workers=1,
        num_decode_workers=5, router_mode="kv_router", trace_format="mooncake",
        trace_block_size=512, arrival_speedup_ratio=1.0,
        router_config=KvRouterConfig(router_temperature=0.0, prefill_load_scale=1.0),
        scaling_policy=policy,
    )  # fmt: skip
    assert policy.target.moves >= 1
    decisions = policy.resplitter.decisions
    assert decisions[0].to_role == "prefill" and decisions[0].before == Pools(1, 5)
    assert "overloads 1P/5D" in decisions[0].reason
    held = {"prefill": 1, "decode": 5}
    for op in result.lifecycle_operations:  # never a seventh worker, starting ones included
        after = op["state_after_batch"]
        held[op["pool"]] = len(after["active"]) + len(after["starting"]) + len(after["draining"])
        assert sum(held.values()) <= 6, op
    served = {pools for _, pools, _ in policy.timeline}
    assert any(p.prefill >= 2 for p in served) and all(p.prefill + p.decode <= 6 for p in served)
