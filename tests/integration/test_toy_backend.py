"""A third backend under Ray (tests/toy_backend): the launcher the controller actor re-splits
with starts its workers through the registry, runs its ``after_start`` and stops them, with
nothing in ``cluster/`` naming it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import ray

from cluster.backends import BACKENDS, register_backend
from cluster.config import ServeConfig
from cluster.ray.launcher import RayLauncher
from cluster.worker_spec import WorkerSpec
from tests.toy_backend import ToyEngines

pytestmark = [pytest.mark.integration]


@pytest.fixture
def toy(ray_session: None) -> Iterator[None]:
    register_backend("toy", "tests.toy_backend")
    yield
    BACKENDS.pop("toy", None)


@pytest.mark.usefixtures("toy")
def test_the_launcher_starts_and_stops_a_toy_worker_through_the_registry() -> None:
    base = WorkerSpec(
        profile="b200-llama70b-fp8-tp4", tp=1, speedup=1.0, epoch_wall=1.0, seed=0,
        nats_url=None, namespace="toytest",
    )  # fmt: skip
    spec = ToyEngines(ServeConfig(backend="toy")).worker_spec(base)
    launcher = RayLauncher(spec, detached_service=False)

    async def run() -> dict[str, object]:
        handle = await launcher.start("decode", 9)
        said = await handle.toy.remote()
        assert launcher.find("decode", 9) is not None
        await launcher.stop("decode", 9, handle)
        return dict(said)

    said = asyncio.run(run())
    assert said == {"role": "decode", "worker_id": 9, "greeting": "hello", "started_by_plug": True}
    assert launcher.find("decode", 9) is None
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if "toytest" in str(a)]
