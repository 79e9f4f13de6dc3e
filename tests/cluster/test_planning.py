"""Game 1 as planner advice (``cluster.sim.planning``): a profile's cost models as pool costs, and
an advisor whose split is feasible, optimal by brute force over the TP grid, and taken at the
demand measured when it is called."""

from __future__ import annotations

import itertools
from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.sim.cluster import Topology
from cluster.sim.planning import GameOnePlanner, capacity_advisor, pool_costs
from cluster.sim.profile import load_profile
from controller.resplit import Pools
from controller.traffic import TrafficShape
from games.pd_allocation import PoolCosts, SloTargets, slo_capacity

PROFILES = ("b200-llama70b-fp8-tp4", "b200-nemotron340b-fp8-tp8", "h100-32b")
TOPOLOGY = Topology(1, 5)


@pytest.fixture(scope="module", params=PROFILES)
def profile(request):
    return load_profile(request.param)


def slo_for(profile) -> SloTargets:
    # The scenario's SLO: θ1-like TTFT, ITL 1.5 decode iterations.
    return SloTargets(ttft_s=0.5, itl_s=1.5 * profile.decode.d0_s)


def test_pool_costs_mirror_the_profile(profile) -> None:
    costs = pool_costs(profile)
    assert isinstance(costs, PoolCosts)
    p, d, w = profile.prefill, profile.decode, profile.workload
    expected = {
        "tp": profile.tp,
        "a_s": p.a_s,
        "b_s_per_token": p.b_s_per_token,
        "c_s_per_request": p.c_s_per_request,
        "max_batch_tokens": p.max_batch_tokens,
        "max_batch_requests": p.max_batch_requests,
        "d0_s": d.d0_s,
        "d1_s_per_seq": d.d1_s_per_seq,
        "d2_s_per_kv_token": d.d2_s_per_kv_token,
        "max_batch": d.max_batch,
        "kv_capacity_tokens": d.kv_capacity_tokens,
        "input_tokens": w.input_tokens,
        "output_tokens": w.output_tokens,
        "cached_tokens": 0,
        "e_s_per_token_pair": p.e_s_per_token_pair,
    }
    assert {f.name: getattr(costs, f.name) for f in fields(costs)} == expected
    # A real profile serves both pools within its own SLO.
    capacity = slo_capacity(costs, slo_for(profile))
    assert capacity.prefill > 0 and capacity.decode > 0


def brute_force_best(profile, slo: SloTargets, lam: float) -> float:
    """max over feasible (G_P, G_D) on the TP grid of min(λ, n_P·κ_P, n_D·κ_D)."""
    cap = slo_capacity(pool_costs(profile), slo)
    steps = TOPOLOGY.gpus(profile.tp) // profile.tp
    return max(
        min(lam, n_p * cap.prefill, n_d * cap.decode)
        for n_p, n_d in itertools.product(range(1, steps), repeat=2)
        if n_p + n_d <= steps
    )


def check_advice(profile, slo: SloTargets, lam: float) -> None:
    outcome = capacity_advisor(profile, TOPOLOGY, slo, lambda: lam)()
    tp, gpus = profile.tp, TOPOLOGY.gpus(profile.tp)
    best = outcome.optimum
    # A feasible split of the same GPUs, whole TP groups, at least one worker per pool.
    assert best.gpus_p % tp == 0 and best.gpus_d % tp == 0
    assert best.gpus_p >= tp and best.gpus_d >= tp and best.gpus_p + best.gpus_d <= gpus
    # Goodput: never more than the demand, and the best any split can carry.
    assert 0 <= best.welfare <= max(lam, 1e-9) + 1e-9
    assert best.welfare == pytest.approx(brute_force_best(profile, slo, max(lam, 1e-9)))
    # The equilibria are feasible splits no better than the optimum; PoA_1 ≥ 1.
    eq = outcome.equilibrium
    assert eq.worst in eq.splits and eq.gap >= 0
    for split in eq.splits:
        assert split.gpus_p + split.gpus_d <= gpus and split.welfare <= best.welfare + 1e-9
    assert outcome.poa >= 1
    assert outcome.arrival_rate == pytest.approx(max(lam, 1e-9))


@pytest.mark.parametrize("lam", [0.0, 0.5, 5.0, 20.0, 45.0, 200.0, 1e4])
def test_advice_is_the_best_feasible_split(profile, lam: float) -> None:
    check_advice(profile, slo_for(profile), lam)


@given(
    lam=st.floats(0.0, 500.0, allow_nan=False),
    ttft=st.floats(0.05, 5.0),
    itl_factor=st.floats(1.05, 4.0),
)
def test_advice_invariants_hold_for_any_demand_and_slo(
    lam: float, ttft: float, itl_factor: float
) -> None:
    profile = load_profile(PROFILES[0])
    check_advice(profile, SloTargets(ttft_s=ttft, itl_s=itl_factor * profile.decode.d0_s), lam)


def test_light_demand_is_carried_whole_and_heavy_demand_saturates(profile) -> None:
    slo = slo_for(profile)
    rate = {"lam": 0.5}
    advise = capacity_advisor(profile, TOPOLOGY, slo, lambda: rate["lam"])
    light = advise().optimum
    assert light.welfare == pytest.approx(0.5)
    goodputs = []
    for lam in (1.0, 10.0, 50.0, 200.0, 1e3, 1e4):
        rate["lam"] = lam
        goodputs.append(advise().optimum.welfare)
    assert goodputs == sorted(goodputs)  # more demand never carries less
    assert goodputs[-1] == goodputs[-2] < 1e3  # past every split's capacity: a ceiling


def test_the_advisor_reads_the_demand_when_called() -> None:
    profile = load_profile(PROFILES[0])
    calls: list[int] = []

    def arrival_rate() -> float:
        calls.append(1)
        return 30.0

    advise = capacity_advisor(profile, TOPOLOGY, slo_for(profile), arrival_rate)
    assert calls == []  # building the advisor measures nothing
    first, second = advise(), advise()
    assert len(calls) == 2 and first == second


def test_zero_or_negative_measured_demand_is_floored_not_an_error() -> None:
    profile = load_profile(PROFILES[0])
    for lam in (0.0, -3.0):
        outcome = capacity_advisor(profile, TOPOLOGY, slo_for(profile), lambda lam=lam: lam)()
        assert outcome.arrival_rate == pytest.approx(1e-9)
        assert outcome.optimum.welfare == pytest.approx(1e-9)


def test_more_gpus_never_carry_less() -> None:
    profile = load_profile(PROFILES[0])
    slo = slo_for(profile)
    carried = [
        capacity_advisor(profile, Topology(1, d), slo, lambda: 1e4)().optimum.welfare
        for d in (1, 2, 5, 9)
    ]
    assert carried == sorted(carried) and carried[-1] > carried[0]


def test_the_planner_reads_the_windows_traffic_shape() -> None:
    profile = load_profile("b200-llama70b-fp8-tp4")
    # A TTFT SLO a 12k-token prompt can meet (the scenario's 0.5 s is shorter than its prefill).
    slo = SloTargets(ttft_s=5.0, itl_s=1.5 * profile.decode.d0_s)
    planner = GameOnePlanner(profile, Topology(1, 5), slo)
    long_prompts = TrafficShape(prompt_tokens=12_000.0, output_tokens=400.0)
    cached = TrafficShape(prompt_tokens=12_000.0, output_tokens=400.0, reuse=0.5)
    one = Pools(1, 5)
    # A cache hit is prefill capacity: half the prompt cached, 1.5 times the requests/s at
    # least (the linear half goes; the new half still attends over the cached one).
    per_request = [planner.prefill_rate(one, s) / s.new_tokens for s in (cached, long_prompts)]
    assert per_request[0] > 1.5 * per_request[1]
    assert planner.capacity(one, long_prompts) < planner.capacity(one)  # vs 128-token prompts
    # Mooncake-like prompts at 2.5 req/s need more than one prefill worker of six.
    assert planner.best_split(2.5, long_prompts).prefill > 1
    assert planner.best_split(2.5).prefill <= planner.best_split(2.5, long_prompts).prefill
