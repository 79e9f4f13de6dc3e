"""The whole-system run on the simulator (``cluster.sim.scenario``), on short phases: a ramp of
70B 1P/5D from C = 32 into saturation switches the router's regime, the per-phase table is
contiguous and complete, auctioned admission charges at most what users bid, and a seed fixes
the whole run."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from auction import prefill_slots_per_worker
from cluster.sim.admission import AuctionAdmission
from cluster.sim.control import TickSample
from cluster.sim.loadgen import Phase
from cluster.sim.profile import load_profile
from cluster.sim.scenario import (
    NamedPhase,
    ScenarioResult,
    calm_baseline_p99,
    phase_figures,
    run_scenario,
    template_source,
    unloaded_ttft,
)
from controller.detector import Regime, Thresholds
from controller.policy import PolicyTable, RegimePolicy

PROFILE, TOPOLOGY = "b200-llama70b-fp8-tp4", "1P/5D"
CALM_END = 10.0
# 35 simulated seconds: calm, a ramp across the knee (C ≈ 101), a saturated hold.
RAMP = (
    NamedPhase("calm", Phase(CALM_END, 32, ramp=2.0)),
    NamedPhase("ramp", Phase(15.0, 256, ramp=15.0)),
    NamedPhase("saturated", Phase(10.0, 256)),
)
BIDDERS = {"gold": 0.1, "silver": 0.1}
PHASE_KEYS = {
    "phase",
    "start_s",
    "end_s",
    "completed",
    "throughput_rps",
    "ttft_p99_s",
    "itl_p99_s",
    "poa_hat",
    "poa_routing",
    "poa_capacity",
    "cache_hit_rate",
    "prefill_workers",
    "decode_workers",
}


@pytest.fixture(scope="module")
def profile():
    return load_profile(PROFILE)


@pytest.fixture(scope="module")
def thresholds(profile) -> Thresholds:
    return Thresholds.calibrated(calm_baseline_p99(profile, TOPOLOGY, seconds=20.0))


@pytest.fixture(scope="module")
def ramp(profile, thresholds) -> tuple[ScenarioResult, AuctionAdmission, list[TickSample]]:
    """One adaptive run through the ramp with auctioned admission (about 1 s)."""
    per_worker = prefill_slots_per_worker(profile.prefill.max_batch_requests)
    admission = AuctionAdmission(slots_per_prefill_worker=per_worker)
    ticks: list[TickSample] = []
    result = run_scenario(
        profile,
        TOPOLOGY,
        RAMP,
        adaptive=True,
        thresholds=thresholds,
        seed=0,
        admission=admission,
        source=template_source(profile, 0, bidders=BIDDERS),
        on_tick=ticks.append,
    )
    return result, admission, ticks


def test_the_ramp_into_saturation_switches_the_regime(ramp, thresholds) -> None:
    result, _, _ = ramp
    assert result.adaptive and result.thresholds == thresholds
    changes = result.changes
    # Version 1 is the starting policy (below); then the regime only escalates through the ramp.
    assert changes[0].t == 0.0 and changes[0].regime == Regime.BELOW and changes[0].version == 1
    assert [c.version for c in changes] == list(range(1, len(changes) + 1))
    assert [c.regime for c in changes] == sorted(c.regime for c in changes)
    assert changes[-1].regime == Regime.SATURATED
    first = next(c for c in changes if c.regime > Regime.BELOW)
    assert first.t > CALM_END  # nothing fires while calm
    # Each change pushed the policy table's row for its regime.
    table = PolicyTable()
    for c in changes:
        assert (c.tau, c.omega) == (table[c.regime].tau, table[c.regime].omega)
    # The timeline agrees: below through the calm phase, saturated at the end, with its (τ, ω).
    assert all(s.regime == Regime.BELOW for s in result.timeline if s.t <= CALM_END)
    last = result.timeline[-1]
    assert last.regime == Regime.SATURATED and (last.tau, last.omega) == (0.8, 0.1)


def test_saturation_shows_in_the_phase_table(ramp) -> None:
    result, _, _ = ramp
    calm, ramp_row, hot = result.phases
    assert calm["ttft_p99_s"] < ramp_row["ttft_p99_s"] < hot["ttft_p99_s"]
    assert hot["throughput_rps"] > calm["throughput_rps"]
    assert hot["poa_hat"] > calm["poa_hat"]
    # Each phase's poa_hat is its ticks' mean.
    ticks = [s.poa_hat for s in result.timeline if CALM_END < s.t <= 25.0]
    assert ramp_row["poa_hat"] == pytest.approx(sum(ticks) / len(ticks), abs=1e-3)


def test_phase_table_is_contiguous_and_complete(ramp) -> None:
    result, _, _ = ramp
    assert [row["phase"] for row in result.phases] == [p.name for p in RAMP]
    start = 0.0
    for named, row in zip(RAMP, result.phases, strict=True):
        assert set(row) == PHASE_KEYS
        assert row["start_s"] == start and row["end_s"] == start + named.phase.duration
        assert row["completed"] > 0
        assert row["throughput_rps"] == pytest.approx(
            row["completed"] / named.phase.duration, abs=1e-3
        )
        assert 0.0 <= row["cache_hit_rate"] <= 1.0
        start = row["end_s"]
    finished = [r for r in result.records if r.finished is not None and r.finished < start]
    assert sum(row["completed"] for row in result.phases) == len(finished)


def test_one_tick_per_simulated_second_reported_to_on_tick(ramp) -> None:
    result, _, ticks = ramp
    total = sum(p.phase.duration for p in RAMP)
    assert ticks == result.timeline
    assert [s.t for s in result.timeline] == pytest.approx(
        [float(k) for k in range(1, int(total) + 1)]
    )
    for s in result.timeline:
        assert s.queue_depth >= 0 and s.in_flight >= 0
        for value in (s.poa_hat, s.poa_routing, s.poa_capacity):
            assert math.isfinite(value) and value > 0


def test_auctioned_admission_charges_at_most_the_bids(ramp) -> None:
    result, admission, _ = ramp
    assert admission.batches > 0 and admission.revenue > 0
    bids: dict[tuple[int, str], float] = defaultdict(float)
    paid: dict[tuple[int, str], float] = defaultdict(float)
    for r in result.records:
        assert r.payment >= 0
        if r.batch_id is None:
            assert r.payment == 0
            continue
        bids[r.batch_id, r.user] += r.bid
        paid[r.batch_id, r.user] += r.payment
    # VCG is individually rational: a user's payment for a batch is at most its value there,
    # which is at most the sum of its bids; anonymous traffic bids 0 and pays 0.
    for key, payment in paid.items():
        assert payment <= bids[key] + 1e-9, key
        if key[1] == "anonymous":
            assert payment == 0
    # Released requests carry their payment; batches still queued at the end were charged too.
    assert sum(paid.values()) <= admission.revenue + 1e-9
    assert sum(paid.values()) > 0
    assert {r.user for r in result.records} == {"anonymous", *BIDDERS}


def test_capacity_advice_when_saturation_is_capacity(ramp, profile) -> None:
    """Saturated with poa_capacity ≫ poa_routing: Game 1 advises a split of the same GPUs."""
    result, _, _ = ramp
    assert result.advice, "a sustained capacity-bound saturation should produce advice"
    gpus = 6 * profile.tp
    for advice in result.advice:
        assert advice.poa_capacity >= 2 * advice.poa_routing
        best = advice.recommendation.optimum
        assert best.gpus_p % profile.tp == 0 and best.gpus_d % profile.tp == 0
        assert profile.tp <= best.gpus_p and profile.tp <= best.gpus_d
        assert best.gpus_p + best.gpus_d <= gpus
        assert advice.recommendation.poa >= 1
        regime_at = max((c for c in result.changes if c.t <= advice.t), key=lambda c: c.t)
        assert regime_at.regime == Regime.SATURATED


def test_a_static_run_never_touches_the_router(profile) -> None:
    result = run_scenario(profile, TOPOLOGY, RAMP[:2], adaptive=False, seed=0)
    assert not result.adaptive and result.thresholds is None
    assert result.changes == [] and result.advice == []
    assert {(s.regime, s.tau, s.omega) for s in result.timeline} == {(0, 0.0, 1.0)}
    assert [row["phase"] for row in result.phases] == ["calm", "ramp"]
    assert {r.user for r in result.records} == {"anonymous"}


def test_same_seed_same_run_other_seed_other_run(profile, thresholds) -> None:
    phases = (NamedPhase("calm", Phase(4.0, 32, ramp=1.0)), NamedPhase("hot", Phase(6.0, 192)))

    def run(seed: int) -> ScenarioResult:
        return run_scenario(
            profile, TOPOLOGY, phases, adaptive=True, thresholds=thresholds, seed=seed
        )

    a, b, c = run(3), run(3), run(4)
    assert a.phases == b.phases and a.timeline == b.timeline and a.changes == b.changes

    def history(result: ScenarioResult) -> list[tuple[str, float, float | None]]:
        return [(r.request_id, r.arrival, r.finished) for r in result.records]

    assert history(a) == history(b)
    assert history(a) != history(c)


def test_adaptive_without_thresholds_calibrates_them_from_a_calm_run(profile) -> None:
    phases = (NamedPhase("calm", Phase(3.0, 8)),)
    result = run_scenario(profile, TOPOLOGY, phases, adaptive=True, seed=0)
    expected = Thresholds.calibrated(calm_baseline_p99(profile, TOPOLOGY, seed=0))
    assert result.thresholds == expected


def test_a_custom_policy_table_reaches_the_router(profile) -> None:
    table = PolicyTable(below=RegimePolicy(0.3, 2.0))
    phases = (NamedPhase("calm", Phase(3.0, 8)),)
    result = run_scenario(
        profile,
        TOPOLOGY,
        phases,
        adaptive=True,
        thresholds=Thresholds(1.0, 2.0),
        seed=0,
        table=table,
    )
    assert [(c.tau, c.omega) for c in result.changes] == [(0.3, 2.0)]
    assert {(s.tau, s.omega) for s in result.timeline} == {(0.3, 2.0)}


def test_calm_baseline_is_deterministic_and_grows_with_concurrency(profile) -> None:
    low = calm_baseline_p99(profile, TOPOLOGY, concurrency=4, seconds=15.0)
    mid = calm_baseline_p99(profile, TOPOLOGY, concurrency=32, seconds=15.0)
    high = calm_baseline_p99(profile, TOPOLOGY, concurrency=96, seconds=15.0)
    assert 0 < low < mid < high and math.isfinite(high)
    assert calm_baseline_p99(profile, TOPOLOGY, concurrency=32, seconds=15.0) == mid


def test_unloaded_ttft_is_what_a_lone_request_sees(profile) -> None:
    """One client at a time: every TTFT is the profile's unloaded TTFT up to jitter."""
    base = unloaded_ttft(profile)
    assert 0 < base < 1
    result = run_scenario(profile, TOPOLOGY, [NamedPhase("one", Phase(8.0, 1))], adaptive=False)
    ttfts = [r.ttft for r in result.records if r.ttft is not None]
    assert len(ttfts) >= 3
    assert all(0.8 * base <= t <= 1.5 * base for t in ttfts)


def test_template_source_follows_the_profile_and_the_seed(profile) -> None:
    w = profile.workload
    plain = template_source(profile, 0)
    requests = [plain() for _ in range(50)]
    assert {r.user for r in requests} == {"anonymous"} and {r.bid for r in requests} == {0.0}
    assert {len(r.tokens) for r in requests} == {w.input_tokens}
    assert {r.output_tokens for r in requests} == {w.output_tokens}
    heads = {tuple(r.tokens[: w.template_tokens]) for r in requests}
    assert len(heads) <= w.templates

    again = template_source(profile, 0)
    assert all((r.tokens == again().tokens).all() for r in requests)
    other = template_source(profile, 1)
    assert any((r.tokens != other().tokens).any() for r in requests)

    bidding = template_source(profile, 0, bidders={"gold": 0.5})
    mixed = [bidding() for _ in range(200)]
    gold = [r for r in mixed if r.user == "gold"]
    assert 50 < len(gold) < 150
    assert all(r.bid >= 1.0 for r in gold)  # 1 + Pareto
    assert all(r.bid == 0.0 for r in mixed if r.user == "anonymous")


def test_phase_figures_of_an_empty_window() -> None:
    row = phase_figures("idle", 0.0, 5.0, [], [])
    assert row["phase"] == "idle" and row["completed"] == 0 and row["throughput_rps"] == 0
    assert math.isnan(row["ttft_p99_s"]) and math.isnan(row["poa_hat"])
    assert row["cache_hit_rate"] == 0.0
    assert row["prefill_workers"] is None and row["decode_workers"] is None


def test_phase_pools_are_time_averages_counting_warm_ups_in_neither_pool() -> None:
    def tick(t: float, prefill: int, decode: int) -> TickSample:
        return TickSample(t=t, regime=0, tau=0.0, omega=1.0, ttft_p99_window_s=None,
                          ttft_p99_smoothed_s=None, poa_hat=1.0, poa_routing=1.0,
                          poa_capacity=1.0, queue_depth=0, in_flight=0, prefill_workers=prefill,
                          decode_workers=decode, arrival_rate=0.0)  # fmt: skip

    # 1P/5D for 2 ticks, a decode worker draining and warming up for 4 (1P/4D), then 2P/4D.
    timeline = [tick(t, 1, 5) for t in (1, 2)] + [tick(t, 1, 4) for t in (3, 4, 5, 6)]
    timeline += [tick(t, 2, 4) for t in (7, 8)]
    row = phase_figures("spike", 0.0, 8.0, [], timeline)
    assert (row["prefill_workers"], row["decode_workers"]) == (1.25, 4.25)
