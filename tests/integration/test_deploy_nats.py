"""The ``ray up`` head's nats-server, as deploy/ray/cluster.yaml starts it: credentials made by
``python -m cluster.nats_auth --generate``, the config by ``--server-config``, the real binary
started with ``-c``. An anonymous client is refused, a role is admitted with its permissions,
and nothing answers on the monitoring port."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from cluster.nats_auth import CREDENTIALS_ENV, connect_options
from cluster.nats_server import free_port, nats_server_binary

pytestmark = pytest.mark.integration


def _module(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "cluster.nats_auth", *args], capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    return out.stdout


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("head")
    credentials = root / "nats-credentials"
    _module("--generate", str(credentials))
    first = (credentials / "ingress" / "password").read_text()
    assert "kept" in _module("--generate", str(credentials))  # a re-run keeps them
    assert (credentials / "ingress" / "password").read_text() == first
    port = free_port()
    conf = _module("--server-config", str(credentials), str(root / "js"))
    conf = conf.replace('listen: "0.0.0.0:4222"', f'listen: "127.0.0.1:{port}"')
    (root / "nats.conf").write_text(conf)
    process = subprocess.Popen([nats_server_binary(), "-c", str(root / "nats.conf")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.1)
        yield f"nats://127.0.0.1:{port}", credentials
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_the_config_names_no_monitoring_port_and_opens_jetstream_in_the_store(
    head: tuple[str, Path],
) -> None:
    _, credentials = head
    conf = _module("--server-config", str(credentials), "/var/js")
    assert "http" not in conf and "monitor" not in conf
    assert 'store_dir: "/var/js"' in conf and "authorization {" in conf


def test_an_anonymous_client_is_refused_and_a_role_is_admitted_with_its_rights(
    head: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, credentials = head
    monkeypatch.setenv(CREDENTIALS_ENV, str(credentials))

    async def main() -> tuple[str, list[str]]:
        with pytest.raises(nats.errors.Error) as refused:
            await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0)
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        client = await nats.connect(url, allow_reconnect=False, error_cb=on_error,
                                    **connect_options("ingress"))  # fmt: skip
        await client.publish("disagg.x.regime", b"{}")  # the controller's subject
        await client.flush()
        await asyncio.sleep(0.3)
        await client.close()
        return str(refused.value).lower(), errors

    refusal, errors = asyncio.run(main())
    assert "authorization violation" in refusal
    assert any("permissions violation" in e and "disagg.x.regime" in e for e in errors)


def test_a_bad_invocation_prints_the_usage() -> None:
    out = subprocess.run([sys.executable, "-m", "cluster.nats_auth", "--bogus"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 2 and "--server-config" in out.stderr
