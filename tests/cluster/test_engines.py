"""The service's engines (cluster/engines.py): ``Service`` is given them, or picks those its
``backend`` names, and each changes only its own steps: the workers' spec, the router actor, the
request path. The live start of each runs in tests/integration and tests/dynamo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.dynamo.discovery import Discovery
from cluster.dynamo.service import DynamoEngines
from cluster.dynamo.shadow import ShadowRouterActor
from cluster.engines import SimEngines, engines_for
from cluster.ray.router_actor import RouterActor
from cluster.ray.worker_factory import WorkerSpec
from cluster.serve.config import ServeConfig
from cluster.service import Service

BASE_SPEC = WorkerSpec(
    profile="b200-llama70b-fp8-tp4", tp=4, speedup=1.0, epoch_wall=1.0, seed=0,
    nats_url="nats://127.0.0.1:4222", namespace="disagg",
)  # fmt: skip
BASE_ROUTER: dict[str, Any] = {
    "prefill_workers": [0], "decode_workers": [1, 2], "block_size": 16,
    "local_prefill_max_tokens": 512, "seed": 0, "nats_url": None, "namespace": "disagg",
}  # fmt: skip


def _dynamo_config(tmp: Path) -> ServeConfig:
    return ServeConfig.model_validate(
        {"backend": "dynamo", "topology": "1P/2D", "ledger_path": str(tmp / "ledger.sqlite")}
    )


def test_the_backend_names_the_engines_and_a_given_one_wins(tmp_path: Path) -> None:
    assert isinstance(engines_for(ServeConfig()), SimEngines)
    assert isinstance(Service(ServeConfig()).engines, SimEngines)
    config = _dynamo_config(tmp_path)
    assert isinstance(Service(config).engines, DynamoEngines)
    given = SimEngines()
    assert Service(ServeConfig(), engines=given).engines is given
    with pytest.raises(ValueError, match="backend 'dynamo' only"):
        DynamoEngines(ServeConfig())


def test_the_simulated_engines_change_nothing() -> None:
    engines = SimEngines()
    assert engines.worker_spec(BASE_SPEC) == BASE_SPEC
    cls, kwargs = engines.router_actor(BASE_ROUTER)
    assert cls is RouterActor and kwargs == BASE_ROUTER and kwargs is not BASE_ROUTER


def test_dynamos_engines_add_their_processes_and_their_router_and_clean_up(
    tmp_path: Path,
) -> None:
    config = _dynamo_config(tmp_path)
    engines = DynamoEngines(config)
    spec = engines.worker_spec(BASE_SPEC)
    assert spec.dynamo is not None and spec.model_copy(update={"dynamo": None}) == BASE_SPEC
    assert spec.dynamo.discovery.backend == "file"
    discovery = Path(spec.dynamo.discovery.location)
    assert discovery.is_dir() and Path(spec.dynamo.log_dir).is_dir()
    assert engines.worker_spec(BASE_SPEC).dynamo == spec.dynamo  # one folder per service
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
    spec = own.worker_spec(BASE_SPEC)
    assert spec.dynamo is not None and spec.dynamo.discovery.backend == "etcd"
    assert own.etcd is not None and spec.dynamo.discovery.location == own.etcd.url
    assert spec.dynamo.log_dir == str(tmp_path / "engine-logs")  # on each worker's node
    process = own.etcd.process
    assert process is not None and process.alive
    own.stop()
    assert own.etcd is None and not process.alive and own.discovery is None
    given = DynamoEngines(ServeConfig.model_validate(
        {**fields, "dynamo": {"discovery": "etcd", "etcd_endpoints": "http://etcd.ops:2379"}}
    ))  # fmt: skip
    spec = given.worker_spec(BASE_SPEC)
    assert spec.dynamo is not None and given.etcd is None
    assert spec.dynamo.discovery == Discovery.etcd("http://etcd.ops:2379")
    given.stop()
