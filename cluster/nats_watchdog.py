"""The watchdog between an owner and its embedded ``nats-server``: the server dies with the owner.

Any command after ``--`` works the same way: ``cluster.backends.dynamo.process`` runs Dynamo's
workers and
frontend under it too, with ``--log FILE`` appending the child's stdout and stderr to FILE.

``cluster.nats_server`` does not start ``nats-server`` itself; it starts this script (standard
library only, run as ``python -I -S nats_watchdog.py``), which starts the server, prints
``pid <n>`` and then watches its stdin, a pipe whose only writer is the owner:

- a line ``stop`` or ``kill``: the owner stops the server (SIGTERM, or SIGKILL for an outage);
- end of file: the owner is gone, however it died (the kernel closes its end of the pipe even on
  SIGKILL): the watchdog stops the server and, with ``--remove-store``, deletes its store;
- SIGTERM/SIGHUP/SIGINT to the watchdog: the same as end of file (handled through a wakeup pipe,
  never by raising from a signal handler, so a signal cannot cut the cleanup short).

Two Linux parent-death signals (``prctl(PR_SET_PDEATHSIG)``) back the pipe up, for an owner whose
pipe end outlives it (a child forked without exec keeps a copy of it): the watchdog arms SIGTERM
on itself when the owner asks (only when the owner starts it from its main thread: the signal
fires when the *thread* that forked the child exits, not the process), and the server gets
SIGKILL when the watchdog dies. The server's is armed in a ``preexec_fn``, which is safe here
because the watchdog has a single thread. Elsewhere (macOS) only the pipe works: a watchdog that
is itself SIGKILLed leaves its server running, and its store for the owner's next start to sweep.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STOP_GRACE_S = 5.0  # a SIGTERMed server gets this long to flush JetStream before SIGKILL


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None


def death_signal(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` sending ``sig`` to the child when its parent thread exits (Linux only).

    None where the call does not exist. libc is loaded here, in the parent: the child must not
    have to load a library between fork and exec.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:
        if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0 and os.getppid() != parent:
            os.kill(os.getpid(), sig)  # the parent died before the signal was armed

    return arm


def arm_self(sig: int, owner_pid: int) -> bool:
    """Ask for ``sig`` when our parent thread exits; False if the owner is already gone."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return os.getppid() == owner_pid


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _on_signal(signum: int, frame: object) -> None:
    # Nothing here: the signal's byte on the wakeup pipe ends the watch. Raising from a handler
    # could land inside the cleanup and skip it (the owner's death brings a signal and the end
    # of the pipe at the same instant).
    pass


def _watch(server: subprocess.Popen[bytes], wakeup: int) -> str:
    """Wait for a command, the owner's end of the pipe closing, a signal, or the server exiting."""
    while server.poll() is None:
        ready, _, _ = select.select([0, wakeup], [], [], 0.2)
        if wakeup in ready:
            return "owner_gone"
        if not ready:
            continue
        chunk = os.read(0, 64)
        if not chunk:
            return "owner_gone"
        if b"kill" in chunk:
            return "kill"
        if b"stop" in chunk:
            return "stop"
    return "exited"


def _stop(server: subprocess.Popen[bytes], how: str) -> None:
    if server.poll() is not None:
        return
    if how == "kill":
        server.kill()
    else:
        server.terminate()
    try:
        server.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run a server that dies with its owner (see the module docstring).",
        usage="nats_watchdog.py --owner-pid PID [--arm-pdeathsig] [--remove-store DIR] [--log FILE]"
        " -- CMD...",
    )
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--arm-pdeathsig", action="store_true")
    parser.add_argument("--remove-store", default=None, help="delete this dir if the owner dies")
    parser.add_argument("--log", default=None, help="append the server's stdout+stderr here")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("no server command after --")
    wakeup, signalled = os.pipe()
    os.set_blocking(signalled, False)
    signal.set_wakeup_fd(signalled)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    how, server = "owner_gone", None
    try:
        if not args.arm_pdeathsig or arm_self(signal.SIGTERM, args.owner_pid):
            # The server writes straight into the log, not through a pipe of ours: its last
            # lines are there even when the watchdog is killed first.
            out = open(args.log, "ab") if args.log else None  # noqa: SIM115
            try:
                server = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=out or subprocess.DEVNULL,
                    stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
                    preexec_fn=death_signal(signal.SIGKILL),
                )
            finally:
                if out is not None:
                    out.close()  # the server holds its own copy
            sys.stdout.write(f"pid {server.pid}\n")
            sys.stdout.flush()
            how = _watch(server, wakeup)
    except BrokenPipeError:
        how = "owner_gone"  # nobody reads our pid: the owner died while we started
    finally:
        if server is not None:
            _stop(server, how)
        if how == "owner_gone" and args.remove_store:
            shutil.rmtree(args.remove_store, ignore_errors=True)
    return 0 if server is None or server.returncode is None else abs(server.returncode)


if __name__ == "__main__":
    sys.exit(main())
