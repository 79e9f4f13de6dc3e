"""Real Dynamo mocker processes: readiness, instance ids, restarts, and nothing left behind."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.process import DynamoProcess, DynamoStartError, child_environment
from cluster.backends.dynamo.settings import (
    DynamoSettings,
    dynamo_env,
    free_system_port,
    worker_command,
)
from cluster.backends.dynamo.worker_actor import DynamoWorkerActor
from tests.dynamo.conftest import pid_gone
from tests.waiting import until

pytestmark = pytest.mark.integration

SETTINGS: dict[str, Any] = {"num_gpu_blocks": 256, "restart_backoff_s": 0.05,
                            "startup_timeout_s": 60.0}
READY_S = 60.0  # bounds on hanging, not timing assertions: a mocker is ready in about 2 s


def instances(discovery_dir: str, component: str) -> set[int]:
    """The instance ids registered for ``component``'s generate endpoint in file discovery."""
    folder = Path(discovery_dir) / "v1" / "instances"
    prefix = f"dynamo%2F{component}%2Fgenerate%2F"
    if not folder.is_dir():
        return set()
    return {int(p.name[len(prefix):], 16) for p in folder.iterdir() if p.name.startswith(prefix)}


class FakeRouter:
    """Records ``bind_instance.remote(role, slot, instance_id)`` as a Ray handle would take it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.bind_instance = self

    def remote(self, role: str, slot: int, instance_id: int) -> None:
        self.calls.append((role, slot, instance_id))


def worker(role: str, slot: int, nats: str, discovery: str, tmp: Path, model: str,
           **extra: Any) -> DynamoWorkerActor:
    return DynamoWorkerActor(role, slot, {**SETTINGS, **extra}, nats_url=nats,
                             discovery=Discovery.folder(discovery), log_dir=str(tmp / "logs"),
                             model_path=model)


def test_a_mocker_becomes_ready_with_the_instance_id_discovery_holds(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    settings = DynamoSettings.model_validate(SETTINGS)
    port = free_system_port()
    env = dynamo_env(settings, nats_url=dynamo_nats_url, discovery=Discovery.folder(discovery_dir),
                     system_port=port)
    process = DynamoProcess(worker_command(settings, "prefill", model_path), env,
                            tmp_path / "prefill.log", port, component="prefill")

    async def scenario() -> tuple[int, dict[str, Any]]:
        process.start()
        iid = await process.wait_ready(READY_S)
        return iid, await process.health()

    try:
        iid, health = asyncio.run(scenario())
        assert instances(discovery_dir, "prefill") == {iid}
        assert health["endpoints"]["generate"] == "ready"
        assert asyncio.run(process.instance_id("prefill")) == iid
        assert process.alive and process.pid is not None and process.returncode is None
        assert "dynamo" in Path(f"/proc/{process.pid}/cmdline").read_text()
        # Its temporary files beside its log, not in /tmp; removed with it.
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert f"TMPDIR={tmp_path / 'prefill.tmp'}".encode() in environ
        pid = process.pid
    finally:
        process.stop()
    assert pid_gone(pid) and not process.alive and process.exited
    assert not (tmp_path / "prefill.tmp").exists()
    assert instances(discovery_dir, "prefill") == set()  # SIGTERM: deregistered at once
    assert (tmp_path / "prefill.log").stat().st_size > 0
    process.stop()  # idempotent


def test_a_process_that_exits_early_fails_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
    process = DynamoProcess(argv, {}, tmp_path / "bad.log", free_system_port(), component="prefill")
    process.start()
    with pytest.raises(DynamoStartError, match="boom: bad flag"):
        asyncio.run(process.wait_ready(READY_S))
    assert process.returncode == 3


def test_a_killed_worker_restarts_with_a_new_id_and_tells_the_router(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    actor = worker("prefill", 0, dynamo_nats_url, discovery_dir, tmp_path, model_path)
    router = FakeRouter()
    actor.attach(router)

    async def scenario() -> None:
        try:
            first = await actor.start()
            assert first.restarts == 0 and first.role == "prefill" and first.slot == 0
            assert router.calls == [("prefill", 0, first.instance_id)]
            assert (await actor.load()).inflight == 0.0
            assert (await actor.info()).alive
            killed = await actor.kill_engine()
            assert killed == first.pid and pid_gone(killed)
            await until(lambda: len(router.calls) == 2, READY_S, 0.05, "a rebinding")
            second = await actor.ready()
            assert second.restarts == 1 and second.pid != killed
            assert second.instance_id not in (None, first.instance_id)
            assert router.calls[1] == ("prefill", 0, second.instance_id)
            assert second.instance_id in instances(discovery_dir, "prefill")
            assert "dynamo_component" in await actor.metrics_text()
        finally:
            await actor.shutdown()
        assert actor.process is not None and not actor.process.alive
        assert actor.restarts == 1  # the shutdown was not taken for a crash
        await actor.shutdown()  # idempotent
        assert await actor.metrics_text() == ""

    asyncio.run(scenario())
    log = Path(actor.log_path).read_text()
    assert log.count("--- start") == 2  # one log per worker, appended across restarts


def test_a_drained_worker_deregisters_and_is_not_restarted(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    actor = worker("decode", 3, dynamo_nats_url, discovery_dir, tmp_path, model_path)

    async def scenario() -> None:
        try:
            info = await actor.start()
            assert instances(discovery_dir, "backend") == {info.instance_id}
            assert await actor.drain(timeout_s=30.0)
            assert instances(discovery_dir, "backend") == set()
            assert actor.restarts == 0 and not (await actor.info()).alive
        finally:
            await actor.shutdown()

    asyncio.run(scenario())


def test_the_ray_actor_rebinds_a_real_router_actor_after_a_kill(
    ray_session: None, dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    import ray

    class Router:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int, int]] = []

        def bind_instance(self, role: str, slot: int, instance_id: int) -> None:
            self.calls.append((role, slot, instance_id))

        def seen(self) -> list[tuple[str, int, int]]:
            return self.calls

    router = ray.remote(num_cpus=0)(Router).remote()
    actor = ray.remote(num_cpus=0)(DynamoWorkerActor).remote(
        "decode", 1, SETTINGS, nats_url=dynamo_nats_url, discovery=Discovery.folder(discovery_dir),
        log_dir=str(tmp_path / "logs"), model_path=model_path)
    try:
        ray.get(actor.attach.remote(router))
        first = ray.get(actor.start.remote(), timeout=READY_S)
        assert ray.get(router.seen.remote()) == [("decode", 1, first.instance_id)]
        ray.get(actor.kill_engine.remote())
        deadline = time.monotonic() + READY_S
        while len(calls := ray.get(router.seen.remote())) < 2:
            assert time.monotonic() < deadline, "no rebinding"
            time.sleep(0.05)
        assert calls[1][2] != first.instance_id
        assert calls[1][2] in instances(discovery_dir, "backend")
    finally:
        ray.get(actor.shutdown.remote(), timeout=60)
        ray.kill(actor)
        ray.kill(router)


OWNER = textwrap.dedent("""
    import json, sys, time
    from cluster.backends.dynamo.process import DynamoProcess
    spec = json.loads(sys.argv[1])
    p = DynamoProcess(spec["argv"], spec["env"], spec["log"], spec["port"]).start()
    print(p.pid, p.watchdog_pid, flush=True)
    time.sleep(600)
""")


def test_a_sigkilled_owner_takes_its_dynamo_process_along(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    settings = DynamoSettings.model_validate(SETTINGS)
    port = free_system_port()
    spec = {"argv": worker_command(settings, "prefill", model_path), "port": port,
            "env": dynamo_env(settings, nats_url=dynamo_nats_url,
                              discovery=Discovery.folder(discovery_dir), system_port=port),
            "log": str(tmp_path / "orphan.log")}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, json.dumps(spec)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        mocker_pid, watchdog_pid = map(int, owner.stdout.readline().split())
        assert not pid_gone(mocker_pid)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 15.0
        while not (pid_gone(mocker_pid) and pid_gone(watchdog_pid)):
            assert time.monotonic() < deadline, f"mocker {mocker_pid} outlived its owner"
            time.sleep(0.05)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_dynamos_own_frontend_serves_a_chat_through_the_workers(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    import httpx

    from cluster.backends.dynamo.frontend import DynamoFrontend

    settings = DynamoSettings.model_validate(SETTINGS)
    workers = [worker(role, 0, dynamo_nats_url, discovery_dir, tmp_path, model_path)
               for role in ("prefill", "decode")]
    frontend = DynamoFrontend(settings, nats_url=dynamo_nats_url,
                              discovery=Discovery.folder(discovery_dir),
                              log_path=tmp_path / "frontend.log")

    async def scenario() -> dict[str, Any]:
        try:
            for w in workers:
                await w.start()
            with frontend:
                await asyncio.to_thread(frontend.wait_ready_sync, READY_S)
                await frontend.wait_ready(READY_S)  # the async form, for callers with a loop
                return await chat()
        finally:
            for w in workers:
                await w.shutdown()

    async def chat() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
            response = await client.post(f"{frontend.url}/chat/completions", json={
                "model": settings.model_name, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Hello there."}]})
        assert response.status_code == 200, response.text
        return dict(response.json())

    body = asyncio.run(scenario())
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] >= 1
    assert not frontend.process.alive


def test_a_taken_system_port_fails_fast_instead_of_trusting_a_stranger(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    # Dynamo logs "System status server startup failed" and runs on without a system port; a
    # /health on that port would be answered by whoever holds it.
    import socket

    settings = DynamoSettings.model_validate(SETTINGS)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_system_port()))
        holder.listen()
        port = holder.getsockname()[1]
        env = dynamo_env(settings, nats_url=dynamo_nats_url,
                         discovery=Discovery.folder(discovery_dir), system_port=port)
        process = DynamoProcess(worker_command(settings, "decode", model_path), env,
                                tmp_path / "taken.log", port, component="backend")
        process.start()
        try:
            with pytest.raises(DynamoStartError, match=f"system port {port} taken"):
                asyncio.run(process.wait_ready(READY_S))
        finally:
            process.stop()
    assert process.port_taken() and not process.alive


def test_a_process_that_never_gets_ready_is_killed_at_the_deadline(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    process = DynamoProcess(argv, {}, tmp_path / "slow.log", free_system_port(), component="x")
    process.start()
    pid = process.pid
    assert pid is not None and process.watchdog_pid is not None
    with pytest.raises(DynamoStartError, match="not ready within"):
        asyncio.run(process.wait_ready(0.3))
    assert pid_gone(pid) and process.exited
    assert asyncio.run(process.health()) == {} and asyncio.run(process.metrics_text()) == ""


def test_a_worker_out_of_restarts_stays_down_and_a_failing_router_is_only_logged(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    actor = worker("prefill", 5, dynamo_nats_url, discovery_dir, tmp_path, model_path,
                   max_restarts=0)

    class BrokenRouter:
        class bind_instance:  # noqa: N801 - a Ray handle's method attribute
            @staticmethod
            async def remote(role: str, slot: int, instance_id: int) -> None:
                raise ConnectionError("router restarting")

    actor.attach(BrokenRouter())

    async def scenario() -> None:
        try:
            info = await actor.start()  # the router's failure does not fail the start
            assert info.instance_id is not None
            await actor.kill_engine()
            await until(lambda: actor.failed is not None, READY_S, 0.05, "giving up")
            state = await actor.info()
            assert not state.alive and state.restarts == 0
            assert "restarts exhausted" in state.failed
            with pytest.raises(RuntimeError, match="no running process"):
                await actor.kill_engine()
        finally:
            await actor.shutdown()

    asyncio.run(scenario())


def test_a_worker_retries_on_another_port_when_its_system_port_is_taken(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from cluster.backends.dynamo import worker_actor

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_system_port()))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = iter([taken, free_system_port()])
        monkeypatch.setattr(worker_actor, "free_system_port", lambda: next(ports))
        actor = worker("decode", 7, dynamo_nats_url, discovery_dir, tmp_path, model_path)

        async def scenario() -> dict[str, Any]:
            try:
                return await actor.start()
            finally:
                await actor.shutdown()

        info = asyncio.run(scenario())
    assert info.system_port != taken and info.instance_id is not None
    assert Path(actor.log_path).read_text().count("--- start") == 2


def test_a_hung_worker_fails_its_health_checks_and_is_restarted(
    dynamo_nats_url: str, discovery_dir: str, model_path: str, tmp_path: Path
) -> None:
    # SIGSTOP: the process is alive and answers nothing, as a deadlocked engine would.
    actor = worker("decode", 4, dynamo_nats_url, discovery_dir, tmp_path, model_path,
                   health_period_s=0.2, health_failures=2)  # fmt: skip
    router = FakeRouter()
    actor.attach(router)

    async def scenario() -> None:
        try:
            first = await actor.start()
            await asyncio.sleep(1.0)  # several healthy checks: nothing happens
            assert (await actor.ready()).hung_kills == 0
            os.kill(first.pid, signal.SIGSTOP)
            await until(lambda: len(router.calls) == 2, READY_S, 0.05, "a restart after a hang")
            second = await actor.ready()
            assert second.hung_kills == 1 and second.restarts == 1
            assert second.instance_id != first.instance_id and pid_gone(first.pid)
        finally:
            await actor.shutdown()

    asyncio.run(scenario())


def test_an_engine_process_inherits_no_secret_but_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[21] 5: the bus's credentials folder, the ledger's password and anything named as a
    secret stay in the owner; the process gets what its own ``env`` gives it (the ``dynamo``
    role's NATS credentials, for an engine)."""
    for name, value in {"DISAGG_NATS_CREDENTIALS": "/run/creds", "PGPASSWORD": "pg",
                        "HF_TOKEN": "hf", "AWS_SECRET_ACCESS_KEY": "aws",
                        "VLLM_KEEP_ME": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assert child_environment({"A_PASSWORD": "x", "PATH": "/bin"}, {"B_PASSWORD": "y"}) == {
        "PATH": "/bin", "B_PASSWORD": "y"}  # fmt: skip
    show = "import os, sys; print('ENV', sorted(os.environ)); sys.exit(3)"
    process = DynamoProcess([sys.executable, "-c", show], {"NATS_AUTH_PASSWORD": "dyn"},
                            tmp_path / "env.log", free_system_port(), component="x")  # fmt: skip
    process.start()
    with pytest.raises(DynamoStartError):
        asyncio.run(process.wait_ready(READY_S))
    log = (tmp_path / "env.log").read_text().splitlines()
    (line,) = [ln for ln in log if ln.startswith("ENV ")]
    names = set(ast.literal_eval(line.split("ENV", 1)[1].strip()))
    assert "VLLM_KEEP_ME" in names and "NATS_AUTH_PASSWORD" in names
    assert not names & {"DISAGG_NATS_CREDENTIALS", "PGPASSWORD", "HF_TOKEN",
                        "AWS_SECRET_ACCESS_KEY"}  # fmt: skip
