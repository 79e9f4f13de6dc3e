"""The embedded nats-server dies with its owner and leaves no store behind (cluster.nats_server).

Each test starts an owner in a subprocess, kills it the way real owners die (SIGKILL, SIGTERM,
owner and watchdog at once) and checks the server's pid, its store and its port. Everything a
test starts is killed by the ``reaper`` fixture, whatever the outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster import nats_server
from cluster.nats_server import STORE_PREFIX, NatsServer, sweep_stale_stores

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OWNER = """
import json, signal, sys, time
sys.path.insert(0, {root!r})
from cluster.nats_server import NatsServer
server = NatsServer().start()
print(json.dumps({{
    "pid": server.pid, "watchdog": server.watchdog_pid, "port": server.port,
    "store": str(server.store_dir),
    "handler": signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL,
}}), flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead, whoever is yet to reap it
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Pids a test started, directly or through its owner: SIGKILLed at teardown if alive."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def owner(reaper: list[int]) -> Iterator[Callable[[], tuple[subprocess.Popen[bytes], dict]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> tuple[subprocess.Popen[bytes], dict]:
        process = subprocess.Popen(
            [sys.executable, "-c", OWNER.format(root=str(ROOT))],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        started.append(process)
        reaper.append(process.pid)
        assert process.stdout is not None
        info = json.loads(process.stdout.readline())
        reaper.extend([info["pid"], info["watchdog"]])
        assert _alive(info["pid"]) and Path(info["store"]).is_dir()
        return process, info

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def test_sigkill_of_the_owner_takes_the_server_and_its_store(owner) -> None:
    process, info = owner()
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    assert _until(lambda: not _alive(info["pid"])), "nats-server outlived its SIGKILLed owner"
    assert _until(lambda: not Path(info["store"]).exists())
    assert _until(lambda: _port_free(info["port"]))
    assert _until(lambda: not _alive(info["watchdog"]))


def test_sigterm_of_the_owner_takes_the_server_and_its_store(owner) -> None:
    process, info = owner()
    assert info["handler"]  # installed over SIG_DFL
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == -signal.SIGTERM  # still dies of the signal
    assert _until(lambda: not _alive(info["pid"]))
    assert not Path(info["store"]).exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_a_store_left_by_a_killed_owner_and_watchdog_is_swept(owner) -> None:
    process, info = owner()
    os.kill(info["watchdog"], signal.SIGKILL)  # both at once: nobody left to clean up
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    assert _until(lambda: not _alive(info["pid"]))  # the server's own parent-death signal
    assert Path(info["store"]).is_dir()
    with NatsServer() as server:  # the next start sweeps it
        assert not Path(info["store"]).exists()
        assert server.store_dir.is_dir()
    assert not server.store_dir.exists()


def test_the_sweep_keeps_live_stores_and_foreign_dirs(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{STORE_PREFIX}{dead.pid}-old"  # no lock file: judged by the pid
    unlocked = tmp_path / f"{STORE_PREFIX}{os.getpid()}-unlocked"  # a lock nobody holds
    live = tmp_path / f"{STORE_PREFIX}{os.getpid()}-live"  # held: this process is its owner
    other = tmp_path / "someone-elses-dir"
    for d in (stale, unlocked, live, other):
        d.mkdir()
    (unlocked / ".owner.lock").touch()
    handle = nats_server._Handle(live, own_store=True)
    handle.lock_store()
    try:
        assert sorted(sweep_stale_stores(tmp_path)) == sorted([stale, unlocked])
        assert live.is_dir() and other.is_dir()
    finally:
        handle.close()
    assert not live.exists()


def test_sigterm_handlers_are_shared_not_clobbered() -> None:
    """Run in a fresh interpreter: the claim on SIGTERM is shared by every server of a process,
    and this test session keeps other servers (fixtures) alive."""
    script = """
import signal
from cluster import nats_server
from cluster.nats_server import NatsServer

def mine(signum, frame):
    pass

signal.signal(signal.SIGTERM, signal.SIG_DFL)
with NatsServer() as server:
    assert signal.getsignal(signal.SIGTERM) is nats_server._on_sigterm
    assert server.running
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # released with the last one
signal.signal(signal.SIGTERM, mine)
with NatsServer():
    assert signal.getsignal(signal.SIGTERM) is mine  # a user's handler is never replaced
assert signal.getsignal(signal.SIGTERM) is mine
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_close_at_exit_and_stop_restart() -> None:
    server = NatsServer().start()
    pid, store = server.pid, server.store_dir
    assert pid is not None and _alive(pid) and store.parent == Path(tempfile.gettempdir())
    server.stop(kill=True)  # an outage: the store stays for the restart
    assert not _alive(pid) and store.is_dir()
    server.start()
    assert server.pid != pid and _alive(server.pid or 0)
    pid = server.pid
    del server  # garbage collection stops it too
    assert _until(lambda: not _alive(pid or 0)) and not store.exists()
