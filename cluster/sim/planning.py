"""Game 1 as planner advice for a simulated (or real) cluster: a hardware profile's cost models as
``games.PoolCosts``, an advisor the controller calls when saturation is capacity-bound, and the
same advice in workers for the re-split lever (``controller.resplit``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cluster.sim.cluster import Topology
from cluster.sim.profile import HardwareProfile
from controller.resplit import Pools
from controller.traffic import TrafficShape
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
        e_s_per_token_pair=p.e_s_per_token_pair,
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
    (best split at λ, in workers of ``profile.tp`` GPUs), the SLO capacity of a split,
    κ(P, D) = min(P·κ_P, D·κ_D) (``games.pd_allocation.slo_capacity``), and the prefill pool's
    service rate in prompt tokens/s. Each takes the window's traffic shape (mean prompt and
    output, cache reuse); without one, the profile's workload."""

    def __init__(self, profile: HardwareProfile, topology: Topology, slo: SloTargets) -> None:
        self.costs = pool_costs(profile)
        self.tp = profile.tp
        self.gpus = topology.gpus(profile.tp)
        self.slo = slo
        self.rates = slo_capacity(self.costs, slo)
        self._shaped: dict[tuple[int, int, int], PoolCosts] = {}

    def costs_for(self, shape: TrafficShape | None) -> PoolCosts:
        """The profile's cost model at the window's shape (token counts rounded: a token is the
        model's grain, and rounding keeps the cache of shapes small)."""
        if shape is None:
            return self.costs
        prompt = max(1, round(shape.prompt_tokens))
        key = (
            prompt,
            max(1, round(shape.output_tokens)),
            min(prompt - 1, round(prompt * shape.reuse)),
        )
        costs = self._shaped.get(key)
        if costs is None:
            if len(self._shaped) > 4096:  # bounded: a long run meets many shapes
                self._shaped.clear()
            costs = replace(
                self.costs, input_tokens=key[0], output_tokens=key[1], cached_tokens=key[2]
            )
            self._shaped[key] = costs
        return costs

    def outcome(self, arrival_rate: float, shape: TrafficShape | None = None) -> PdOutcome:
        """Game 1 at λ: PoA_1, the best split (in GPUs) and the equilibria."""
        game = pd_game(self.costs_for(shape), self.slo, self.gpus, max(arrival_rate, 1e-9))
        return poa_pd(game)

    def best_split(self, arrival_rate: float, shape: TrafficShape | None = None) -> Pools:
        best = self.outcome(arrival_rate, shape).optimum
        return Pools(best.gpus_p // self.tp, best.gpus_d // self.tp)

    def capacity(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        rates = self.rates if shape is None else slo_capacity(self.costs_for(shape), self.slo)
        return min(pools.prefill * rates.prefill, pools.decode * rates.decode)

    def prefill_rate(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        """μ: prompt tokens/s the prefill pool computes at full batches, P·I'/s_P."""
        costs = self.costs_for(shape)
        return pools.prefilling * costs.new_tokens / costs.s_prefill
