"""Fixtures for the Dynamo backend's tests: a session NATS server, a tiny model directory, a
fresh file-discovery directory per test, and the session's Ray (tests/integration/conftest.py).

Dynamo is REQUIRED here, never skipped: ``make test`` installs it (``make dynamo``), so a missing
install fails every test with the install command instead of passing silently. At the end of the
session no process may still run with this session's model directory in its command line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.install import require_dynamo
from cluster.backends.dynamo.settings import DynamoSettings, dynamo_env
from cluster.backends.dynamo.worker_actor import DynamoWorkerActor
from cluster.model_dir import build_model_dir
from cluster.nats_server import NatsServer
from tests.integration.conftest import ray_session

__all__ = ["ray_session"]


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line contains ``text`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


@pytest.fixture(autouse=True)
def _dynamo_required() -> None:
    require_dynamo()  # DynamoMissingError names `make dynamo`


@pytest.fixture(scope="session")
def dynamo_nats_url() -> Iterator[str]:
    with NatsServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(build_model_dir(tmp_path_factory.mktemp("dynamo-model") / "disagg-tiny"))
    yield path
    deadline = time.monotonic() + 15.0  # a bound on hanging: stops are synchronous already
    while (left := processes_mentioning(path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def discovery_dir(tmp_path: Path) -> str:
    path = tmp_path / "discovery"
    path.mkdir()
    return str(path)


WorkerFactory = Callable[[DynamoSettings, str, int], DynamoWorkerActor]


@pytest.fixture
def dynamo_worker(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> WorkerFactory:  # fmt: skip
    """``make(settings, role, slot)``: an unstarted worker actor, run here as a local object, on
    this test's NATS, discovery directory and model. This process joins the deployment too
    (the variables are restored after the test: ``DynamoRoutes`` sets them as well)."""
    env = dynamo_env(DynamoSettings(), nats_url=dynamo_nats_url,
                     discovery=Discovery.folder(discovery_dir), system_port=None)  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def make(settings: DynamoSettings, role: str, slot: int) -> DynamoWorkerActor:
        return DynamoWorkerActor(
            role, slot, settings.model_dump(), nats_url=dynamo_nats_url,
            discovery=Discovery.folder(discovery_dir), log_dir=str(tmp_path / "logs"),
            model_path=model_path,
        )  # fmt: skip

    return make
