"""Game 1 (P/D allocation): hand-solved instances, then properties of the profile model."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.sim.planning import pool_costs
from cluster.sim.profile import load_profile
from games.pd_allocation import (
    PoolCosts,
    SloTargets,
    best_splits,
    pd_game,
    poa_pd,
    slo_capacity,
    social_optimum,
    tabulate_game,
    variational_equilibrium,
)

# Hand-sized model: s_P = c = 0.1 s (μ_P = 10/s); ln(1/(1−q))/τ_T = 2, so κ_P = 8 per worker.
# Decode has e_D = 0, so κ_D is the batch cap B_D/(O·d0) = max_batch/1.
SLO = SloTargets(ttft_s=math.log(10) / 2, itl_s=0.05, attainment=0.9)


def hand_costs(max_batch: int) -> PoolCosts:
    return PoolCosts(
        tp=2, a_s=0.0, b_s_per_token=0.0, c_s_per_request=0.1, max_batch_tokens=1024,
        max_batch_requests=8, d0_s=0.01, d1_s_per_seq=0.0, d2_s_per_kv_token=0.0,
        max_batch=max_batch, kv_capacity_tokens=10**6, input_tokens=100, output_tokens=100,
    )


def test_slo_capacity_by_hand() -> None:
    cap = slo_capacity(hand_costs(32), SLO)
    assert cap.mu_prefill == pytest.approx(10.0)
    assert cap.prefill == pytest.approx(8.0)
    assert cap.decode == pytest.approx(32.0)
    # A full prefill iteration: B_P = min(4, 1024/100) = 4, so s_P = 0.04/4 + 1e-3·100 + 0.05.
    c = dataclasses.replace(hand_costs(32), a_s=0.04, b_s_per_token=1e-3, c_s_per_request=0.05,
                            max_batch_requests=4)
    assert c.s_prefill == pytest.approx(0.16)
    # Decode: e_D = d1 + d2·(I + O/2) = 1e-4 + 1e-6·150; ITL bound (1 − 0.01/0.05)/(e_D·100).
    c = dataclasses.replace(hand_costs(10**4), d1_s_per_seq=1e-4, d2_s_per_kv_token=1e-6)
    e = 1e-4 + 1e-6 * 150
    assert c.e_decode == pytest.approx(e)
    assert slo_capacity(c, SLO).decode == pytest.approx(0.8 / (e * 100))
    # KV capacity bounds the batch: two sequences of I + O = 200 tokens, κ_D = 2/(100·0.01).
    c = dataclasses.replace(hand_costs(32), kv_capacity_tokens=450)
    assert slo_capacity(c, SLO).decode == pytest.approx(2.0)
    # An ITL SLO below one empty iteration, or a TTFT SLO too tight for any load: capacity 0.
    assert slo_capacity(hand_costs(32), SloTargets(1.0, 0.005)).decode == 0.0
    assert slo_capacity(hand_costs(32), SloTargets(0.1, 0.05)).prefill == 0.0


def test_prefill_bound_overload_by_hand() -> None:
    # G = 16, TP = 2 (8 steps), λ = 100 exceeds every split: W = min(8·n_P, 32·n_D).
    # Optimum n_P = 6, n_D = 2: W = min(48, 64) = 48 (7/1 gives 32, 5/3 gives 40).
    # VE: prefill's own marginal is 8 per step (4 per GPU); decode's gain of one more step is 0
    # and its loss of one is 48 − 32 = 16 (8 per GPU), so the price 4 supports 6/2 and no other.
    out = poa_pd(pd_game(hand_costs(32), SLO, gpus=16, arrival_rate=100.0))
    assert (out.optimum.gpus_p, out.optimum.gpus_d) == (12, 4)
    assert out.optimum.welfare == pytest.approx(48.0)
    assert [(s.gpus_p, s.gpus_d) for s in out.equilibrium.splits] == [(12, 4)]
    assert out.equilibrium.gap == 0.0
    assert out.equilibrium.price == pytest.approx(4.0)
    assert out.poa == pytest.approx(1.0)


def test_decode_bound_overload_by_hand() -> None:
    # κ_D = 2: prefill's own goodput rises 8 per step, decode's only 2, so at equal marginal
    # utility per GPU prefill takes the whole box (7 steps) and decode keeps one worker: W = 2.
    # The optimum balances: n_P = 2, n_D = 6 gives min(16, 12) = 12. PoA_1 = 12/2 = 6.
    game = pd_game(hand_costs(2), SLO, gpus=16, arrival_rate=100.0)
    ve = variational_equilibrium(game)
    assert [(s.gpus_p, s.gpus_d) for s in ve.splits] == [(14, 2)]
    assert ve.gap == 0.0
    assert ve.price == pytest.approx(1.0)  # decode's gain per GPU of a second worker
    opt = social_optimum(game)
    assert (opt.gpus_p, opt.gpus_d) == (4, 12)
    assert opt.welfare == pytest.approx(12.0)
    assert poa_pd(game).poa == pytest.approx(6.0)


def test_low_load_serves_everything() -> None:
    out = poa_pd(pd_game(hand_costs(32), SLO, gpus=16, arrival_rate=5.0))
    assert out.poa == pytest.approx(1.0)
    assert out.optimum.welfare == pytest.approx(5.0)
    assert all(s.welfare == pytest.approx(5.0) for s in out.equilibrium.splits)
    # Zero load: nothing to serve, PoA 1 by convention, and the smallest split suffices.
    out = poa_pd(pd_game(hand_costs(32), SLO, gpus=16, arrival_rate=0.0))
    assert (out.poa, out.optimum.gpus_p, out.optimum.gpus_d) == (1.0, 2, 2)


def test_generic_game_with_an_externality_by_hand() -> None:
    # TP = 1, G = 4. U_P = G_P, U_D = min(G_P, G_D): decode serves what prefill passes on.
    # Equal marginals (price 1) hold at 2/2 and 3/1; end-to-end welfare U_D is 2 and 1.
    def served(p: int, d: int) -> float:
        return min(p, d)

    game = tabulate_game(1, 4, lambda p, d: p, served, welfare=served)
    ve = variational_equilibrium(game)
    assert sorted((s.gpus_p, s.gpus_d) for s in ve.splits) == [(2, 2), (3, 1)]
    assert (ve.worst.gpus_p, ve.worst.gpus_d, ve.price) == (3, 1, 1.0)
    out = poa_pd(game)
    assert (out.optimum.gpus_p, out.optimum.gpus_d) == (2, 2)
    assert out.poa == pytest.approx(2.0)
    # Welfare as the sum U_P + U_D scores both equilibria 4: the loss becomes invisible.
    summed = tabulate_game(1, 4, lambda p, d: p, served)
    assert poa_pd(summed).poa == pytest.approx(1.0)


def test_no_exact_equilibrium_reports_the_least_gap() -> None:
    # κ_P = 8, κ_D = 10 on 8 steps: decode's coverage condition misses every split by a little.
    game = pd_game(hand_costs(10), SLO, 16, 100.0)
    ve = variational_equilibrium(game)
    assert ve.gap > 0
    assert poa_pd(game).poa >= 1.0


concave_steps = st.lists(st.floats(-5, 20, allow_nan=False), min_size=7, max_size=7)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), concave_steps, concave_steps, st.sampled_from([1, 2, 4]))
def test_without_externality_every_equilibrium_is_optimal(
    steps: int, gains_p: list[float], gains_d: list[float], tp: int
) -> None:
    # Separable concave utilities and W = U_P + U_D: the first welfare theorem on the grid.
    mp = np.concatenate([[0.0], np.cumsum(sorted(gains_p, reverse=True))])
    md = np.concatenate([[0.0], np.cumsum(sorted(gains_d, reverse=True))])
    game = tabulate_game(tp, tp * steps, lambda p, d: mp[p // tp - 1], lambda p, d: md[d // tp - 1])
    out = poa_pd(game)
    assert out.equilibrium.gap == 0.0
    # Marginals within the solver's rounding tolerance (1e-9 of the scale) count as equal.
    optimum = pytest.approx(out.optimum.welfare, abs=1e-6)
    assert all(s.welfare == optimum for s in out.equilibrium.splits)


costs_st = st.builds(
    PoolCosts,
    tp=st.sampled_from([1, 2, 4, 8]),
    a_s=st.floats(0, 0.01),
    b_s_per_token=st.floats(0, 1e-4),
    c_s_per_request=st.floats(1e-3, 0.1),
    max_batch_tokens=st.sampled_from([2048, 8192]),
    max_batch_requests=st.sampled_from([8, 64]),
    d0_s=st.floats(2e-3, 0.03),
    d1_s_per_seq=st.floats(0, 1e-4),
    d2_s_per_kv_token=st.floats(0, 1e-7),
    max_batch=st.sampled_from([8, 64, 256]),
    kv_capacity_tokens=st.sampled_from([10**5, 10**6]),
    input_tokens=st.sampled_from([64, 128, 1024, 4096]),
    output_tokens=st.sampled_from([16, 256, 2048]),
)
slo_st = st.builds(SloTargets, st.floats(0.05, 2.0), st.floats(0.01, 0.1),
                   st.sampled_from([0.5, 0.9, 0.99]))


@settings(max_examples=80, deadline=None)
@given(costs_st, slo_st, st.integers(2, 12), st.floats(0, 3))
def test_optimum_dominates_equilibria(
    costs: PoolCosts, slo: SloTargets, steps: int, load: float
) -> None:
    cap = slo_capacity(costs, slo)
    lam = load * steps * max(cap.prefill, cap.decode, 1.0)
    gpus = steps * costs.tp
    out = poa_pd(pd_game(costs, slo, gpus, lam))
    # The optimum, by a loop over the splits straight from the formulas.
    best = max(
        min(lam, p * cap.prefill, d * cap.decode)
        for p in range(1, steps)
        for d in range(1, steps - p + 1)
    )
    assert out.optimum.welfare == pytest.approx(best)
    assert out.poa >= 1.0
    for s in (out.optimum, *out.equilibrium.splits):
        assert s.gpus_p % costs.tp == 0 and s.gpus_d % costs.tp == 0
        assert costs.tp <= s.gpus_p and costs.tp <= s.gpus_d and s.gpus_p + s.gpus_d <= gpus
        assert s.welfare <= out.optimum.welfare * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(costs_st, slo_st, st.integers(2, 12))
def test_overload_advice_is_the_balanced_split(
    costs: PoolCosts, slo: SloTargets, steps: int
) -> None:
    # Past every split's capacity the best split maximises min(n_P·κ_P, n_D·κ_D), whatever λ.
    cap = slo_capacity(costs, slo)
    beyond = (steps * (cap.prefill + cap.decode) + 1.0) * np.array([1.0, 2.0, 10.0])
    outs = best_splits(costs, slo, steps * costs.tp, list(beyond))
    assert len({(o.optimum.gpus_p, o.optimum.gpus_d) for o in outs}) == 1
    p, d = outs[0].optimum.gpus_p // costs.tp, outs[0].optimum.gpus_d // costs.tp
    assert min(p * cap.prefill, d * cap.decode) == pytest.approx(
        max(min(q * cap.prefill, (steps - q) * cap.decode) for q in range(1, steps))
    )


# -- pool_costs: a hardware profile as Game 1's pool costs (cluster.sim.planning) ----------------
# Checked against numbers worked out by hand from the profiles' YAML and against the figures the
# profiles were fitted to, not against a restatement of pool_costs' own field mapping.

LLAMA, NEMOTRON = "b200-llama70b-fp8-tp4", "b200-nemotron340b-fp8-tp8"
B200_SLO = SloTargets(ttft_s=0.5, itl_s=0.025)


def test_pool_costs_of_the_70b_profile_by_hand() -> None:
    costs = pool_costs(load_profile(LLAMA))
    assert costs.tp == 4
    # Prefill: B_P = min(64 requests, 8192 tokens / 128) = 64, and attention over the prompt
    # e·I·(0 + I/2) = 5.825e-10·128·64 = 4.7718e-6 s, so
    # s_P = 0.004/64 + 2e-5·128 + 4.7718e-6 + 0.0204 = 0.0230272718 s per request.
    assert costs.s_prefill == pytest.approx(0.0230272718)
    # Decode: e_D = d1 + d2·(I + O/2) = 1e-6 + 5e-9·(128 + 128) = 2.28e-6 s.
    assert costs.e_decode == pytest.approx(2.28e-6)
    cap = slo_capacity(costs, B200_SLO)
    # κ_P = 1/0.0230272718 − ln(10)/0.5.
    assert cap.prefill == pytest.approx(1 / 0.0230272718 - math.log(10) / 0.5, rel=1e-6)
    # κ_D = min(ITL: (1 − 0.0085/0.025)/(2.28e-6·256) = 1130.8,
    #           batch: B_D = min(256, 3e6 // 384) = 256 → 1/(0.0085 + 2.28e-6·256) = 110.0875).
    assert cap.decode == pytest.approx(1 / (0.0085 + 2.28e-6 * 256))


def test_pool_costs_of_the_340b_profile_by_hand() -> None:
    costs = pool_costs(load_profile(NEMOTRON))
    # s_P = 0 + 1e-5·128 + 7.864e-10·128·64 + 0.0555 = 0.0567864422 s (attention over the
    # prompt included); e_D = 5e-6 + 5e-9·256 = 6.28e-6 s.
    assert (costs.tp, costs.s_prefill, costs.e_decode) == (8, pytest.approx(0.0567864422),
                                                           pytest.approx(6.28e-6))
    cap = slo_capacity(costs, B200_SLO)
    assert cap.prefill == pytest.approx(1 / 0.0567864422 - math.log(10) / 0.5)  # ≈ 13.0 req/s
    # ITL bound (1 − 0.0222/0.025)/(6.28e-6·256) = 69.67 beats the batch bound 1/0.0238077 = 42.0.
    assert cap.decode == pytest.approx(1 / (0.0222 + 6.28e-6 * 256))


@pytest.mark.parametrize("name", [LLAMA, NEMOTRON])
def test_one_prefill_workers_rate_is_the_published_ceiling(name: str) -> None:
    # Both profiles were measured prefill-bound on one prefill worker (1P/xD), so the published
    # throughput ceiling is μ_P = 1/s_P within the calibration tolerance (15%).
    profile = load_profile(name)
    ceiling = max(
        float(point.value)  # type: ignore[arg-type]
        for point in profile.calibration
        if point.metric == "throughput_rps" and point.topology.startswith("1P/")
    )
    mu_prefill = slo_capacity(pool_costs(profile), B200_SLO).mu_prefill
    assert mu_prefill == pytest.approx(ceiling, rel=0.15)


def test_pool_costs_read_the_decode_workers_kv_cache_and_nothing_else() -> None:
    profile = load_profile(LLAMA)
    base = pool_costs(profile)
    # What Game 1 does not model leaves the pool costs alone: the prefill worker's KV cache,
    # jitter, the KV link.
    unmodelled = dataclasses.replace(
        profile,
        prefill=dataclasses.replace(profile.prefill, kv_capacity_tokens=1, jitter=0.5),
        decode=dataclasses.replace(profile.decode, jitter=0.5),
        link=dataclasses.replace(profile.link, bandwidth_gbps=1.0),
    )
    assert pool_costs(unmodelled) == base
    # A decode KV cache of 2·(I + O) + 1 tokens holds two sequences: κ_D = 2/(O·(d0 + 2·e_D)).
    small = dataclasses.replace(
        profile, decode=dataclasses.replace(profile.decode, kv_capacity_tokens=2 * 384 + 1)
    )
    expected = 2 / (256 * (0.0085 + 2 * 2.28e-6))
    assert slo_capacity(pool_costs(small), B200_SLO).decode == pytest.approx(expected)


def test_real_profiles_are_prefill_bound() -> None:
    # The B200 profiles: decode has ample capacity, so PoA_1 = 1 and, as λ grows, the best split
    # only ever moves GPUs to prefill, the bottleneck pool (docs/design.md §6: "saturation is
    # prefill-bound").
    for name in (LLAMA, NEMOTRON):
        costs = pool_costs(load_profile(name))
        cap = slo_capacity(costs, B200_SLO)
        assert cap.prefill < cap.decode
        outs = best_splits(costs, B200_SLO, 24, [1.0, 5.0, 10.0, 20.0, 40.0, 60.0, 100.0, 300.0])
        gp = [o.optimum.gpus_p for o in outs]
        assert gp == sorted(gp)
        assert all(o.poa == pytest.approx(1.0) for o in outs)
    # Nemotron at 18 req/s (its measured ceiling on 1P/2D) is advised 2P/1D: κ_P ≈ 13 req/s.
    (at_ceiling,) = best_splits(costs, B200_SLO, 24, [18.0])
    assert (at_ceiling.optimum.gpus_p, at_ceiling.optimum.gpus_d) == (16, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": 0}, "tp must be > 0"),
        ({"tp": True}, "tp must be an integer"),
        ({"a_s": "0"}, "a_s must be a number"),
        ({"c_s_per_request": -1.0}, "c_s_per_request must be finite and >= 0"),
        ({"d0_s": math.nan}, "d0_s"),
        ({"d0_s": 0.0}, "d0_s must be > 0"),
        ({"c_s_per_request": 0.0}, "a prefill request must take time"),
        ({"output_tokens": 0}, "output_tokens must be > 0"),
    ],
)
def test_bad_costs(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(hand_costs(32), **change)  # type: ignore[arg-type]


def test_bad_games() -> None:
    c = hand_costs(32)
    with pytest.raises(ValueError, match="does not divide"):
        pd_game(c, SLO, 15, 1.0)
    with pytest.raises(ValueError, match="cannot hold one prefill and one decode"):
        pd_game(c, SLO, 2, 1.0)
    with pytest.raises(ValueError, match="gpus must be a positive integer"):
        pd_game(c, SLO, 0, 1.0)
    with pytest.raises(ValueError, match="arrival_rate"):
        pd_game(c, SLO, 8, -1.0)
    with pytest.raises(ValueError, match="attainment"):
        SloTargets(1.0, 0.1, attainment=1.0)
    with pytest.raises(ValueError, match="ttft_s"):
        SloTargets(0.0, 0.1)
    with pytest.raises(ValueError, match="finite"):
        tabulate_game(1, 4, lambda p, d: math.inf, lambda p, d: 0.0)
