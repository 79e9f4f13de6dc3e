"""A whole-system run on the simulator: load phases, the routers under a static or adaptive
policy (optionally with the re-split lever), the PoA estimator, and per-phase figures.

Phase figures attribute latency to the phase a request *arrived* in (its TTFT and ITL belong to
the load that met it), throughput to the phase a request finished in.

Used by ``bench/adaptive.py`` (static vs adaptive) and by ``disaggctl demo``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cluster.sim.admission import Admission
from cluster.sim.cluster import SimCluster
from cluster.sim.control import ControlLoop, SimPools, TickSample
from cluster.sim.loadgen import ClosedLoop, Phase, RequestSource
from cluster.sim.planning import GameOnePlanner, capacity_advisor
from cluster.sim.pools import PoolChange
from cluster.sim.profile import HardwareProfile
from cluster.sim.records import RequestRecord, summarize
from cluster.sim.template_source import TemplateSource
from cluster.sim.views import ViewSettings
from controller.controller import CapacityAdvice, Controller, RegimeChange
from controller.detector import SaturationDetector, Thresholds
from controller.drain import Drain, calm_limit_s
from controller.evidence import EvidencePolicy
from controller.policy import PolicyTable
from controller.resplit import ResplitDecision, ResplitSettings, Resplitter
from games.pd_allocation import SloTargets
from games.poa import MAX_AGE_S, PoaEstimator


@dataclass(frozen=True)
class NamedPhase:
    name: str
    phase: Phase


@dataclass
class ScenarioResult:
    topology: str
    adaptive: bool
    phases: list[dict[str, Any]]  # Any: JSON rows of the report (_phase_row)
    timeline: list[TickSample]
    changes: list[RegimeChange]
    advice: list[CapacityAdvice]
    records: list[RequestRecord] = field(repr=False)
    thresholds: Thresholds | None = None
    resplits: list[ResplitDecision] = field(default_factory=list)
    pool_changes: list[PoolChange] = field(default_factory=list)
    drains: list[Drain] = field(default_factory=list)  # backlogs that ended (controller.drain)


def calm_baseline_p99(
    profile: HardwareProfile,
    topology: str,
    concurrency: int = 32,
    seconds: float = 30.0,
    seed: int = 0,
    views: ViewSettings | None = None,
    source: RequestSource | None = None,
) -> float:
    """TTFT P99 of a calm closed loop: the baseline the thresholds are multiples of (measured
    on the deployment the controller will run on, hence ``views``, and on its traffic, hence
    ``source``: the profile's calibration workload by default)."""
    cluster = SimCluster(profile, topology, seed=seed, views=views)
    source = source or template_source(profile, seed)
    load = ClosedLoop(cluster, source, [Phase(seconds, concurrency, 5.0)])
    cluster.loop.run(load.end)
    return summarize(cluster.records, min(10.0, seconds / 2), load.end).ttft_p99_s


def template_source(
    profile: HardwareProfile,
    seed: int,
    bidders: Mapping[str, float] | None = None,
    *,
    output_range_ratio: float = 0.0,
) -> TemplateSource:
    """The profile's calibration workload (optionally with bidding users, and output lengths
    spread by ``output_range_ratio`` around the profile's, ``TemplateSource``'s rule)."""
    w = profile.workload
    return TemplateSource(
        w.templates,
        w.template_tokens,
        w.input_tokens,
        w.output_tokens,
        seed=seed + 1,
        bidders=bidders,
        output_range_ratio=output_range_ratio,
    )


def unloaded_ttft(profile: HardwareProfile) -> float:
    """The profile's TTFT with nobody ahead: one prefill iteration, the transfer, one decode
    iteration (the PoA estimator's anchor: its latency at zero load, games/poa.py)."""
    p, d, w = profile.prefill, profile.decode, profile.workload
    uncached = w.input_tokens - w.template_tokens
    prefill = p.a_s + p.b_s_per_token * uncached + p.c_s_per_request
    transfer = profile.link.latency_s + (
        w.input_tokens * profile.kv_bytes_per_token * 8 / (profile.link.bandwidth_gbps * 1e9)
    )
    return prefill + transfer + d.d0_s + d.d1_s_per_seq


def adaptive_controller(
    cluster: SimCluster,
    thresholds: Thresholds,
    table: PolicyTable | None,
    resplit: ResplitSettings | None,
    arrival_rate: Callable[[], float],
    *,
    evidence: bool = False,
    slo: SloTargets | None = None,
) -> Controller:
    """The controller of an adaptive arm on ``cluster``: the detector at ``thresholds``, the
    policy ``table`` (the study's by default) on every router, or with ``evidence`` the table
    blended by the PoA window's evidence (controller/evidence.py), Game 1's advice at the
    measured ``arrival_rate`` and, given ``resplit``, the re-split lever on the pools. ``slo``:
    the operator's targets Game 1 plans for (default TTFT θ1 at 90%, ITL 1.5 decode steps)."""
    profile = cluster.profile
    if slo is None:
        slo = SloTargets(ttft_s=thresholds.theta1, itl_s=1.5 * profile.decode.d0_s)
    advisor = capacity_advisor(profile, cluster.topology, slo, arrival_rate)
    resplitter = None
    if resplit is not None:
        planner = GameOnePlanner(profile, cluster.topology, slo)
        resplitter = Resplitter(SimPools(cluster), planner, resplit)
    table = table or PolicyTable()
    return Controller(
        SaturationDetector(thresholds),
        table,
        cluster,
        advisor=advisor,
        resplitter=resplitter,
        evidence=EvidencePolicy(table) if evidence else None,
    )


def run_scenario(
    profile: HardwareProfile,
    topology: str,
    phases: Sequence[NamedPhase],
    *,
    adaptive: bool,
    thresholds: Thresholds | None = None,
    seed: int = 0,
    admission: Admission | None = None,
    table: PolicyTable | None = None,
    source: RequestSource | None = None,
    on_tick: Callable[[TickSample], None] | None = None,
    views: ViewSettings | None = None,
    resplit: ResplitSettings | None = None,
) -> ScenarioResult:
    """Drive ``phases`` of a closed loop; adaptive runs put a controller on the cluster's routers
    (and, given ``resplit``, the re-split lever on its pools)."""
    if resplit is not None and not adaptive:
        raise ValueError("the re-split lever belongs to the controller: resplit needs adaptive")
    cluster = SimCluster(profile, topology, seed=seed, admission=admission, views=views)
    source = source or template_source(profile, seed)
    load = ClosedLoop(cluster, source, [p.phase for p in phases])
    controller = None
    loop_ref: list[ControlLoop] = []
    if adaptive:
        if thresholds is None:
            baseline = calm_baseline_p99(profile, topology, seed=seed)
            thresholds = Thresholds.calibrated(baseline)
        controller = adaptive_controller(
            cluster, thresholds, table, resplit, lambda: loop_ref[0].arrival_rate()
        )
    estimator = PoaEstimator(256, MAX_AGE_S, unloaded_latency_s=unloaded_ttft(profile))
    # Static and adaptive arms cut their PoA windows at the same drains (controller.drain).
    limit = None if thresholds is None else calm_limit_s(thresholds)
    loop = ControlLoop(
        cluster, controller, estimator, until=load.end, on_tick=on_tick, drain_limit_s=limit
    )
    loop_ref.append(loop)
    cluster.loop.run(load.end)
    rows = []
    start = 0.0
    for named in phases:
        end = start + named.phase.duration
        rows.append(phase_figures(named.name, start, end, cluster.records, loop.timeline))
        start = end
    return ScenarioResult(
        topology=topology,
        adaptive=adaptive,
        phases=rows,
        timeline=loop.timeline,
        changes=controller.changes if controller else [],
        advice=controller.advice if controller else [],
        records=cluster.records,
        thresholds=thresholds,
        resplits=controller.resplitter.decisions if controller and controller.resplitter else [],
        pool_changes=loop.pool_changes,
        drains=list(loop.drain.drains),
    )


def phase_figures(
    name: str,
    start: float,
    end: float,
    records: Sequence[RequestRecord],
    timeline: Sequence[TickSample],
) -> dict[str, Any]:
    summary = summarize(records, start, end, by="arrival")
    ticks = [s for s in timeline if start < s.t <= end]

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else float("nan")

    return {
        "phase": name,
        "start_s": start,
        "end_s": end,
        "completed": summary.completed,
        "throughput_rps": round(summary.throughput_rps, 3),
        "ttft_p99_s": round(summary.ttft_p99_s, 4),
        "itl_p99_s": round(summary.itl_p99_s, 5),
        "poa_hat": round(mean([s.poa_hat for s in ticks]), 3),
        "poa_routing": round(mean([s.poa_routing for s in ticks]), 4),
        "poa_capacity": round(mean([s.poa_capacity for s in ticks]), 3),
        "cache_hit_rate": round(summary.cache_hit_rate, 4),
        # Time averages (ticks are evenly spaced): a worker draining or warming up for a
        # re-split serves in neither pool, and the phase pays for that time.
        "prefill_workers": round(mean([s.prefill_workers for s in ticks]), 3) if ticks else None,
        "decode_workers": round(mean([s.decode_workers for s in ticks]), 3) if ticks else None,
    }
