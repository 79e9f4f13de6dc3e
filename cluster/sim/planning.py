"""Game 1 as planner advice for a simulated (or real) cluster: a hardware profile's cost models as
``games.PoolCosts``, an advisor the controller calls when saturation is capacity-bound, and the
same advice in workers for the re-split lever (``controller.resplit``)."""

from __future__ import annotations

from collections.abc import Callable

from cluster.sim.cluster import Topology
from cluster.sim.profile import HardwareProfile
from controller.resplit import Pools
from games.pd_allocation import PdOutcome, PoolCosts, SloTargets, pd_game, poa_pd, slo_capacity


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
    planner = GameOnePlanner(profile, topology, slo)
    return lambda: planner.outcome(arrival_rate())


class GameOnePlanner:
    """``controller.resplit.SplitPlanner`` from a hardware profile: Game 1 on the cluster's GPUs
    (best split at λ, in workers of ``profile.tp`` GPUs) and the SLO capacity of a split,
    κ(P, D) = min(P·κ_P, D·κ_D) (``games.pd_allocation.slo_capacity``)."""

    def __init__(self, profile: HardwareProfile, topology: Topology, slo: SloTargets) -> None:
        self.costs = pool_costs(profile)
        self.tp = profile.tp
        self.gpus = topology.gpus(profile.tp)
        self.slo = slo
        self.rates = slo_capacity(self.costs, slo)

    def outcome(self, arrival_rate: float) -> PdOutcome:
        """Game 1 at λ: PoA_1, the best split (in GPUs) and the equilibria."""
        return poa_pd(pd_game(self.costs, self.slo, self.gpus, max(arrival_rate, 1e-9)))

    def best_split(self, arrival_rate: float) -> Pools:
        best = self.outcome(arrival_rate).optimum
        return Pools(best.gpus_p // self.tp, best.gpus_d // self.tp)

    def capacity(self, pools: Pools) -> float:
        return min(pools.prefill * self.rates.prefill, pools.decode * self.rates.decode)
