"""Dynamo's discovery over etcd (cluster/backends/dynamo/discovery.py,
cluster/backends/dynamo/etcd_server.py): what lets
workers and routers on several hosts find each other (the multi-host rehearsal,
tests/integration/test_dynamo_cluster.py, runs it on three Ray nodes).

With a real etcd (Debian's ``etcd-server``, ``make etcd``):

- the etcd the service starts answers, and leaves no process or data behind when closed;
- a worker actor's mocker registers its instance in etcd, runs in a working directory of its
  own (removed at shutdown), and our in-process routers (``DynamoRoutes``) find it there; a
  SIGTERM deregisters it at once;
- a worker actor that Ray restarted (``restore``) starts a new process, registered under a new
  instance id; if its queued restore has not run, the first call that reaches it restores, and
  a first start that fails is retried by the watch.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.etcd_auth import ensure_etcd_credentials, etcd_credentials
from cluster.backends.dynamo.etcd_server import EtcdServer
from cluster.backends.dynamo.process import DynamoStartError
from cluster.backends.dynamo.routing import DynamoRoutes
from cluster.backends.dynamo.settings import DynamoSettings, dynamo_env
from cluster.backends.dynamo.worker_actor import DynamoWorkerActor
from cluster.nats_auth import credentials_directory
from tests.dynamo.conftest import pid_gone

pytestmark = pytest.mark.integration

SETTINGS: dict[str, Any] = {"num_gpu_blocks": 256, "discovery": "etcd"}


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    """The service's etcd as the service starts it: auth on, the `dynamo` user's password in
    the session's credentials directory, where every Dynamo process's environment finds it."""
    directory = credentials_directory()
    assert directory is not None  # tests/conftest.py names one for the session
    with EtcdServer(user=ensure_etcd_credentials(directory)) as server:
        yield server


def _token(url: str) -> dict[str, str]:
    user = etcd_credentials()
    if user is None:
        return {}
    login = httpx.post(f"{url}/v3/auth/authenticate", timeout=5.0,
                       json={"name": user.user, "password": user.password})  # fmt: skip
    token = login.json().get("token")  # none where auth is off
    return {} if token is None else {"Authorization": token}


def etcd_keys(url: str) -> list[str]:
    """Dynamo's keys (v1/…), read as the dynamo user."""
    prefix = {"key": base64.b64encode(b"v1/").decode(),
              "range_end": base64.b64encode(b"v10").decode(), "keys_only": True}  # fmt: skip
    body = httpx.post(f"{url}/v3/kv/range", json=prefix, headers=_token(url), timeout=5.0).json()
    assert "error" not in body, body
    return sorted(base64.b64decode(kv["key"]).decode() for kv in body.get("kvs", []))


def instances(url: str, component: str) -> set[int]:
    prefix = f"v1/instances/dynamo/{component}/generate/"
    return {int(k[len(prefix) :], 16) for k in etcd_keys(url) if k.startswith(prefix)}


def test_only_the_dynamo_user_writes_dynamos_keys(etcd: EtcdServer) -> None:
    """A fake instance from a client without the password is refused; the dynamo user writes
    Dynamo's keys (v1/) and nothing else; root's password is nowhere a Dynamo process looks."""
    key = base64.b64encode(b"v1/instances/dynamo/backend/generate/1234").decode()
    fake = {"key": key, "value": base64.b64encode(b'{"address": "evil:1"}').decode()}
    anonymous = httpx.post(f"{etcd.url}/v3/kv/put", json=fake, timeout=5.0)
    assert anonymous.status_code != 200 and "user name is empty" in anonymous.text
    wrong = httpx.post(f"{etcd.url}/v3/auth/authenticate", timeout=5.0,
                       json={"name": "dynamo", "password": "guess"})  # fmt: skip
    assert wrong.status_code != 200
    token = _token(etcd.url)
    assert httpx.post(f"{etcd.url}/v3/kv/put", json=fake, headers=token).status_code == 200
    elsewhere = {**fake, "key": base64.b64encode(b"disagg/anything").decode()}
    refused = httpx.post(f"{etcd.url}/v3/kv/put", json=elsewhere, headers=token, timeout=5.0)
    assert "permission denied" in refused.text
    grant = httpx.post(f"{etcd.url}/v3/auth/user/add", headers=token, timeout=5.0,
                       json={"name": "mine", "password": "x"})  # fmt: skip
    assert "permission denied" in grant.text  # not root
    env = dynamo_env(DynamoSettings(), nats_url="nats://127.0.0.1:4222",
                     discovery=Discovery.etcd(etcd.url), system_port=None)  # fmt: skip
    assert env["ETCD_AUTH_USERNAME"] == "dynamo" and "root" not in env.values()
    delete = {"key": key}
    httpx.post(f"{etcd.url}/v3/kv/deleterange", json=delete, headers=token, timeout=5.0)


def test_the_services_etcd_answers_and_leaves_nothing_behind() -> None:
    server = EtcdServer().start()
    process, data = server.process, server.data_dir
    assert process is not None and data is not None and process.pid is not None
    pid = process.pid
    assert httpx.get(f"{server.url}/health", timeout=5.0).json()["health"] == "true"
    assert etcd_keys(server.url) == []
    server.close()
    assert pid_gone(pid) and not data.exists()
    server.close()  # twice is fine


def test_a_worker_registers_in_etcd_in_its_own_directory_and_the_routers_find_it(
    etcd: EtcdServer, dynamo_nats_url: str, model_path: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    discovery = Discovery.etcd(etcd.url)
    settings = DynamoSettings.model_validate({**SETTINGS, "etcd_endpoints": etcd.url})

    def make(role: str, slot: int) -> DynamoWorkerActor:
        return DynamoWorkerActor(role, slot, settings.model_dump(), nats_url=dynamo_nats_url,
                                 discovery=discovery, log_dir=str(tmp_path / "logs"),
                                 model_path=model_path)  # fmt: skip

    prefill, decode = make("prefill", 0), make("decode", 1)
    routes = DynamoRoutes(settings, nats_url=dynamo_nats_url, discovery=discovery,
                          model_name=settings.model_name)  # fmt: skip
    for key in routes._env:  # DynamoRoutes sets them for this process: restored after the test
        monkeypatch.setenv(key, routes._env[key])

    async def scenario() -> tuple[Any, Any, list[int], list[int]]:
        first, second = await prefill.start(), await decode.start()
        await routes.start()
        try:
            probe = list(range(1, 17))
            return (
                first,
                second,
                await routes.workers("prefill", probe),
                await routes.workers("decode", probe),
            )
        finally:
            routes.close()

    try:
        first, second, seen_prefill, seen_decode = asyncio.run(scenario())
        assert instances(etcd.url, "prefill") == {first.instance_id} == set(seen_prefill)
        assert instances(etcd.url, "backend") == {second.instance_id} == set(seen_decode)
        # Each process in a working directory of its own, as on a host of its own.
        dirs = {w.work_dir for w in (prefill, decode)}
        assert None not in dirs and len(dirs) == 2
        # Beside the logs, so an actor killed outright leaves nothing in /tmp.
        assert {d.parent for d in dirs if d is not None} == {tmp_path / "logs"}
        for w in (prefill, decode):
            assert w.process is not None and w.process.pid is not None
            assert Path(f"/proc/{w.process.pid}/cwd").resolve() == w.work_dir
        work = [w.work_dir for w in (prefill, decode)]
    finally:
        asyncio.run(prefill.shutdown())
        asyncio.run(decode.shutdown())
    assert instances(etcd.url, "prefill") == instances(etcd.url, "backend") == set()  # SIGTERM
    assert not any(d is not None and d.exists() for d in work)


def test_a_restarted_worker_actor_serves_again_under_a_new_instance_id(
    etcd: EtcdServer, dynamo_nats_url: str, model_path: str, tmp_path: Path
) -> None:
    discovery = Discovery.etcd(etcd.url)
    settings = {**SETTINGS, "etcd_endpoints": etcd.url}

    def make() -> DynamoWorkerActor:
        return DynamoWorkerActor("decode", 2, settings, nats_url=dynamo_nats_url,
                                 discovery=discovery, log_dir=str(tmp_path / "logs"),
                                 model_path=model_path)  # fmt: skip

    first = make()
    before = asyncio.run(first.start())
    pid = first.process.pid if first.process else None
    # The actor's process dies (its node went): the watchdog takes the engine with it.
    assert first.process is not None
    first.process.kill()
    assert pid is not None and pid_gone(pid)
    second = make()  # what Ray constructs again; it queues restore() on itself
    try:
        after = asyncio.run(second.restore())
        assert after.instance_id is not None and after.instance_id != before.instance_id
        assert after.instance_id in instances(etcd.url, "backend")
    finally:
        asyncio.run(second.shutdown())
        asyncio.run(first.shutdown())


def test_a_restored_actor_whose_first_start_fails_keeps_trying(
    etcd: EtcdServer, dynamo_nats_url: str, model_path: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings = {**SETTINGS, "etcd_endpoints": etcd.url, "restart_backoff_s": 0.05}
    actor = DynamoWorkerActor("decode", 3, settings, nats_url=dynamo_nats_url,
                              discovery=Discovery.etcd(etcd.url),
                              log_dir=str(tmp_path / "logs"), model_path=model_path)  # fmt: skip
    # Ray restarted it, and the restore it queued itself has not run: the first poll restores.
    actor._restarted = True
    real, launches = actor._launch, []

    async def slow_cluster() -> None:  # the first start after a loss meets a loaded cluster
        launches.append(1)
        if len(launches) == 1:
            raise DynamoStartError("not ready within 60 s")
        await real()

    monkeypatch.setattr(actor, "_launch", slow_cluster)

    async def scenario() -> int | None:
        polled = await actor.info()
        assert not polled.alive and actor._restored
        for _ in range(600):  # a bound on hanging: the watch relaunches within a second
            if actor.process is not None and actor.process.alive and actor.instance_id:
                break
            await asyncio.sleep(0.1)
        return actor.instance_id

    try:
        instance = asyncio.run(scenario())
        assert len(launches) == 2 and instance in instances(etcd.url, "backend")
    finally:
        asyncio.run(actor.shutdown())


def test_the_charts_bootstrap_turns_auth_on_once_and_again(tmp_path: Path) -> None:
    """The chart's etcd sidecar: `python -m cluster.backends.dynamo.etcd_auth URL ROOT DIR` on a
    fresh etcd, then again at the pod's next start (auth already on), both succeeding."""
    import subprocess
    import sys

    (tmp_path / "etcd").mkdir()
    (tmp_path / "root-password").write_text("root-secret\n")
    (tmp_path / "etcd" / "password").write_text("dynamo-secret\n")
    with EtcdServer() as server:
        command = [sys.executable, "-m", "cluster.backends.dynamo.etcd_auth", server.url,
                   str(tmp_path / "root-password"), str(tmp_path)]  # fmt: skip
        for _ in range(2):
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert "authentication on" in done.stdout and "secret" not in done.stdout
        put = {"key": base64.b64encode(b"v1/instances/x").decode(), "value": ""}
        assert "user name is empty" in httpx.post(f"{server.url}/v3/kv/put", json=put).text
        login = httpx.post(f"{server.url}/v3/auth/authenticate",
                           json={"name": "dynamo", "password": "dynamo-secret"})  # fmt: skip
        assert "token" in login.json()
    bad = subprocess.run(command[:4], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "ROOT_PASSWORD_FILE" in bad.stderr
