"""Pool sizes on the simulated cluster (``PoolManager.scale_to``, cluster/sim/pools.py) and a
scaling policy of Dynamo's replay driven over it (cluster/sim/scaling.py): workers given up
drain and park, parked ones start in the growing pool after the role switch, nothing is lost,
and the snapshot a policy reads is the cluster's own state."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

import pytest

from cluster.backends.dynamo.scaling import ResplitScaling
from cluster.sim.cluster import PoolChange, SimCluster, Topology
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.planning import GameOnePlanner
from cluster.sim.profile import load_profile
from cluster.sim.scaling import ScalingDriver
from cluster.sim.scenario import template_source
from controller.detector import Thresholds
from controller.resplit import Pools
from games.pd_allocation import SloTargets

PROFILE = "b200-llama70b-fp8-tp4"
SWITCH_S = 2.0


def _cluster(topology: str = "1P/5D") -> SimCluster:
    profile = dataclasses.replace(load_profile(PROFILE), role_switch_s=SWITCH_S)
    return SimCluster(profile, topology, seed=5)


def _steps(changes: list[PoolChange]) -> list[tuple[str, int, str, str]]:
    return [(c.action, c.worker, c.from_role, c.to_role) for c in changes]


def test_scale_to_parks_the_workers_a_pool_gives_up_and_starts_them_in_the_other() -> None:
    cluster = _cluster()
    changes: list[PoolChange] = []
    cluster.pool_listeners.append(changes.append)
    cluster.pool_state.scale_to(3, 2, reason="sizes")
    # Idle workers drain at once, park, and start as prefill workers: three moves at once.
    assert cluster.pools == Topology(1, 2) and cluster.pool_state.starting("prefill") == (4, 5)
    assert set(cluster.pool_state.parked) == {3}
    cluster.loop.run(SWITCH_S + 0.5)
    assert cluster.pools == Topology(3, 2) and not cluster.resplitting
    assert _steps(changes)[:8] == [
        ("resplit_start", 5, "decode", "parked"), ("drained", 5, "decode", "parked"),
        ("resplit_start", 4, "decode", "parked"), ("drained", 4, "decode", "parked"),
        ("resplit_start", 3, "decode", "parked"), ("drained", 3, "decode", "parked"),
        ("resplit_start", 5, "parked", "prefill"), ("resplit_start", 4, "parked", "prefill"),
    ]  # fmt: skip
    assert [c.action for c in changes].count("warm") == 2
    assert all(c.reason == "sizes" for c in changes)
    # One worker parked since t = 0: it held no GPU while parked; the others all the time.
    now = cluster.now
    assert cluster.pool_state.worker_seconds() == pytest.approx(5 * now)
    cluster.pool_state.scale_to(4, 2)
    assert cluster.pool_state.parked == () and cluster.pool_state.starting("prefill") == (3,)
    cluster.loop.run(now + SWITCH_S + 0.5)
    assert cluster.pools == Topology(4, 2)
    assert cluster.pool_state.worker_seconds() == pytest.approx(5 * now + 6 * (cluster.now - now))


def test_a_pool_keeps_its_last_worker_and_a_size_waits_for_workers_to_park() -> None:
    cluster = _cluster("2P/2D")
    cluster.pool_state.scale_to(1, 1)  # both pools shrink to one: two workers park
    cluster.loop.run(0.1)
    assert cluster.pools == Topology(1, 1) and len(cluster.pool_state.parked) == 2
    with pytest.raises(ValueError, match="decode >= 1"):
        cluster.pool_state.scale_to(1, 0)
    cluster.pool_state.scale_to(0, 1)  # prefill keeps its last worker
    assert cluster.pools == Topology(1, 1)
    # A size above the workers it has waits for the ones still draining.
    busy = _cluster("1P/3D")
    source = template_source(busy.profile, 0)
    busy.submit_many([source() for _ in range(24)])
    busy.pool_state.scale_to(3, 1)
    assert busy.pools.prefill == 1 and busy.pool_state.leaving("decode")
    busy.loop.run()
    assert busy.pools == Topology(3, 1)
    assert all(r.status == "ok" for r in busy.records) and busy.in_flight == 0


def test_pool_sizes_under_load_lose_no_request() -> None:
    cluster = _cluster()
    ClosedLoop(cluster, template_source(cluster.profile, 1), [Phase(30.0, 128, ramp=2.0)])
    cluster.loop.at(5.0, cluster.pool_state.scale_to, 3, 3, "up")
    cluster.loop.at(15.0, cluster.pool_state.scale_to, 2, 2, "down")
    cluster.loop.run()
    records = cluster.records
    assert len(records) > 500 and all(r.status == "ok" for r in records)
    assert len({r.request_id for r in records}) == len(records) and cluster.in_flight == 0
    assert cluster.pools == Topology(2, 2) and len(cluster.pool_state.parked) == 2
    prefilled_late = {r.prefill_worker for r in records if (r.routed or 0) > 10.0}
    assert len(prefilled_late - {None, 0}) >= 1  # the new prefill workers served


class Scripted:
    """A policy that answers from a script and keeps the snapshots it read."""

    def __init__(self, answers: list[Mapping[str, object]], first_ms: float = 1000.0) -> None:
        self.answers = answers
        self.first_ms = first_ms
        self.seen: list[dict[str, object]] = []

    def initial_tick_ms(self) -> float:
        return self.first_ms

    def on_tick(self, snapshot: dict[str, object]) -> Mapping[str, object]:
        self.seen.append(snapshot)
        return self.answers[len(self.seen) - 1]


def test_the_driver_feeds_the_cluster_state_and_applies_the_sizes() -> None:
    cluster = _cluster()
    source = template_source(cluster.profile, 2)

    def burst() -> None:
        cluster.submit_many([source() for _ in range(40)])

    cluster.loop.at(0.5, burst)
    policy = Scripted(
        [
            {"target_prefill": 2, "target_decode": 4, "next_tick_ms": 2000.0},
            {"target_prefill": None, "target_decode": None, "next_tick_ms": 6000.0},
            {"target_prefill": None, "target_decode": None, "next_tick_ms": None},
        ]
    )
    driver = ScalingDriver(cluster, policy)
    cluster.loop.run()
    first, second, third = (cast(dict[str, Any], seen) for seen in policy.seen)
    assert [s["now_ms"] for s in policy.seen] == [1000.0, 2000.0, 6000.0]  # then no more ticks
    assert [s["tick_ordinal"] for s in policy.seen] == [0, 1, 2]
    assert first["active_prefill_ids"] == [0] and first["active_decode_count"] == 5
    traffic = first["traffic"]
    assert traffic["num_req"] == 40 and traffic["duration_s"] == pytest.approx(1.0)
    # The one prefill worker's queue: the window's prompts it has not finished at t = 1 s.
    (fpm,) = first["prefill_fpm_snapshots"]
    engine_jobs = fpm["num_queued_prefill"] + fpm["num_prefill_requests"]
    unfinished = sum(
        1 for r in cluster.records if r.prefill_worker == 0 and (r.prefill_end or 2.0) > 1.0
    )
    assert fpm["worker_id"] == 0 and engine_jobs == unfinished > 30
    assert fpm["sum_prefill_tokens"] + fpm["sum_queued_prefill_tokens"] > 0
    assert len(first["decode_fpm_snapshots"]) == 5
    # A second later a decode worker has left its pool: draining what it holds, or parked
    # and starting as a prefill worker.
    assert second["traffic"]["num_req"] == 0
    assert second["active_decode_count"] == 4
    moving = second["starting_prefill_count"], second["draining_decode_count"]
    assert moving in ((1, 0), (0, 1))
    assert second["non_draining_prefill_count"] == 1 + moving[0]
    assert third["active_prefill_count"] == 2 and third["starting_prefill_count"] == 0
    # Each first token is in one window: the one of the tick that followed it.
    answered = sum(1 for r in cluster.records if (r.first_token or 7.0) <= 6.0)
    assert sum(seen["traffic"]["ttft_count"] for seen in (first, second, third)) == answered
    assert driver.targets == [(1.0, 2, 4)] and cluster.pools == Topology(2, 4)
    assert all(r.status == "ok" for r in cluster.records)


@pytest.mark.parametrize(
    "answer, field",
    [({"target_prefill": 1.5}, "target_prefill"), ({"next_tick_ms": float("nan")}, "next_tick")],
)
def test_a_policy_answer_out_of_range_is_refused(answer: dict[str, object], field: str) -> None:
    cluster = _cluster()
    ScalingDriver(cluster, Scripted([answer]))
    with pytest.raises(ValueError, match=field):
        cluster.loop.run()


def test_our_resplit_as_a_replay_policy_runs_in_our_simulator_too() -> None:
    """The same object Dynamo's replay drives: 1P/5D overloaded by long prompts moves workers
    to prefill, one switch at a time, never holding more than six."""
    cluster = _cluster()
    profile = cluster.profile
    ClosedLoop(cluster, template_source(profile, 3), [Phase(90.0, 256, ramp=2.0)])
    slo = SloTargets(ttft_s=2.0, itl_s=0.05, attainment=0.99)
    planner = GameOnePlanner(profile, Topology(1, 5), slo)
    policy = ResplitScaling(planner, Pools(1, 5), Thresholds(0.5, 1.0), SWITCH_S)
    ScalingDriver(cluster, policy)
    most = [0]

    def count(_: PoolChange) -> None:
        held = len(cluster.prefill) + len(cluster.decode)
        most[0] = max(most[0], held)

    cluster.pool_listeners.append(count)
    cluster.loop.run(90.0)
    assert policy.target.moves >= 1 and cluster.pools.prefill >= 2
    assert most[0] <= 6 and cluster.pools.prefill + cluster.pools.decode <= 6


def test_a_resplit_of_several_workers_switches_them_side_by_side() -> None:
    cluster = _cluster()
    changes: list[PoolChange] = []
    cluster.pool_listeners.append(changes.append)
    first = cluster.resplit("prefill", "burst", workers=3)
    assert first == 5 and cluster.pools == Topology(1, 2)
    with pytest.raises(ValueError, match="already in progress"):
        cluster.resplit("prefill")
    cluster.loop.run()
    warm = [c for c in changes if c.action == "warm"]
    assert [c.worker for c in warm] == [5, 4, 3] and {c.t for c in warm} == {SWITCH_S}
    assert cluster.pools == Topology(4, 2) and not cluster.resplitting
    with pytest.raises(ValueError, match="cannot move 2 worker"):
        cluster.resplit("prefill", workers=2)  # decode keeps one
    with pytest.raises(ValueError, match="cannot move 0 worker"):
        cluster.resplit("decode", workers=0)
