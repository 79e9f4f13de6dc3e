"""Router.decide: hand-computed decisions, argmin, softmax frequencies, policy, bookkeeping."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from router import (
    CandidateCost,
    Override,
    Policy,
    Router,
    block_hashes,
    sequence_hashes,
    softmax_probabilities,
)
from router.cost import MAX_OMEGA

PROMPT = list(range(20))  # five blocks of 4


def stored_prompt(worker: int, tokens: list[int], block_size: int = 4) -> dict[str, Any]:
    local = block_hashes(tokens, block_size)
    blocks = [
        {"block_hash": s, "tokens_hash": h}
        for s, h in zip(sequence_hashes(local), local, strict=True)
    ]
    return {"worker_id": worker, "data": {"stored": {"parent_hash": None, "blocks": blocks}}}


def hand_router(**kw: Any) -> Router:
    """Workers 1, 2, 3; 1 caches 4 blocks of PROMPT, 2 caches 2, 3 none; loads as below."""
    router = Router(block_size=4, **kw)
    for w in (3, 1, 2):
        router.add_worker(w)
    assert router.apply_event(stored_prompt(1, PROMPT[:16]))
    assert router.apply_event(stored_prompt(2, PROMPT[:8]))
    router.loads.report(1, active_prefill_tokens=40, active_decode_blocks=30)
    router.loads.report(2, active_prefill_tokens=0, active_decode_blocks=12)
    router.loads.report(3, active_prefill_tokens=0, active_decode_blocks=10)
    return router


def test_hand_computed_decision() -> None:
    # omega = 1, B = 4, |r| = 20:
    #   w1: overlap 4, u = 4,  prefill (40 + 4) / 4 = 11, cost 11 + 30 = 41
    #   w2: overlap 2, u = 12, prefill 12 / 4 = 3,        cost 3 + 12 = 15
    #   w3: overlap 0, u = 20, prefill 20 / 4 = 5,        cost 5 + 10 = 15
    # w2 and w3 tie; w3 caches fewer blocks (0 < 2), so w3 wins.
    router = hand_router()
    d = router.decide("r1", PROMPT)
    assert d.worker == 3
    assert d.workers == (1, 2, 3)
    assert d.overlap_blocks == (4, 2, 0)
    assert d.uncached_tokens == (4, 12, 20)
    assert d.prefill_blocks == (11.0, 3.0, 5.0)
    assert d.decode_blocks == (30, 12, 10)
    assert d.costs == (41.0, 15.0, 15.0)
    assert d.probabilities == (0.0, 0.0, 1.0) and d.softmax is None
    assert (d.tau, d.omega, d.policy_version, d.overridden) == (0.0, 1.0, 0, False)
    assert d.chosen == CandidateCost(3, 0, 20, 5.0, 10, 15.0, 1.0)
    assert d.candidates[0] == CandidateCost(1, 4, 4, 11.0, 30, 41.0, 0.0)
    assert d.prompt_tokens == 20 and d.block_size == 4

    # The decision reserved u = 20 prefill tokens and ceil(20 / 4) = 5 blocks on w3, so the
    # same prompt now costs (20 + 20) / 4 + 15 = 25 there and goes to w2 (15).
    assert router.loads.view(3).active_prefill_tokens == 20
    d2 = router.decide("r2", PROMPT)
    assert d2.costs == (41.0, 15.0, 25.0) and d2.worker == 2


@pytest.mark.parametrize(
    "override, worker, costs",
    [
        # omega = 2: w1 22 + 30 = 52, w2 6 + 12 = 18, w3 10 + 10 = 20.
        ({"omega": 2.0}, 2, (52.0, 18.0, 20.0)),
        # omega = 0.5 with Dynamo's field name: w1 35.5, w2 13.5, w3 12.5.
        ({"overlap_score_weight": 0.5}, 3, (35.5, 13.5, 12.5)),
        (Override(omega=2.0), 2, (52.0, 18.0, 20.0)),
    ],
)
def test_per_request_override_wins(override: Any, worker: int, costs: tuple[float, ...]) -> None:
    router = hand_router()
    d = router.decide("r", PROMPT, override, reserve=False)
    assert (d.worker, d.costs, d.overridden) == (worker, costs, True)
    assert router.policy == Policy()  # the default is untouched


def test_empty_overrides_and_dynamo_aliases() -> None:
    router = hand_router()
    empties: list[Override | dict[str, float] | None] = [None, {}, Override()]
    for empty in empties:
        assert not router.decide("r", PROMPT, empty, reserve=False).overridden
    d = router.decide(
        "r", PROMPT, {"prefill_load_scale": 2.0, "router_temperature": 0.0}, reserve=False
    )
    assert (d.omega, d.tau, d.worker) == (2.0, 0.0, 2)
    router.decide("r", PROMPT, {"omega": 1.0}, reserve=False)
    with pytest.raises(ValueError):
        router.decide("r", PROMPT, {"omega": True}, reserve=False)  # not the cached 1.0 entry
    with pytest.raises(ValueError):
        Override(tau=-0.5)


def test_set_policy_changes_the_default_and_its_version() -> None:
    router = hand_router()
    router.set_policy(Policy(tau=0.0, omega=2.0, version=7))
    d = router.decide("r", PROMPT, reserve=False)
    assert (d.worker, d.omega, d.policy_version) == (2, 2.0, 7)
    d = router.decide("s", PROMPT, {"tau": 0.3}, reserve=False)
    assert (d.tau, d.omega, d.policy_version, d.overridden) == (0.3, 2.0, 7, True)
    assert d.softmax is not None and d.probabilities == d.softmax


def test_caller_mistakes_raise_value_error() -> None:
    router = hand_router()
    with pytest.raises(ValueError):
        router.decide("r", [])
    with pytest.raises(ValueError):
        router.decide("r", PROMPT, {"temperature": 1.0})
    with pytest.raises(ValueError):
        router.decide("r", PROMPT, {"tau": -1.0})
    with pytest.raises(ValueError):
        router.set_policy(Policy(tau=0.5, omega=-1.0, version=1))
    with pytest.raises(ValueError):
        router.set_policy(Policy(tau=math.nan, omega=1.0, version=1))
    with pytest.raises(ValueError):
        Router().decide("r", PROMPT)  # no workers
    router.decide("r", PROMPT)
    with pytest.raises(ValueError):
        router.decide("r", PROMPT)  # still in flight
    router.complete("r")
    router.decide("r", PROMPT)


# -- tau = 0 picks the argmin ----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 60), st.integers(0, 20)), min_size=1, max_size=6
    ),
    st.integers(1, 20),
    st.floats(0, 4),
)
def test_tau_zero_picks_the_argmin(
    rows: list[tuple[int, int, int]], prompt_len: int, omega: float
) -> None:
    router = Router(block_size=4, policy=Policy(0.0, omega, 1))
    for w, (cached, prefill, decode) in enumerate(rows):
        router.add_worker(w)
        if cached:
            router.apply_event(stored_prompt(w, PROMPT[: 4 * cached]))
        router.loads.report(w, prefill, decode)
    tokens = PROMPT[:prompt_len]
    d = router.decide("r", tokens, reserve=False)
    overlap = router.index.overlap(tokens)
    costs = {
        w: omega * ((rows[w][1] + prompt_len - 4 * overlap[w]) / 4) + rows[w][2] for w in overlap
    }
    assert d.costs == tuple(costs[w] for w in d.workers)
    lowest = min(costs.values())
    ties = [w for w in costs if costs[w] == lowest]
    assert d.worker == min(ties, key=lambda w: (router.index.cached_blocks(w), w))


# -- tau > 0: seeded softmax -----------------------------------------------------------------


def softmax_router(tau: float, seed: int = 0) -> Router:
    router = Router(block_size=4, policy=Policy(tau, 1.0, 1), seed=seed)
    for w, decode in enumerate((10, 12, 16, 30)):
        router.add_worker(w)
        router.loads.report(w, 0, decode)
    return router


def frequencies(router: Router, n: int) -> np.ndarray:
    counts = np.zeros(len(router.workers))
    for i in range(n):
        counts[router.decide(f"r{i}", PROMPT, reserve=False).worker] += 1
    return counts


def test_softmax_frequencies_match_the_probabilities() -> None:
    router = softmax_router(tau=0.5)
    d = router.decide("probe", PROMPT, reserve=False)
    # Costs 5 + (10, 12, 16, 30) normalise to (0, 0.1, 0.3, 1).
    assert d.softmax == pytest.approx(softmax_probabilities(d.costs, 0.5))
    assert d.softmax == pytest.approx(
        np.exp(-np.array([0, 0.1, 0.3, 1.0]) / 0.5)
        / np.exp(-np.array([0, 0.1, 0.3, 1.0]) / 0.5).sum()
    )
    n = 6000
    observed = frequencies(router, n)
    assert chisquare(observed, n * np.array(d.softmax)).pvalue > 0.01


def test_tau_to_infinity_gives_uniform_frequencies() -> None:
    router = softmax_router(tau=1e9)
    assert router.decide("probe", PROMPT, reserve=False).softmax == pytest.approx([0.25] * 4)
    observed = frequencies(router, 4000)
    assert chisquare(observed).pvalue > 0.01


def test_seeded_decisions_are_reproducible() -> None:
    a, b, c = softmax_router(0.7, seed=5), softmax_router(0.7, seed=5), softmax_router(0.7, seed=6)
    runs = [
        [r.decide(f"x{i}", PROMPT, reserve=False).worker for i in range(300)] for r in (a, b, c)
    ]
    assert runs[0] == runs[1] != runs[2]


# -- bookkeeping -----------------------------------------------------------------------------


def test_decisions_reserve_and_completions_release_without_drift() -> None:
    rng = random.Random(3)
    router = hand_router(policy=Policy(0.4, 1.0, 1), seed=3)
    baseline = {w: router.loads.view(w) for w in router.workers}
    in_flight: list[str] = []
    for i in range(2000):
        if in_flight and rng.random() < 0.5:
            rid = in_flight.pop(rng.randrange(len(in_flight)))
            if rng.random() < 0.5:
                assert router.finish_prefill(rid)
            assert router.complete(rid)
            assert not router.complete(rid)  # a duplicate completion changes nothing
        else:
            tokens = PROMPT[: rng.randrange(1, 21)]
            d = router.decide(f"r{i}", tokens)
            res = router.loads.reservation(f"r{i}")
            assert res is not None and res.worker == d.worker
            assert res.prefill_tokens == d.chosen.uncached_tokens
            assert res.decode_blocks == math.ceil(len(tokens) / 4)
            in_flight.append(f"r{i}")
    for rid in in_flight:
        router.complete(rid)
    assert {w: router.loads.view(w) for w in router.workers} == baseline


def test_remove_worker_drops_index_and_load() -> None:
    router = hand_router()
    d = router.decide("r", PROMPT)
    router.remove_worker(d.worker)
    assert d.worker not in router.workers
    assert not router.complete("r")  # its reservation went with it
    assert router.decide("s", PROMPT).workers == router.workers
    assert not router.apply_event(stored_prompt(d.worker, PROMPT))


# -- bad input: always a ValueError naming what was wrong ------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"tau": [1]}, r"tau must be a number, got \[1\]"),  # was TypeError: unhashable list
        ({"tau": "0.5"}, "tau must be a number"),
        ({"router_temperature": None}, r"router_temperature \(tau\) must be a number"),
        ({"omega": True}, "omega must be a number, got True"),
        ({"overlap_score_weight": math.nan}, r"overlap_score_weight \(omega\) must be finite"),
        ({"prefill_load_scale": math.inf}, r"prefill_load_scale \(omega\) must be finite"),
        ({"omega": 2 * MAX_OMEGA}, "omega must be <= MAX_OMEGA"),
        ({"tau": -0.1}, "tau must be finite and >= 0"),
        ({"tau": 10**400}, "tau must be finite"),
        ({"temperature": 1.0}, "unknown override field 'temperature'; known: omega"),
        ({1: 0.5}, "unknown override field 1"),
        ({"tau": 0.1, "router_temperature": 0.2}, "override sets tau twice"),
        ({"omega": 1.0, "overlap_score_weight": 1.0}, "override sets omega twice"),
        ([("tau", 1.0)], "override must be a mapping or an Override"),
        ("tau", "override must be a mapping or an Override"),
    ],
)
def test_bad_overrides_raise_value_error_naming_the_key(override: Any, message: str) -> None:
    router = hand_router()
    with pytest.raises(ValueError, match=message):
        router.decide("r", PROMPT, override, reserve=False)
    if isinstance(override, dict):
        with pytest.raises(ValueError, match=message):
            Override.from_mapping(override)
    assert len(router.loads) == 0  # nothing was reserved


_junk = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=2),
    st.just(np.float32(0.25)),
    st.just(np.int64(2)),
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["tau", "omega", "router_temperature", "overlap_score_weight", "prefill_load_scale",
             "temperature", ""]
        ),
        _junk,
        max_size=3,
    )
)
def test_any_override_is_applied_or_refused_with_value_error(override: dict[str, Any]) -> None:
    router = hand_router()
    try:
        d = router.decide("r", PROMPT, override, reserve=False)
    except ValueError:
        return
    for key, value in override.items():
        field = "tau" if key in ("tau", "router_temperature") else "omega"
        assert getattr(d, field) == float(value) and type(getattr(d, field)) is float
        assert not isinstance(value, bool) and math.isfinite(float(value)) and float(value) >= 0
    assert all(math.isfinite(p) for p in d.probabilities)


@pytest.mark.parametrize(
    ("tau", "omega", "version", "message"),
    [
        ([1], 1.0, 1, "tau must be a number"),
        (0.5, True, 1, "omega must be a number"),
        (0.5, 2 * MAX_OMEGA, 1, "omega must be <= MAX_OMEGA"),
        (math.nan, 1.0, 1, "tau must be finite"),
        (0.5, 1.0, -1, "policy version must be an int >= 0"),
        (0.5, 1.0, True, "policy version must be an int"),
        (0.5, 1.0, 1.0, "policy version must be an int"),
    ],
)
def test_set_policy_refuses_bad_values(tau: Any, omega: Any, version: Any, message: str) -> None:
    router = hand_router()
    with pytest.raises(ValueError, match=message):
        router.set_policy(Policy(tau, omega, version))
    assert router.policy == Policy()  # the old policy stays
    with pytest.raises(ValueError, match="a policy is a"):
        router.set_policy((0.5, 1.0, 1))  # type: ignore[arg-type]  # the old tuple, refused
    with pytest.raises(ValueError, match="regime must be a short label"):
        Policy(0.5, 1.0, 1, "x" * 33)


def test_policies_and_overrides_store_floats() -> None:
    p = Policy(np.float32(0.5), np.int64(2), 3)  # type: ignore[arg-type]
    assert (p.tau, p.omega) == (0.5, 2.0) and type(p.tau) is float and type(p.omega) is float
    assert p == Policy(0.5, 2.0, 3)
    assert Override(omega=1).omega == 1.0 and type(Override(omega=1).omega) is float
    with pytest.raises(ValueError, match="tau must be a number"):
        Override(tau=[1])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Router(block_size=0), "block_size must be an int >= 1"),
        (lambda: Router(block_size=True), "block_size must be an int"),
        (lambda: Router(block_size=4.0), "block_size must be an int"),  # type: ignore[arg-type]
        (lambda: Router(seed="x"), "seed must be an int"),  # type: ignore[arg-type]
        (lambda: Router(seed=-1), "seed must be an int >= 0"),
        (lambda: Router(policy={"tau": 0.0}), "policy must be a router.Policy"),  # type: ignore[arg-type]
        (lambda: hand_router().decide(1, PROMPT), "request_id must be a non-empty str"),  # type: ignore[arg-type]
        (lambda: hand_router().decide("", PROMPT), "request_id must be a non-empty str"),
        (lambda: hand_router().decide("r", None), "tokens must be a sequence"),  # type: ignore[arg-type]
        (lambda: hand_router().decide("r", PROMPT, local_hashes=[1]), "local_hashes must be"),
    ],
)
def test_bad_router_arguments_raise_value_error(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_subnormal_tau_routes_to_the_argmin_instead_of_nan() -> None:
    # Normalising by (hi − lo)·tau first overflowed to inf, and 0·inf gave the cheapest worker a
    # NaN weight; the draw then found no worker with mass.
    router = hand_router(policy=Policy(5e-324, 1.0, 1))
    d = router.decide("r", PROMPT, reserve=False)
    assert d.softmax is not None and all(math.isfinite(p) for p in d.softmax)
    assert d.worker in (2, 3) and sum(d.softmax) == pytest.approx(1.0)
