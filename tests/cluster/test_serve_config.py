"""``ServeConfig``'s derived admission bound: what each prefill worker may hold released
without a first token when the auction's ``max_in_prefill`` is left to the deployment."""

from __future__ import annotations

from cluster.backends.dynamo.settings import DynamoSettings
from cluster.config import ServeConfig
from cluster.sim.profile import load_profile
from controller.resplit import Pools


def test_two_prefill_iterations_per_worker_from_the_engine_that_serves() -> None:
    sim = ServeConfig(profile="b200-llama70b-fp8-tp4")
    batch = load_profile("b200-llama70b-fp8-tp4").prefill.max_batch_requests
    assert sim.prefill_slots_per_worker() == 2 * batch == 128
    mocker = ServeConfig(backend="dynamo", topology="1P/2D")
    assert mocker.prefill_slots_per_worker() == 512  # the engines' default --max-num-seqs 256
    capped = ServeConfig(backend="dynamo", topology="1P/2D", dynamo=DynamoSettings(max_num_seqs=8))
    assert capped.prefill_slots_per_worker() == 16


def test_without_a_prefill_pool_the_decode_workers_prefill() -> None:
    assert Pools(2, 4).prefilling == 2
    assert Pools(0, 3).prefilling == 3
