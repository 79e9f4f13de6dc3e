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
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

from cluster.nats_server import free_port

SUPERUSER = "disaggctl"


def _install_dir() -> Path:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver wheel is not installed: run `make test`")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _reachable_by_others(path: Path) -> bool:
    """Whether a user other than the owner may enter every folder down to ``path``."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


class PostgresServer:
    """``with PostgresServer() as pg:`` a server at ``pg.url`` (no password in it; ``pg.env``
    names it for libpq). ``restart()`` stops and starts it on the same port and data."""

    def __init__(self) -> None:
        self.password = secrets.token_urlsafe(24)
        self.port = free_port()
        self.url = f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"
        self.env = {"PGPASSWORD": self.password}
        self._root = Path(tempfile.mkdtemp(prefix="disagg-pg-"))
        self._data = self._root / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._user: tuple[int, int] | None = None
        self._bin = _install_dir() / "bin"
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            self._user = (nobody.pw_uid, nobody.pw_gid)
            os.chown(self._root, *self._user)
            if not _reachable_by_others(self._bin):  # e.g. a checkout under /root
                self._bin = self._copy_install() / "bin"
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

    def _copy_install(self) -> Path:
        """The wheel's server where ``nobody`` can run it, with the libraries its RPATH names
        (``$ORIGIN/../../../pgserver.libs``)."""
        wheel = _install_dir().parents[1]  # site-packages
        into = self._root / "pg"
        shutil.copytree(wheel / "pgserver.libs", into / "pgserver.libs")
        return Path(shutil.copytree(_install_dir(), into / "pgserver" / "pginstall", symlinks=True))

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [str(self._bin / tool), *args], capture_output=True, text=True, **self._as_user()
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
                    str(self._bin / "postgres"), "-D", str(self._data),
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
