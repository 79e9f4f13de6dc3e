"""Prefill attention (docs/design.md §6): a chunk of k new tokens after c computed ones costs
a + b·k + e·k·(c + k/2) + c_r per request, an iteration summing its chunks; each profile states e
derived from its architecture and GPUs, and at the calibration workload the term is negligible."""

from __future__ import annotations

import pytest

from cluster.sim.calibration import attention_s_per_token_pair
from cluster.sim.prefill import PrefillJob, PrefillWorker
from cluster.sim.profile import PrefillModel, attention_pairs, available_profiles, load_profile

BLOCK = 16


def model(**overrides: float) -> PrefillModel:
    values = dict(
        a_s=0.001,
        b_s_per_token=1e-5,
        c_s_per_request=0.002,
        jitter=0.0,
        max_batch_tokens=1000,
        max_batch_requests=8,
        kv_capacity_tokens=100_000,
        e_s_per_token_pair=1e-8,
    )
    return PrefillModel(**{**values, **overrides})  # type: ignore[arg-type]


def job(request_id: str, tokens: int, first_hash: int) -> PrefillJob:
    hashes = list(range(first_hash, first_hash + tokens // BLOCK))
    return PrefillJob(request_id, tokens, hashes, hashes)


def test_cost_formula_on_hand_numbers() -> None:
    assert attention_pairs(4, 2) == 4 * (2 + 2)
    assert attention_pairs(7, 0) == 24.5  # causal: a fresh chunk sees half of itself on average
    m = model()
    # a + b·(100 + 10) + e·(100·(50 + 50) + 10·(0 + 5)) + 2·c_r
    expected = 0.001 + 1e-5 * 110 + 1e-8 * (10_000 + 50) + 2 * 0.002
    assert m.iteration_s([(100, 50), (10, 0)]) == pytest.approx(expected, rel=1e-12)
    assert m.iteration_s([]) == 0.001  # only the fixed cost (the worker never plans this)
    # Hand-built records without e keep the linear model.
    linear = PrefillModel(0.001, 1e-5, 0.002, 0.0, 1000, 8, 100_000)
    assert linear.iteration_s([(100, 50)]) == pytest.approx(0.001 + 1e-3 + 0.002)


@pytest.mark.parametrize("name", available_profiles())
def test_a_long_context_costs_measurably_more_than_linear(name: str) -> None:
    """4k tokens from scratch pay ≥ 4% over the linear cost; 128 tokens, under 0.2%."""
    m = load_profile(name).prefill

    def over_linear(tokens: int, cached: int) -> float:
        new = tokens - cached
        base = m.a_s + m.b_s_per_token * new + m.c_s_per_request
        return m.iteration_s([(new, cached)]) / base - 1

    assert over_linear(4096, 0) > 0.04
    assert over_linear(32768, 0) > 8 * over_linear(4096, 0)  # superlinear: 8x tokens, >8x share
    assert 0 < over_linear(128, 64) < 0.002  # the calibration workload (64-token templates)


def test_chunking_pays_attention_against_everything_before_each_chunk() -> None:
    """A prompt split over iterations pays, in each, for its cached prefix and its own earlier
    chunks: the pairs sum to the single-pass k·(c + k/2), only a and c_r repeat per iteration."""
    m = model(max_batch_tokens=1024, e_s_per_token_pair=1e-9)
    worker = PrefillWorker(0, m, BLOCK)
    worker.submit(job("long", 4096, 1), 0.0)
    durations = []
    now = 0.0
    while (d := worker.start_iteration(now)) is not None:
        durations.append(d)
        now += d
        worker.finish_iteration(now)
    assert len(durations) == 4
    for i, d in enumerate(durations):  # chunk i: 1024 new after 1024·i
        assert d == pytest.approx(m.iteration_s([(1024, 1024 * i)]), rel=1e-12)
    one_pass = m.iteration_s([(4095, 1)])  # ignoring the last-token rule, for scale
    assert sum(durations) == pytest.approx(one_pass + 3 * (m.a_s + m.c_s_per_request), rel=1e-3)


def test_iteration_time_of_a_mixed_batch_follows_the_formula() -> None:
    """A cached prefix, a fresh prompt and a continuing chunk, each with its own c."""
    m = model()
    worker = PrefillWorker(0, m, BLOCK)
    worker.submit(job("warm", 64, 1), 0.0)  # leaves blocks 1..4 in the cache
    d0 = worker.start_iteration(0.0)
    assert d0 == pytest.approx(0.001 + 1e-5 * 64 + 1e-8 * 64 * 32 + 0.002)
    worker.finish_iteration(1.0)

    shared = PrefillJob("shared", 640, list(range(1, 41)), list(range(1, 41)))  # 64 cached
    worker.submit(shared, 1.0)
    worker.submit(job("fresh", 1200, 1000), 1.0)
    d1 = worker.start_iteration(1.0)
    # shared: 576 new after 64 cached; fresh: 424 new (the 1000-token budget's rest) after 0
    pairs = 576 * (64 + 288) + 424 * (0 + 212)
    assert pairs == 292_640
    assert d1 == pytest.approx(0.001 + 1e-5 * 1000 + 1e-8 * pairs + 2 * 0.002, rel=1e-12)
    assert d1 == pytest.approx(0.0179264, rel=1e-12)
    (done,) = worker.finish_iteration(2.0)
    assert done.request_id == "shared" and shared.cached_tokens == 64

    d2 = worker.start_iteration(2.0)  # fresh continues: 776 new after its own 424
    assert d2 == pytest.approx(0.001 + 1e-5 * 776 + 1e-8 * 776 * (424 + 388) + 0.002, rel=1e-12)
    assert d2 == pytest.approx(0.01706112, rel=1e-12)


# Peak dense BF16 FLOP/s per GPU (vendor datasheets) and the MFU each profile's comment states.
PEAK_BF16 = {"B200": 2.25e15, "H100-80GB": 0.99e15}
MFU = 0.5


# The dynamo-mocker profile times no model (Dynamo's polynomial has no architecture behind
# it); every hardware profile derives e from the model it serves.
HARDWARE = [name for name in available_profiles() if name != "dynamo-mocker"]


def test_only_the_mocker_profile_has_no_architecture() -> None:
    assert load_profile("dynamo-mocker").architecture is None
    assert load_profile("dynamo-mocker").prefill.e_s_per_token_pair == 0


@pytest.mark.parametrize("name", HARDWARE)
def test_each_profiles_e_is_derived_from_its_architecture(name: str) -> None:
    """e = 4 · layers · heads · head_dim / (tp · peak · MFU), as the YAML comment states."""
    profile = load_profile(name)
    assert profile.architecture is not None
    derived = attention_s_per_token_pair(
        profile.architecture, profile.tp, PEAK_BF16[profile.gpu], MFU
    )
    assert profile.prefill.e_s_per_token_pair == pytest.approx(derived, rel=1e-3)


def test_the_derivation_on_hand_numbers() -> None:
    arch = load_profile("b200-llama70b-fp8-tp4").architecture
    assert arch is not None and arch.attention_flops_per_pair == 4 * 80 * 64 * 128
    assert attention_s_per_token_pair(arch, 4, 2.25e15, 0.5) == pytest.approx(2_621_440 / 4.5e15)
    with pytest.raises(ValueError, match="mfu"):
        attention_s_per_token_pair(arch, 4, 2.25e15, 0.0)


def test_a_prompt_prefilled_on_its_decode_worker_pays_attention_too() -> None:
    """With no prefill pool (h100-32b's 0P/1D) every prompt is prefilled in a decode iteration:
    the iteration adds e·k·(c + k/2) beside the per-token cost, c the tokens the cache held."""
    from cluster.sim.decode import DecodeSeq, DecodeWorker
    from cluster.sim.profile import DecodeModel

    decode = DecodeModel(
        d0_s=0.01,
        d1_s_per_seq=0.0,
        d2_s_per_kv_token=0.0,
        jitter=0.0,
        max_batch=8,
        kv_capacity_tokens=100_000,
        local_prefill_max_tokens=16,
        local_prefill_s_per_token=1e-5,
    )
    durations = []
    for e in (0.0, 1e-8):
        worker = DecodeWorker(0, decode, BLOCK, seed=0, attention_s_per_token_pair=e)
        hashes = list(range(4096 // BLOCK))
        worker.submit(DecodeSeq("r", 4096, 4, hashes, hashes, prefill_locally=True), 0.0)
        durations.append(worker.start_iteration(0.0))
    linear, with_attention = durations
    assert linear == pytest.approx(0.01 + 1e-5 * 4096)
    assert with_attention == pytest.approx(linear + 1e-8 * 4096 * 4096 / 2)
