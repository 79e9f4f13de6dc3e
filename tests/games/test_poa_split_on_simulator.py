"""The PoA split on the simulator (docs/design.md §3): poa_routing sees routing, poa_capacity
sees capacity. Open-loop (Poisson) arrivals with one seed per pair of runs, so two runs that
differ only in (τ, ω) serve the same requests at the same times: what changes between them is
routing alone. (A closed loop's clients resend when they are answered, so there a herd also
bunches the arrivals: docs/results.md's pareto experiment shows that case.)"""

from __future__ import annotations

import math
import statistics

import pytest

from cluster.sim.cluster import SimCluster
from cluster.sim.control import ControlLoop, TickSample
from cluster.sim.loadgen import OpenLoop
from cluster.sim.profile import load_profile
from cluster.sim.scenario import unloaded_ttft
from cluster.sim.template_source import TemplateSource
from cluster.sim.views import ViewSettings
from controller.resplit import ResplitSettings
from games.poa import MAX_AGE_S, PoaEstimator
from router import Policy

pytestmark = pytest.mark.slow

PROFILE = "b200-llama70b-fp8-tp4"
WARM, END = 15.0, 40.0
# Four router replicas on load reports every 250 ms, 10 ms late: bench/adaptive.py's stale view.
STALE = ViewSettings.stale(replicas=4, report_period_s=0.25, delay_s=0.01)


def _ticks(
    topology: str, rate: float, tau: float, views: ViewSettings, seed: int
) -> list[TickSample]:
    """The control loop's estimates from WARM to END, (τ, ω = 0.1) held on every router."""
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, topology, seed=seed, views=views)
    cluster.views.set_policy(Policy(tau, 0.1, 1))
    w = profile.workload
    source = TemplateSource(
        w.templates, w.template_tokens, w.input_tokens, w.output_tokens, seed=seed
    )
    OpenLoop(cluster, source, [(0.0, rate)], end=END, seed=seed)
    estimator = PoaEstimator(256, MAX_AGE_S, unloaded_latency_s=unloaded_ttft(profile))
    loop = ControlLoop(cluster, None, estimator, until=END)
    cluster.loop.run(END)
    return [s for s in loop.timeline if s.t >= WARM]


def _log_mean(ticks: list[TickSample], factor: str) -> float:
    return statistics.fmean(math.log(getattr(s, factor)) for s in ticks)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("views", "herding", "spread"),
    # Stale views herd at τ = 0 and τ = 2 spreads the herd; with fresh views the lowest-cost
    # choice is already right and τ = 2 strays from it.
    [(STALE, 0.0, 2.0), (ViewSettings(), 2.0, 0.0)],
    ids=["stale", "fresh"],
)
def test_a_policy_change_moves_poa_hat_through_the_routing_factor(
    views: ViewSettings, herding: float, spread: float, seed: int
) -> None:
    """70B on 2P/4D at 55 req/s (below what two prefill workers serve): only τ differs. The
    worse policy's poa_hat is higher, and most of the difference in log poa_hat is in
    log poa_routing."""
    worse = _ticks("2P/4D", 55.0, herding, views, seed)
    better = _ticks("2P/4D", 55.0, spread, views, seed)
    hat = _log_mean(worse, "poa_hat") - _log_mean(better, "poa_hat")
    routing = _log_mean(worse, "poa_routing") - _log_mean(better, "poa_routing")
    assert hat > 0.1, hat
    assert routing >= 0.5 * hat, (routing, hat)
    # The re-split reads capacity only when capacity dominates routing: not in a herd.
    assert not _capacity_dominates(worse)


def _capacity_dominates(ticks: list[TickSample]) -> bool:
    """The re-split's reading of the split (controller/resplit.py), on the mean factors."""
    dominance = ResplitSettings().dominance
    return _log_mean(ticks, "poa_capacity") >= math.log(dominance) + _log_mean(
        ticks, "poa_routing"
    )


def test_with_one_prefill_worker_routing_recovers_nothing() -> None:
    """70B on 1P/5D, stale views, τ = 0, above the prefill worker's rate: every request's TTFT
    is that worker's queue, whichever decode worker it goes to."""
    ticks = _ticks("1P/5D", 40.0, 0.0, STALE, 0)
    assert max(s.poa_routing for s in ticks) <= 1.1
    assert statistics.fmean(s.poa_capacity for s in ticks) > 3


@pytest.mark.parametrize("views", [STALE, ViewSettings()], ids=["stale", "fresh"])
def test_short_of_prefill_capacity_the_capacity_factor_dominates(views: ViewSettings) -> None:
    """70B on 2P/4D at 120 req/s, more than two prefill workers serve: the queues grow whatever
    the routing, and the capacity factor carries poa_hat."""
    ticks = _ticks("2P/4D", 120.0, 0.0, views, 0)
    routing, capacity = _log_mean(ticks, "poa_routing"), _log_mean(ticks, "poa_capacity")
    assert max(s.poa_routing for s in ticks) <= 1.1
    assert capacity >= 10 * routing and capacity > math.log(20), (routing, capacity)
    assert _capacity_dominates(ticks)
