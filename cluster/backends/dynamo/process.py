"""One Dynamo OS process (a worker or the frontend) that never outlives its owner.

The process runs under ``cluster/nats_watchdog.py`` (the same watchdog as the embedded NATS
server, which runs any command after ``--``): the watchdog prints the child's pid, appends the
child's stdout and stderr to a log file (``--log``) and kills the child when the owner dies,
however it dies (a pipe on the watchdog's stdin, plus Linux parent-death signals). So a SIGKILLed
Ray actor or test process leaves no Dynamo process behind.

Signals for a graceful stop go to the Dynamo process itself (SIGTERM: Dynamo deregisters from
discovery at once and finishes in-flight work), with SIGKILL after a grace period; they are sent
only while the watchdog lives, because the watchdog reaps the child and exits right after, so a
live watchdog means the pid is still the child's and cannot have been reused.

Readiness (checked on ``ai-dynamo==1.6.1``): the system port's ``GET /health`` answers
``{"status": "notready", ..., "endpoints": {"generate": "ready", ...}}`` once the worker serves;
``status`` stays "notready" even then, so the endpoint's own state is what counts. Dynamo does not
exit when its system port is taken: it logs "System status server startup failed" and runs on
without one, so :meth:`DynamoProcess.wait_ready` watches the log for that line (another process
would answer on that port) and fails fast instead of trusting a stranger's ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from cluster.nats_auth import CREDENTIALS_ENV
from cluster.nats_server import WATCHDOG

__all__ = [
    "DynamoProcess",
    "DynamoStartError",
    "MetricSample",
    "child_environment",
    "instance_id_from_metrics",
    "parse_metrics",
    "read_log_tail",
]

HTTP_TIMEOUT_S = 2.0
# What a child process (an engine, Dynamo's frontend, etcd) never inherits ([21] 5; docs/design.md
# "Security model"): the bus's credentials folder (every role's password), the ledger's
# password, and anything named as a secret. It gets only what its own ``env`` adds (the
# ``dynamo`` role's NATS credentials, for an engine).
_NOT_INHERITED = frozenset(
    {CREDENTIALS_ENV, "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "DISAGG_LEDGER_PASSWORD_FILE"}
)
_SECRET_SUFFIXES = ("_PASSWORD", "_SECRET", "_TOKEN", "_CREDENTIALS", "_API_KEY", "_ACCESS_KEY")
LOG_TAIL_BYTES = 64 * 1024  # read at most this much of a log's end: logs are never truncated
PORT_TAKEN_MARK = "System status server startup failed"
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

MetricSample = tuple[str, dict[str, str], float]


class DynamoStartError(RuntimeError):
    """A Dynamo process exited or did not become ready; the message carries its last log lines."""


def read_log_tail(path: str | Path, lines: int = 20, start: int = 0) -> list[str]:
    """The last ``lines`` lines of a log after byte ``start``, reading at most
    :data:`LOG_TAIL_BYTES` of it."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Dynamo colours its log lines
    return text.splitlines()[-lines:]


def parse_metrics(text: str) -> list[MetricSample]:
    """Prometheus text exposition → (name, labels, value); comments and bad lines are skipped."""
    out: list[MetricSample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            labels_text, _, value_text = rest.rpartition("}")
            labels = {k: v for k, v in _LABEL.findall(labels_text)}
        else:
            name, _, value_text = line.partition(" ")
            labels = {}
        try:
            value = float(value_text.split()[0])
        except (ValueError, IndexError):
            continue
        out.append((name.strip(), labels, value))
    return out


def instance_id_from_metrics(text: str, component: str, endpoint: str = "generate") -> int | None:
    """The Dynamo instance id serving ``component``/``endpoint``: the hex ``worker_id`` label of
    its metrics (e.g. ``9c5d66d8a46083ca`` = 11267274923407606730, the id KV events carry)."""
    for _, labels, _ in parse_metrics(text):
        if labels.get("dynamo_component") != component:
            continue
        if labels.get("dynamo_endpoint") != endpoint or "worker_id" not in labels:
            continue
        try:
            return int(labels["worker_id"], 16)
        except ValueError:
            continue
    return None


def child_environment(inherited: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """A child process's environment: ``inherited`` less every secret (``_NOT_INHERITED``, and
    names ending as a secret's), then ``own`` (which may give it the secrets it needs)."""
    kept = {
        k: v for k, v in inherited.items()
        if k not in _NOT_INHERITED and not k.upper().endswith(_SECRET_SUFFIXES)
    }  # fmt: skip
    return {**kept, **own}


class DynamoProcess:
    """One Dynamo process under the watchdog; see the module docstring.

    ``env`` is added to this process's environment. ``system_port`` is the port given to the
    process as ``DYN_SYSTEM_PORT`` (None for the frontend, which serves HTTP instead);
    ``component`` and ``endpoint`` name what a worker serves, for :meth:`instance_id`; ``cwd``
    is its working directory (None: the owner's).

    Dynamo writes a temporary file at every start (its logging configuration) and never
    removes it. Its ``TMPDIR`` is therefore ``cwd`` when given, else a folder beside the log
    (``<log>.tmp``) made at start and removed at stop, so no run leaves files in ``/tmp``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: str | Path,
        system_port: int | None,
        *,
        component: str | None = None,
        endpoint: str = "generate",
        cwd: str | Path | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv must name a command")
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path).absolute()  # the same file whatever cwd the process has
        self.system_port = system_port
        self.component = component
        self.endpoint = endpoint
        self.cwd = None if cwd is None else Path(cwd)
        self._own_tmp = "TMPDIR" not in self.env and self.cwd is None
        self.tmp_dir = Path(self.env.get("TMPDIR") or self.cwd or self.log_path.with_suffix(".tmp"))
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._log_offset = 0  # where this start's lines begin in the (appended) log
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 15.0) -> DynamoProcess:
        """Start the process (not waiting for readiness: see :meth:`wait_ready`)."""
        with self._lock:
            if self._watchdog is not None and self._watchdog.poll() is None:
                return self
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:  # fail here, not inside the watchdog
                self._log_offset = log.tell()  # the log is shared by restarts: read ours only
                log.write(
                    f"--- start {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                    f"{' '.join(self.argv)}\n".encode()
                )
            command = [sys.executable, "-I", "-S", str(WATCHDOG), "--owner-pid", str(os.getpid())]
            if threading.current_thread() is threading.main_thread():
                command.append("--arm-pdeathsig")  # see nats_watchdog: the main-thread caveat
            command += ["--log", str(self.log_path), "--", *self.argv]
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            env = child_environment(
                os.environ, {"PYTHONUNBUFFERED": "1", **self.env, "TMPDIR": str(self.tmp_dir)}
            )
            watchdog = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # a terminal's Ctrl-C reaches the owner, which stops us
            )
            self._watchdog, self._pid = watchdog, None
            try:
                self._pid = self._read_pid(watchdog, time.monotonic() + timeout_s)
            except BaseException:
                self._halt(watchdog, 0.0)
                raise
        return self

    def _read_pid(self, watchdog: subprocess.Popen[bytes], deadline: float) -> int:
        assert watchdog.stdout is not None
        fd = watchdog.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 64) if ready else b""
            if not chunk:
                raise DynamoStartError(self.describe("did not start"))
            line += chunk
        watchdog.stdout.close()
        return int(line.split()[1])

    @property
    def pid(self) -> int | None:
        """The Dynamo process's pid (not the watchdog's) while it runs."""
        return self._pid if self.alive else None

    @property
    def last_pid(self) -> int | None:
        """The pid of the last process started, alive or not."""
        return self._pid

    @property
    def watchdog_pid(self) -> int | None:
        return self._watchdog.pid if self._watchdog is not None and self.alive else None

    @property
    def alive(self) -> bool:
        """Whether the process runs (the watchdog exits as soon as its child has)."""
        return self._watchdog is not None and self._watchdog.poll() is None

    @property
    def returncode(self) -> int | None:
        """None while running or never started; else the child's exit status, or the number of
        the signal that ended it (the watchdog exits with either)."""
        return None if self._watchdog is None else self._watchdog.poll()

    @property
    def exited(self) -> bool:
        return self._watchdog is not None and self._watchdog.poll() is not None

    def _signal(self, sig: int) -> None:
        """Signal the child, only while the watchdog lives (so the pid is still the child's)."""
        if self._pid is not None and self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, sig)

    def _halt(self, watchdog: subprocess.Popen[bytes], grace_s: float) -> None:
        if self._pid is None and watchdog.poll() is None and watchdog.stdin is not None:
            try:  # no pid yet: the watchdog's own protocol (it may be starting the child)
                watchdog.stdin.write(b"kill\n")
                watchdog.stdin.close()
            except OSError:
                pass
            grace_s = 0.0
        if watchdog.poll() is None and grace_s > 0:
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(timeout=grace_s)
        if watchdog.poll() is None:
            self._signal(signal.SIGKILL)
            try:
                watchdog.wait(timeout=10.0 if self._pid is not None else 15.0)
            except subprocess.TimeoutExpired:
                watchdog.kill()  # the child's parent-death signal (SIGKILL) takes it along
                watchdog.wait(timeout=10.0)
        if watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                watchdog.stdin.close()
        if watchdog.stdout is not None and not watchdog.stdout.closed:
            watchdog.stdout.close()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (Dynamo deregisters and finishes in-flight work), SIGKILL after ``grace_s``.
        Blocking; idempotent."""
        with self._lock:
            if self._watchdog is not None:
                self._halt(self._watchdog, max(grace_s, 0.0))
            if self._own_tmp:
                shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def terminate(self) -> None:
        """SIGTERM without waiting: Dynamo deregisters at once and finishes in-flight work."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, as an outage would (tests and chaos drills); returns once it is gone."""
        self.stop(grace_s=0.0)

    async def wait_exit(self, timeout_s: float) -> bool:
        """Wait without blocking the loop until the process has exited; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.alive:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # -- observation -------------------------------------------------------------------------

    def log_tail(self, lines: int = 20) -> list[str]:
        """The last lines this start wrote (earlier starts' lines are not shown)."""
        return read_log_tail(self.log_path, lines, self._log_offset)

    def describe(self, what: str) -> str:
        """``what`` happened, with the exit status and the log's last 20 lines."""
        tail = "\n".join("  " + line for line in self.log_tail(20)) or "  (empty)"
        return (
            f"{' '.join(self.argv[:4])}... {what} (returncode {self.returncode}); "
            f"last lines of {self.log_path}:\n{tail}"
        )

    async def _get(self, path: str, port: int | None = None) -> httpx.Response:
        port = self.system_port if port is None else port
        if port is None:
            raise RuntimeError("this process has no system port")
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
            return await client.get(f"http://127.0.0.1:{port}{path}")

    async def health(self) -> dict[str, object]:
        """The system port's ``/health`` JSON; ``{}`` when it does not answer (yet)."""
        try:
            response = await self._get("/health")
            body = response.json()
        except (httpx.HTTPError, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    async def metrics_text(self) -> str:
        """The system port's ``/metrics`` (Prometheus text); "" when it does not answer."""
        try:
            response = await self._get("/metrics")
        except httpx.HTTPError:
            return ""
        return response.text if response.status_code == 200 else ""

    async def instance_id(self, component: str | None = None) -> int | None:
        """The Dynamo instance id of ``component`` (default: this process's), from ``/metrics``."""
        component = component or self.component
        if component is None:
            raise ValueError("no component to look up")
        return instance_id_from_metrics(await self.metrics_text(), component, self.endpoint)

    def port_taken(self) -> bool:
        """Whether the log says the system port was taken (Dynamo runs on without it)."""
        return any(PORT_TAKEN_MARK in line for line in self.log_tail(200))

    async def wait_ready(self, timeout_s: float) -> int:
        """Wait until the worker serves its endpoint; returns its instance id.

        Raises :class:`DynamoStartError` with the last log lines when the process exits, its
        system port was taken, or ``timeout_s`` passes (the process is then stopped)."""
        if self.component is None or self.system_port is None:
            raise ValueError("wait_ready needs a component and a system port")
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive:
                raise DynamoStartError(self.describe("exited before it was ready"))
            if self.port_taken():
                await asyncio.to_thread(self.kill)
                raise DynamoStartError(self.describe(f"found system port {self.system_port} taken"))
            endpoints = (await self.health()).get("endpoints")
            if isinstance(endpoints, dict) and endpoints.get(self.endpoint) == "ready":
                found = await self.instance_id()
                if found is not None:
                    return found
            if time.monotonic() >= deadline:
                await asyncio.to_thread(self.kill)
                raise DynamoStartError(self.describe(f"was not ready within {timeout_s} s"))
            await asyncio.sleep(0.1)
