"""With the simulator: a ramp of 70B 1P/5D from C = 32 to 256 is detected as it crosses the knee,
and the router's policy follows the regime."""

from __future__ import annotations

import pytest

from cluster.sim.cluster import SimCluster
from cluster.sim.control import ControlLoop
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.profile import load_profile
from cluster.sim.records import summarize
from cluster.sim.template_source import TemplateSource
from controller.controller import Controller
from controller.detector import Regime, SaturationDetector, Thresholds
from controller.policy import PolicyTable
from games.poa import PoaEstimator

pytestmark = pytest.mark.slow

PROFILE = "b200-llama70b-fp8-tp4"
RAMP_START, RAMP_S, C0, C1 = 20.0, 120.0, 32, 256


def _source(profile):
    w = profile.workload
    return TemplateSource(w.templates, w.template_tokens, w.input_tokens, w.output_tokens, seed=1)


def test_ramp_is_detected_at_the_knee() -> None:
    profile = load_profile(PROFILE)
    calm = SimCluster(profile, "1P/5D", seed=0)
    load = ClosedLoop(calm, _source(profile), [Phase(40, C0, ramp=5)])
    calm.loop.run(load.end)
    baseline = summarize(calm.records, 10, 40).ttft_p99_s

    cluster = SimCluster(profile, "1P/5D", seed=0)
    control = Controller(
        SaturationDetector(Thresholds.calibrated(baseline)),
        PolicyTable(),
        cluster.decode_router,
    )
    ramp = ClosedLoop(
        cluster, _source(profile), [Phase(RAMP_START, C0, ramp=5), Phase(RAMP_S, C1, ramp=RAMP_S)]
    )
    loop = ControlLoop(cluster, control, PoaEstimator(unloaded_latency_s=0.035), until=ramp.end)
    cluster.loop.run(ramp.end)

    def concurrency_at(t: float) -> float:
        return C0 + (C1 - C0) * max(0.0, t - RAMP_START) / RAMP_S

    first = next(c for c in control.changes if c.regime > Regime.BELOW)
    assert 96 < concurrency_at(first.t) <= 160  # the knee is at C ≈ 101
    assert control.regime == Regime.SATURATED
    assert [c.regime for c in control.changes] == sorted(c.regime for c in control.changes)
    assert cluster.decode_router.policy.tau == 0.8 and cluster.decode_router.policy.omega == 0.1
    calm_ticks = [s for s in loop.timeline if s.t < first.t - 20]
    hot_ticks = [s for s in loop.timeline if s.regime == Regime.SATURATED]
    assert max(s.poa_hat for s in calm_ticks) < min(s.poa_hat for s in hot_ticks[-10:])
