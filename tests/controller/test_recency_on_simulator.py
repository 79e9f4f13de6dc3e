"""Recency on the simulator (docs/design.md §4 "Recency"): after a spike, a calm phase reads calm
— regime ``below`` and poa_hat within 1.5× its calm baseline — within two ticks of the backlog
draining, on a single-prefill and a two-prefill deployment, open-loop (Poisson) arrivals."""

from __future__ import annotations

import statistics

import pytest

from cluster.sim.cluster import SimCluster
from cluster.sim.control import ControlLoop, TickSample
from cluster.sim.loadgen import OpenLoop
from cluster.sim.profile import load_profile
from cluster.sim.records import summarize
from cluster.sim.scenario import unloaded_ttft
from cluster.sim.template_source import TemplateSource
from controller.controller import Controller
from controller.detector import Regime, SaturationDetector, Thresholds
from controller.policy import PolicyTable
from games.poa import MAX_AGE_S, PoaEstimator

pytestmark = pytest.mark.slow

PROFILE = "b200-llama70b-fp8-tp4"
SPIKE_START, SPIKE_END, END = 40.0, 60.0, 110.0
# (topology, calm rate, spike rate) req/s: the spike is ~2× what the prefill pool serves, the
# calm rate a quarter of it.
CASES = [("1P/5D", 10.0, 80.0), ("2P/4D", 20.0, 150.0)]


def _source(profile, seed: int) -> TemplateSource:
    w = profile.workload
    return TemplateSource(
        w.templates, w.template_tokens, w.input_tokens, w.output_tokens, seed=seed
    )


def _run(topology: str, calm: float, spike: float, seed: int) -> tuple[ControlLoop, Controller]:
    profile = load_profile(PROFILE)
    quiet = SimCluster(profile, topology, seed=seed)
    OpenLoop(quiet, _source(profile, seed), [(0.0, calm)], end=SPIKE_START, seed=seed)
    quiet.loop.run(SPIKE_START)
    baseline = summarize(quiet.records, 10.0, SPIKE_START).ttft_p99_s

    cluster = SimCluster(profile, topology, seed=seed)
    control = Controller(
        SaturationDetector(Thresholds.calibrated(baseline)), PolicyTable(), cluster.decode_router
    )
    schedule = [(0.0, calm), (SPIKE_START, spike), (SPIKE_END, calm)]
    OpenLoop(cluster, _source(profile, seed), schedule, end=END, seed=seed)
    estimator = PoaEstimator(256, MAX_AGE_S, unloaded_latency_s=unloaded_ttft(profile))
    loop = ControlLoop(cluster, control, estimator, until=END)
    cluster.loop.run(END)
    return loop, control


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("topology", "calm", "spike"), CASES)
def test_calm_reads_calm_within_two_ticks_of_the_drain(
    topology: str, calm: float, spike: float, seed: int
) -> None:
    loop, control = _run(topology, calm, spike, seed)
    ticks: dict[float, TickSample] = {s.t: s for s in loop.timeline}
    calm_poa = statistics.median(s.poa_hat for s in loop.timeline if 20 <= s.t < SPIKE_START)

    assert any(s.regime == Regime.SATURATED for s in loop.timeline if s.t < SPIKE_END + 5)
    after = [d for d in loop.drain.drains if d.since >= SPIKE_END]
    assert len(after) == 1, loop.drain.drains  # the spike's backlog, drained once
    drain = after[0]
    assert drain.t == drain.since + loop.tick_s  # the second drained tick
    assert loop.cluster.records  # the run served
    for s in loop.timeline:
        if s.t >= drain.t:
            assert s.regime == Regime.BELOW, (s.t, s.regime)
            assert s.poa_hat <= 1.5 * calm_poa, (s.t, s.poa_hat, calm_poa)
    # Before the drain the queue still read as one: the signal is the drain, not the phase.
    assert ticks[drain.since - loop.tick_s].regime == Regime.SATURATED
    assert control.changes[-1].cause == "drain"
