"""A real PostgreSQL server for the ledger's tests: the binaries of the pinned ``pgserver`` wheel
(installed by ``make test``), a fresh cluster in a temporary directory, TCP on loopback only,
a generated password (scram-sha-256) and nothing else listening.

PostgreSQL refuses to run as root; under root (containers, CI) the server runs as ``nobody``,
which owns its data directory.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

SUPERUSER = "disaggctl"


def _bin_dir() -> Path:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver wheel is not installed: run `make test`")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """``with PostgresServer() as pg:`` a server at ``pg.url`` (no password in it; ``pg.env``
    names it for libpq). ``restart()`` stops and starts it on the same port and data."""

    def __init__(self) -> None:
        self.password = secrets.token_urlsafe(24)
        self.port = _free_port()
        self.url = f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"
        self.env = {"PGPASSWORD": self.password}
        self._root = Path(tempfile.mkdtemp(prefix="disagg-pg-"))
        self._data = self._root / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._user: tuple[int, int] | None = None
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            self._user = (nobody.pw_uid, nobody.pw_gid)
            os.chown(self._root, *self._user)
        pwfile = self._root / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chmod(pwfile, 0o600)
        if self._user is not None:
            os.chown(pwfile, *self._user)
        self._run(
            "initdb", "-D", str(self._data), "-U", SUPERUSER, "--auth=scram-sha-256",
            f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C", "--no-instructions",
        )  # fmt: skip
        pwfile.unlink()

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [str(_bin_dir() / tool), *args], capture_output=True, text=True, **self._as_user()
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr[-2000:]}")

    def _as_user(self) -> dict[str, int]:
        return {} if self._user is None else {"user": self._user[0], "group": self._user[1]}

    def start(self) -> None:
        log = open(self._root / "server.log", "ab")  # noqa: SIM115  (the server holds it)
        with log:
            self._proc = subprocess.Popen(
                [
                    str(_bin_dir() / "postgres"), "-D", str(self._data),
                    "-c", "listen_addresses=127.0.0.1", "-p", str(self.port),
                    "-c", "unix_socket_directories=", "-c", "max_connections=200",
                ],
                stdout=log, stderr=subprocess.STDOUT, **self._as_user(),
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(self.url, password=self.password, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start: {self.log()[-2000:]}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # "fast" shutdown: SIGTERM waits for clients
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        path = self._root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()
