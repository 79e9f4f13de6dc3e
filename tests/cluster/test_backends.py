"""The backends' registry (cluster/backends): a backend is one package and one registry entry.

The toy backend (tests/toy_backend) is registered here, from the tests, and reached the ways
the product reaches its own: the configuration accepts its name, the service's engines are its
own, and a worker spec carries it to whoever starts workers (tests/integration/
test_toy_backend.py starts them under Ray)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from cluster.backends import BACKENDS, backend_names, backend_plug, engines_for, register_backend
from cluster.backends.dynamo import PLUG as DYNAMO
from cluster.backends.sim import PLUG as SIM
from cluster.backends.sim import SimEngines
from cluster.config import ServeConfig
from cluster.worker_spec import EngineSpec, WorkerSpec, worker_plug
from tests import toy_backend

SPEC = WorkerSpec(
    profile="b200-llama70b-fp8-tp4", tp=4, speedup=2.0, epoch_wall=1.0, seed=3,
    nats_url=None, namespace="disagg",
)  # fmt: skip


@pytest.fixture
def toy() -> Iterator[None]:
    register_backend("toy", "tests.toy_backend")
    yield
    BACKENDS.pop("toy", None)


def test_the_product_registers_its_two_backends() -> None:
    assert backend_names()[:2] == ("sim", "dynamo")
    assert backend_plug("sim") is SIM and backend_plug("dynamo") is DYNAMO
    assert worker_plug(SPEC) is SIM  # a spec carries the simulated backend unless told


def test_an_unknown_backend_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValidationError) as info:
        ServeConfig.model_validate({"backend": "toy"})
    assert info.value.errors()[0]["loc"] == ("backend",)
    assert "unknown backend 'toy'; known: sim, dynamo" in str(info.value)
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        backend_plug("nope")


def test_a_module_without_a_plug_is_refused() -> None:
    register_backend("noplug", "tests.cluster")
    try:
        with pytest.raises(ValueError, match="is not its BackendPlug"):
            backend_plug("noplug")
        spec = SPEC.model_copy(update={"engine": EngineSpec(backend="x", module="tests")})
        with pytest.raises(ValueError, match="has no PLUG"):
            worker_plug(spec)
    finally:
        BACKENDS.pop("noplug")
    with pytest.raises(ValidationError, match="module"):
        register_backend("bad", "not a module path")


@pytest.mark.usefixtures("toy")
def test_a_third_backend_is_one_package_and_one_entry() -> None:
    config = ServeConfig(backend="toy")
    assert backend_plug("toy") is toy_backend.PLUG
    engines = engines_for(config)
    assert isinstance(engines, toy_backend.ToyEngines)
    spec = engines.worker_spec(SPEC)
    assert spec.engine == EngineSpec(
        backend="toy", module="tests.toy_backend", settings={"greeting": "hello"}
    )
    plug = worker_plug(spec)  # what the launcher and the controller actor do with a spec
    assert plug is toy_backend.PLUG
    assert plug.worker_class("decode") is toy_backend.ToyWorker
    assert plug.worker_arguments(spec, "decode", 4) == (("decode", 4), {"greeting": "hello"})
    assert plug.switch_warmup_s(spec, 30.0) == toy_backend.WARMUP_S


def test_the_simulated_backend_starts_its_engines_at_the_profiles_pace() -> None:
    from cluster.backends.sim.workers import DecodeWorkerActor, PrefillWorkerActor

    assert SIM.worker_class("prefill") is PrefillWorkerActor
    assert SIM.worker_class("decode") is DecodeWorkerActor
    args, kwargs = SIM.worker_arguments(SPEC, "decode", 2)
    assert args == (2, SPEC.profile) and kwargs["model_dir"] is None
    assert kwargs["seed"] == 3 * 7919 + 2  # per worker id: kept across a re-split
    assert "model_dir" not in SIM.worker_arguments(SPEC, "prefill", 0)[1]
    assert SIM.switch_warmup_s(SPEC, 30.0) == 15.0  # 30 virtual s at speed-up 2
    assert isinstance(SIM.engines(ServeConfig()), SimEngines)


def test_dynamo_workers_warm_up_for_real_and_take_their_settings_from_the_spec() -> None:
    assert DYNAMO.switch_warmup_s(SPEC, 30.0) == 0.0
    with pytest.raises(ValueError, match="not a Dynamo service"):
        DYNAMO.worker_arguments(SPEC, "decode", 1)
