"""An etcd for Dynamo's discovery, started beside the service (docs/design.md §6 "Dynamo":
discovery across hosts; ``cluster/backends/dynamo/discovery.py``).

The service starts one when ``dynamo.discovery`` is ``etcd`` and ``dynamo.etcd_endpoints`` is not
set, as it starts NATS when ``nats_url`` is not: a one-member cluster with its data in a private
folder (removed at close), its client and peer ports free ports, on loopback or on the node's
address (``bind: node``, so workers on other hosts reach it). It runs under the same owner-death
watchdog as Dynamo's processes (``cluster.backends.dynamo.process.DynamoProcess`` runs any
command), so a
killed owner leaves no etcd behind. Ready when ``GET /health`` answers ``{"health": "true"}``.
Given a ``user``, it turns authentication on before it is handed out
(``cluster.backends.dynamo.etcd_auth``): root's password is made here and never leaves this
object, and ``user`` may write Dynamo's keys only.

The binary is Debian's ``etcd-server`` package (``make etcd``); a cluster runs its own etcd and
sets ``etcd_endpoints``.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

from cluster.backends.dynamo.discovery import LOOPBACK
from cluster.backends.dynamo.etcd_auth import enable_auth
from cluster.backends.dynamo.process import DynamoProcess, DynamoStartError
from cluster.nats_auth import Credentials
from cluster.nats_server import free_port

__all__ = ["ETCD_INSTALL_HINT", "EtcdServer", "etcd_binary"]

ETCD_INSTALL_HINT = "install Debian's etcd-server package (make etcd)"
READY_TIMEOUT_S = 30.0


def etcd_binary() -> str:
    """The ``etcd`` on PATH (``/usr/bin/etcd`` from Debian's package)."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found is None:
        raise FileNotFoundError(f"etcd not found: {ETCD_INSTALL_HINT}")
    return found


class EtcdServer:
    """One etcd member on ``host``; :meth:`start` returns once it answers."""

    def __init__(self, host: str = LOOPBACK, user: Credentials | None = None) -> None:
        self.host = host
        self.user = user
        self.client_port = free_port()
        self.peer_port = free_port()
        self.data_dir: Path | None = None
        self.process: DynamoProcess | None = None

    @property
    def url(self) -> str:
        """Its client URL: what ``ETCD_ENDPOINTS`` takes."""
        return f"http://{self.host}:{self.client_port}"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> EtcdServer:
        binary = etcd_binary()
        self.data_dir = Path(tempfile.mkdtemp(prefix="disagg-etcd-"))
        peer = f"http://{self.host}:{self.peer_port}"
        argv = [
            binary, "--name", "disagg", "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"disagg={peer}", "--initial-cluster-state", "new",
        ]  # fmt: skip
        self.process = DynamoProcess(argv, {}, self.data_dir / "etcd.log", None)
        try:
            self.process.start()
            self._wait_healthy(timeout_s)
            if self.user is not None:
                enable_auth(self.url, secrets.token_urlsafe(32), self.user)
        except BaseException:
            self.close()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                if not self.process.alive:
                    raise DynamoStartError(self.process.describe("exited before it was ready"))
                try:
                    if client.get(f"{self.url}/health").json().get("health") == "true":
                        return
                except (httpx.HTTPError, ValueError, AttributeError):
                    pass
                if time.monotonic() >= deadline:
                    raise DynamoStartError(
                        self.process.describe(f"not healthy within {timeout_s} s")
                    )
                time.sleep(0.05)

    def close(self) -> None:
        """Stop it and delete its data; safe to call twice."""
        if self.process is not None:
            self.process.stop(grace_s=5.0)
            self.process = None
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
