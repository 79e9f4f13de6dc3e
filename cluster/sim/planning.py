"""Game 1 as planner advice for a simulated (or real) cluster: a hardware profile's cost models as
``games.PoolCosts``, and an advisor the controller calls when saturation is capacity-bound."""

from __future__ import annotations

from collections.abc import Callable

from cluster.sim.cluster import Topology
from cluster.sim.profile import HardwareProfile
from games.pd_allocation import PdOutcome, PoolCosts, SloTargets, pd_game, poa_pd


def pool_costs(profile: HardwareProfile) -> PoolCosts:
    p, d, w = profile.prefill, profile.decode, profile.workload
    return PoolCosts(
        tp=profile.tp,
        a_s=p.a_s,
        b_s_per_token=p.b_s_per_token,
        c_s_per_request=p.c_s_per_request,
        max_batch_tokens=p.max_batch_tokens,
        max_batch_requests=p.max_batch_requests,
        d0_s=d.d0_s,
        d1_s_per_seq=d.d1_s_per_seq,
        d2_s_per_kv_token=d.d2_s_per_kv_token,
        max_batch=d.max_batch,
        kv_capacity_tokens=d.kv_capacity_tokens,
        input_tokens=w.input_tokens,
        output_tokens=w.output_tokens,
    )


def capacity_advisor(
    profile: HardwareProfile,
    topology: Topology,
    slo: SloTargets,
    arrival_rate: Callable[[], float],
) -> Callable[[], PdOutcome]:
    """Advice at the demand measured when called: the best P/D split of the cluster's GPUs."""
    costs = pool_costs(profile)
    gpus = topology.gpus(profile.tp)

    def advise() -> PdOutcome:
        return poa_pd(pd_game(costs, slo, gpus, max(arrival_rate(), 1e-9)))

    return advise
