"""One Ray session and one embedded NATS server per test session (docs/design.md §6 "Ray").

Ray starts lazily, the first time a test asks for ``ray_session``, so NATS-only runs stay fast.
Both are torn down at the end of the session; nothing is left running.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from cluster.nats_server import NatsServer

# Token auth is on by default in Ray 2.60; a private, loopback-only test session turns it off.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# Enough simulated accelerators for the largest topology a test deploys (1P/5D at TP = 4 plus
# spares for re-splits and retries).
TEST_ACCELERATORS = 48


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    from cluster.ray.runtime import init_ray

    started = init_ray(accelerators=TEST_ACCELERATORS, num_cpus=4)
    # A Ray that something else started in this process (Ray's API auto-initialises) lacks the
    # simulated accelerators and every deployment would wait for them forever: say so at once.
    have = ray.cluster_resources().get("B200", 0.0)
    assert have >= TEST_ACCELERATORS, f"this test session's Ray has {have} B200, not our own"
    yield
    try:
        from ray import serve

        serve.shutdown()
    except Exception:  # Serve may never have been started in this session
        pass
    if started.owned:
        ray.shutdown()
        if started.tmpdir:
            shutil.rmtree(started.tmpdir, ignore_errors=True)


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    with NatsServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def live_service(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One running ``cluster.service.Service`` (1P/2D, external NATS it may restart) shared by
    the ``test_service_*`` modules; see tests/integration/live_service.py. Stopped at the end."""
    from tests.integration.live_service import start_live_service

    live = start_live_service(tmp_path_factory.mktemp("live-service"))
    try:
        yield live
    finally:
        live.close()
