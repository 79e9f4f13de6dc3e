"""Game 2 (KV placement as selfish caching): hand-solved instances, and the enumeration and
best-response dynamics against a naive reference written from the definitions."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from games.kv_placement import (
    KvInstance,
    Placement,
    access_costs,
    best_response,
    best_response_dynamics,
    equilibria,
    is_equilibrium,
    kv_instance,
    optimal_placement,
    poa_kv,
    social_cost,
    tiered_transfer,
    worker_costs,
)


def naive_cost(inst: KvInstance, placement: Placement, w: int) -> float:
    total = 0.0
    for k in range(inst.blocks):
        if k in placement[w]:
            continue
        sources = [inst.transfer[w, v] for v in range(inst.workers) if v != w and k in placement[v]]
        total += inst.demand[w, k] * min([inst.fallback[k], *sources])
    return total


def all_sets(blocks: int, cap: int) -> list[frozenset[int]]:
    return [
        frozenset(c)
        for size in range(min(cap, blocks) + 1)
        for c in itertools.combinations(range(blocks), size)
    ]


def naive_is_equilibrium(inst: KvInstance, placement: Placement) -> bool:
    for w in range(inst.workers):
        now = naive_cost(inst, placement, w)
        for S in all_sets(inst.blocks, int(inst.capacity[w])):
            other = (*placement[:w], S, *placement[w + 1 :])
            if naive_cost(inst, other, w) < now - 1e-9:
                return False
    return True


def naive_placements(inst: KvInstance) -> list[Placement]:
    options = [all_sets(inst.blocks, int(c)) for c in inst.capacity]
    return [tuple(p) for p in itertools.product(*options)]


def test_tiered_transfer_by_hand() -> None:
    t = tiered_transfer([0, 0, 1], nvlink=1.0, infiniband=4.0)
    assert t.tolist() == [[0.0, 1.0, 4.0], [1.0, 0.0, 4.0], [4.0, 4.0, 0.0]]


def test_costs_and_best_response_by_hand() -> None:
    # Workers 0, 1 on node 0 (NVLink 1), worker 2 on node 1 (InfiniBand 4); recompute 10,
    # a host tier at 6 caps the fallback for every block.
    t = tiered_transfer([0, 0, 1], 1.0, 4.0)
    inst = kv_instance([1, 1, 1], [[5, 2, 0], [1, 1, 1], [0, 3, 7]], t, 10.0, host=6.0)
    S: Placement = (frozenset({0}), frozenset(), frozenset({2}))
    a = access_costs(inst, S)
    assert a.tolist() == [[0, 6, 4], [1, 6, 4], [4, 6, 0]]
    assert worker_costs(inst, S).tolist() == [12.0, 11.0, 18.0]
    assert social_cost(inst, S) == 41.0
    # Worker 1's savings d·a = 1, 6, 4: it should take block 1.
    assert best_response(inst, S, 1) == frozenset({1})
    # Worker 2 keeps block 2 (saving 7·4 = 28 > 3·6 = 18).
    assert best_response(inst, S, 2) == frozenset({2})
    # Nothing to gain: a best response holds no block of zero saving.
    lone = kv_instance([2], [[1.0, 0.0]], [[0.0]], 3.0)
    assert best_response(lone, (frozenset(),), 0) == frozenset({0})


def test_complete_graph_with_skewed_demand_by_hand() -> None:
    # Two workers, one slot each, both need A 20 times and B 3 times; NVLink 1, recompute 5.
    # Both holding A: each pays 3·5 = 15, total 30; a switch to B would cost 20·1 = 20 > 15,
    # so this is an equilibrium (the only one). {A}, {B} costs 3·1 + 20·1 = 23: PoA_KV = 30/23.
    inst = kv_instance([1, 1], [[20, 3], [20, 3]], tiered_transfer([0, 0], 1.0, 1.0), 5.0)
    out = poa_kv(inst)
    assert out.optimum_cost == 23.0
    assert set(out.optimum) == {frozenset({0}), frozenset({1})}
    assert out.worst_equilibrium == (frozenset({0}), frozenset({0}))
    assert out.equilibria == 1
    assert out.poa == pytest.approx(30 / 23)
    assert out.pos == pytest.approx(30 / 23)
    # Best responses from empty caches reach the same equilibrium.
    assert out.dynamics.converged and out.dynamics.placement == (frozenset({0}), frozenset({0}))
    assert out.dynamics.cost == 30.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 2), min_size=1, max_size=3),
    st.integers(1, 4),
    st.integers(0, 4),
    st.integers(0, 5),
    st.data(),
)
def test_complete_graph_uniform_costs_has_poa_one(
    caps: list[int], blocks: int, t: int, extra: int, data: st.DataObject
) -> None:
    n = len(caps)
    uniform = np.full((n, n), float(t))
    # (a) demand uniform over blocks (d_wk = d_w > 0), recompute f = t + extra >= t.
    per_worker = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    d = np.repeat(np.array(per_worker, dtype=np.float64)[:, None], blocks, axis=1)
    assert poa_kv(kv_instance(caps, d, uniform, float(t + extra))).poa == pytest.approx(1.0)
    # (b) any demand, fallback no dearer than a transfer (host tier as near as a peer).
    skew = data.draw(st.lists(st.lists(st.integers(0, 9), min_size=blocks, max_size=blocks),
                              min_size=n, max_size=n))
    out = poa_kv(kv_instance(caps, skew, uniform + extra, float(t)))
    assert out.poa == pytest.approx(1.0)


instances = st.integers(1, 3).flatmap(
    lambda n: st.integers(1, 3).flatmap(
        lambda m: st.builds(
            kv_instance,
            st.lists(st.integers(0, 2), min_size=n, max_size=n),
            st.lists(st.lists(st.integers(0, 6), min_size=m, max_size=m), min_size=n, max_size=n),
            st.lists(st.lists(st.integers(0, 8), min_size=n, max_size=n), min_size=n, max_size=n),
            st.lists(st.integers(0, 10), min_size=m, max_size=m),
        )
    )
)


@settings(max_examples=60, deadline=None)
@given(instances)
def test_enumeration_matches_the_naive_reference(inst: KvInstance) -> None:
    placements = naive_placements(inst)
    costs = [sum(naive_cost(inst, p, w) for w in range(inst.workers)) for p in placements]
    stable = [naive_is_equilibrium(inst, p) for p in placements]
    opt, opt_cost = optimal_placement(inst)
    assert opt_cost == pytest.approx(min(costs))
    assert social_cost(inst, opt) == pytest.approx(opt_cost)
    found = equilibria(inst)
    expected = {p: c for p, c, s in zip(placements, costs, stable, strict=True) if s}
    assert {p for p, _ in found} == set(expected)
    assert all(c == pytest.approx(expected[p]) for p, c in found)
    # The optimum is no worse than any equilibrium.
    assert all(opt_cost <= c + 1e-9 for _, c in found)
    out = poa_kv(inst)
    if found:
        assert out.poa >= 1.0 and out.poa >= out.pos >= 1.0
        assert out.worst_cost == pytest.approx(max(c for _, c in found))
    else:
        assert math.isnan(out.poa) and out.worst_equilibrium is None


@settings(max_examples=60, deadline=None)
@given(instances)
def test_best_response_dynamics_stop_at_an_equilibrium(inst: KvInstance) -> None:
    out = best_response_dynamics(inst)
    if out.converged:
        assert naive_is_equilibrium(inst, out.placement)
        assert is_equilibrium(inst, out.placement)
    else:
        assert out.cycled  # deterministic rounds over finitely many placements
    if not equilibria(inst):
        assert not out.converged
    # Each best response is as good as any set within the capacity.
    S = out.placement
    for w in range(inst.workers):
        br = best_response(inst, S, w)
        trial = (*S[:w], br, *S[w + 1 :])
        best = min(
            naive_cost(inst, (*S[:w], T, *S[w + 1 :]), w)
            for T in all_sets(inst.blocks, int(inst.capacity[w]))
        )
        assert naive_cost(inst, trial, w) == pytest.approx(best)


def test_no_pure_equilibrium_cycles() -> None:
    # Asymmetric transfer costs: every placement gives some worker a better set.
    inst = kv_instance(
        [1, 1, 1],
        [[1, 1], [3, 3], [3, 3]],
        [[0, 2, 3], [3, 0, 2], [4, 5, 0]],
        5.0,
    )
    assert equilibria(inst) == []
    out = poa_kv(inst)
    assert out.equilibria == 0 and math.isnan(out.poa) and math.isnan(out.worst_cost)
    assert out.dynamics.cycled and not out.dynamics.converged
    capped = best_response_dynamics(inst, max_rounds=1)
    assert not capped.converged and not capped.cycled and capped.rounds == 1


def test_zero_cost_instance() -> None:
    inst = kv_instance([1, 0], [[0, 0], [0, 0]], tiered_transfer([0, 1], 1.0, 2.0), 3.0)
    out = poa_kv(inst)
    assert out.optimum_cost == 0.0 and out.poa == 1.0
    # Free transfers: worker 0 (no demand) could hold the block worker 1 lacks, making every
    # access free, but holding nothing is as good for it, so that equilibrium costs 3·9.
    inst = kv_instance([1, 1], [[0, 0], [3, 3]], [[0, 0], [0, 0]], 9.0)
    out = poa_kv(inst)
    assert (out.optimum_cost, out.worst_cost, out.poa) == (0.0, 27.0, math.inf)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([-1], [[1.0]], [[0.0]], 1.0), "capacity must be >= 0"),
        (([1.5], [[1.0]], [[0.0]], 1.0), "capacity must be 1 integers"),
        (([1, 1], [[1.0]], [[0.0]], 1.0), "capacity must be 1 integers"),
        (([1], [1.0], [[0.0]], 1.0), "workers × blocks"),
        (([1], [[-1.0]], [[0.0]], 1.0), "demand must be finite and >= 0"),
        (([1], [[1.0]], [[0.0, 1.0]], 1.0), "transfer must be 1 × 1"),
        (([1], [[1.0]], [[-1.0]], 1.0), "transfer costs must be >= 0"),
        (([1], [[1.0]], [[0.0]], -1.0), "recompute costs must be finite"),
    ],
)
def test_bad_instances(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kv_instance(*args)  # type: ignore[arg-type]


def test_bad_placements_and_limits() -> None:
    inst = kv_instance([1, 1], [[1, 1], [1, 1]], tiered_transfer([0, 0], 1.0, 1.0), 2.0)
    with pytest.raises(ValueError, match="capacity 1"):
        social_cost(inst, (frozenset({0, 1}), frozenset()))
    with pytest.raises(ValueError, match="unknown block"):
        social_cost(inst, (frozenset({5}), frozenset()))
    with pytest.raises(ValueError, match="one set per worker"):
        social_cost(inst, (frozenset(),))
    with pytest.raises(ValueError, match="exceed the enumeration limit"):
        poa_kv(inst, limit=5)
    with pytest.raises(ValueError, match="max_rounds"):
        best_response_dynamics(inst, max_rounds=0)
    with pytest.raises(ValueError, match="host cost"):
        kv_instance([1], [[1.0]], [[0.0]], 1.0, host=-1.0)
