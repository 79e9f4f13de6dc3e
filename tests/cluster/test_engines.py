"""The service's engines (each backend's ``Engines``, cluster/backends): ``Service`` is given
them, or picks those its ``backend`` names, and each changes only its own steps: the workers'
spec, the router actor, the request path. The live start of each runs in tests/integration
and tests/dynamo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.backends import engines_for
from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.service import DynamoEngines
from cluster.backends.dynamo.shadow import ShadowRouterActor
from cluster.backends.dynamo.worker_spec import DynamoWorkerSpec
from cluster.backends.sim import SimEngines
from cluster.config import ServeConfig
from cluster.ray.router_actor import RouterActor
from cluster.service import Service
from cluster.sim.profile import load_profile
from cluster.worker_spec import WorkerSpec

BASE_SPEC = WorkerSpec(
    profile="b200-llama70b-fp8-tp4", tp=4, speedup=1.0, epoch_wall=1.0, seed=0,
    nats_url="nats://127.0.0.1:4222", namespace="disagg",
)  # fmt: skip
BASE_ROUTER: dict[str, Any] = {
    "prefill_workers": [0], "decode_workers": [1, 2], "block_size": 16,
    "local_prefill_max_tokens": 512, "seed": 0, "nats_url": None, "namespace": "disagg",
}  # fmt: skip


def _own(spec: WorkerSpec) -> DynamoWorkerSpec:
    assert spec.engine.backend == "dynamo" and spec.engine.module == "cluster.backends.dynamo"
    return DynamoWorkerSpec.model_validate(spec.engine.settings)


def _dynamo_config(tmp: Path) -> ServeConfig:
    return ServeConfig.model_validate(
        {"backend": "dynamo", "topology": "1P/2D", "ledger_path": str(tmp / "ledger.sqlite")}
    )


def test_the_backend_names_the_engines_and_a_given_one_wins(tmp_path: Path) -> None:
    assert isinstance(engines_for(ServeConfig()), SimEngines)
    assert isinstance(Service(ServeConfig()).engines, SimEngines)
    config = _dynamo_config(tmp_path)
    assert isinstance(Service(config).engines, DynamoEngines)
    given = SimEngines(ServeConfig())
    assert Service(ServeConfig(), engines=given).engines is given
    with pytest.raises(ValueError, match="backend 'dynamo' only"):
        DynamoEngines(ServeConfig())


def test_the_simulated_engines_change_nothing_but_bound_the_routers_index() -> None:
    config = ServeConfig()
    engines = SimEngines(config)
    assert engines.worker_spec(BASE_SPEC) == BASE_SPEC
    cls, kwargs = engines.router_actor(BASE_ROUTER)
    profile = load_profile(config.profile)
    bound = profile.kv_index_bound(profile.block_size)  # twice a worker's KV cache, in blocks
    assert bound == 2 * profile.decode.kv_capacity_tokens // profile.block_size
    assert cls is RouterActor and kwargs == {**BASE_ROUTER, "max_blocks_per_worker": bound}


def test_dynamos_engines_add_their_processes_and_their_router_and_clean_up(
    tmp_path: Path,
) -> None:
    config = _dynamo_config(tmp_path)
    engines = DynamoEngines(config)
    spec = engines.worker_spec(BASE_SPEC)
    assert spec.model_copy(update={"engine": BASE_SPEC.engine}) == BASE_SPEC
    own = _own(spec)
    assert own.discovery.backend == "file"
    discovery = Path(own.discovery.location)
    assert discovery.is_dir() and Path(own.log_dir).is_dir()
    assert engines.worker_spec(BASE_SPEC).engine == spec.engine  # one folder per service
    cls, kwargs = engines.router_actor(BASE_ROUTER)
    assert cls is ShadowRouterActor and "local_prefill_max_tokens" not in kwargs
    assert kwargs["block_size"] == config.dynamo.block_size
    assert kwargs["components"] == {
        "prefill": config.dynamo.prefill_component, "decode": config.dynamo.decode_component
    }  # fmt: skip
    assert kwargs["instances"] is engines.instances  # filled in as the processes start
    engines.stop()
    assert not discovery.exists() and engines.discovery is None
    engines.stop()  # twice is fine


def test_dynamos_engines_start_an_etcd_for_discovery_across_hosts_unless_given_one(
    tmp_path: Path,
) -> None:
    fields = {"backend": "dynamo", "topology": "1P/2D", "ledger_path": str(tmp_path / "l.sqlite")}
    own = DynamoEngines(ServeConfig.model_validate(
        {**fields, "dynamo": {"discovery": "etcd", "log_dir": str(tmp_path / "engine-logs")}}
    ))  # fmt: skip
    spec = _own(own.worker_spec(BASE_SPEC))
    assert spec.discovery.backend == "etcd"
    assert own.etcd is not None and spec.discovery.location == own.etcd.url
    assert spec.log_dir == str(tmp_path / "engine-logs")  # on each worker's node
    process = own.etcd.process
    assert process is not None and process.alive
    own.stop()
    assert own.etcd is None and not process.alive and own.discovery is None
    given = DynamoEngines(ServeConfig.model_validate(
        {**fields, "dynamo": {"discovery": "etcd", "etcd_endpoints": "http://etcd.ops:2379"}}
    ))  # fmt: skip
    spec = _own(given.worker_spec(BASE_SPEC))
    assert given.etcd is None
    assert spec.discovery == Discovery.etcd("http://etcd.ops:2379")
    given.stop()
