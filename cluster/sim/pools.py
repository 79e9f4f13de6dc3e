"""The P/D pools and their run-time re-split (docs/design.md §4 "Two levers", §6).

A re-split moves one worker (one TP group) from one role to the other in three steps, each a
``PoolChange`` to the listeners (the ``disagg.<ns>.pools`` event) and a metric update:

1. ``resplit_start``: the worker leaves every router of its role, so it gets no new request; what
   it already holds finishes normally (a decode worker's sequences run to their end, a prefill
   worker's queued and running jobs are computed and their KV transferred out): no request is
   lost or routed twice;
2. ``drained``: it holds nothing; its engine stops (its KV cache is gone: a ``cleared`` KV event,
   as an engine restart publishes) and restarts in the new role, which takes the profile's
   ``role_switch_s`` (weights loaded again, engine warmed up);
3. ``warm``: a fresh worker of the new role, same id, empty cache, joins every router of that
   role and serves.

A move still draining can be ``cancelled`` (its overload ended first): its engine never stopped,
so it joins its old role's routers again at once. Once drained, the old engine is gone and going
back would cost a whole role switch where finishing costs what is left of one: a warm-up runs to
its end.

While a worker drains or warms it counts in neither pool. One re-split at a time; each role
keeps at least one worker (a role with none never gets one taken away either).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from cluster.sim.loop import EventLoop
from cluster.sim.views import ROLES, Role, RouterViews
from telemetry import metrics

Action = Literal["resplit_start", "drained", "warm", "cancelled"]
_OTHER: Final[dict[Role, Role]] = {"prefill": "decode", "decode": "prefill"}


@dataclass(frozen=True)
class Topology:
    """``prefill`` prefill workers and ``decode`` decode workers, each of ``tp`` GPUs."""

    prefill: int
    decode: int

    def __post_init__(self) -> None:
        if self.prefill < 0 or self.decode < 1:
            raise ValueError(f"a topology needs >= 0 prefill and >= 1 decode workers: {self}")

    @classmethod
    def parse(cls, text: str) -> Topology:
        """``"1P/5D"`` → Topology(1, 5)."""
        match = re.fullmatch(r"\s*(\d+)\s*P\s*/\s*(\d+)\s*D\s*", text, re.IGNORECASE)
        if not match:
            raise ValueError(f"bad topology {text!r}: expected xP/yD, e.g. 1P/5D")
        return cls(int(match[1]), int(match[2]))

    def __str__(self) -> str:
        return f"{self.prefill}P/{self.decode}D"

    def gpus(self, tp: int) -> int:
        return (self.prefill + self.decode) * tp


@dataclass(frozen=True)
class PoolChange:
    """One step of a re-split at time ``t``; ``prefill``/``decode``: the pools after it."""

    t: float
    action: Action
    worker: int
    from_role: Role
    to_role: Role
    prefill: int
    decode: int
    reason: str = ""


@dataclass(frozen=True)
class _Move:
    worker: int
    from_role: Role
    to_role: Role
    reason: str


class WorkerHost(Protocol):
    """What the pools need from the cluster that runs the workers."""

    def stop_worker(self, worker: int, role: Role) -> None:
        """The drained worker's engine stops: forget it and publish its cache's ``cleared``."""

    def start_worker(self, worker: int, role: Role, incarnation: int) -> None:
        """A fresh engine of ``role`` with id ``worker`` (``incarnation`` seeds its jitter)."""


class PoolManager:
    """Who serves in which role, the in-flight work each worker holds, and re-splits."""

    def __init__(
        self,
        host: WorkerHost,
        views: RouterViews,
        loop: EventLoop,
        role_switch_s: float,
        roles: Mapping[int, Role],
    ) -> None:
        self.host = host
        self.views = views
        self.loop = loop
        self.role_switch_s = role_switch_s
        self.listeners: list[Callable[[PoolChange], None]] = []
        self.history: list[PoolChange] = []
        self.holds: dict[int, int] = dict.fromkeys(roles, 0)  # requests each worker serves
        self._incarnation: dict[int, int] = dict.fromkeys(roles, 0)
        self._move: _Move | None = None
        self._draining = False  # the move's worker still runs its old role's engine
        self._set_gauges()

    @property
    def pools(self) -> Topology:
        """Workers serving in each role now (draining or warming counts in neither)."""
        return Topology(len(self.views.workers("prefill")), len(self.views.workers("decode")))

    @property
    def resplitting(self) -> bool:
        return self._move is not None

    @property
    def draining(self) -> bool:
        """A move is under way and its worker has not drained yet (it can be cancelled)."""
        return self._move is not None and self._draining

    # -- in-flight work ----------------------------------------------------------------------

    def hold(self, worker: int) -> None:
        """``worker`` took on one request (routed to it)."""
        self.holds[worker] += 1

    def let_go(self, worker: int) -> None:
        """``worker`` is done with one request; a draining worker may now be empty."""
        self.holds[worker] -= 1
        move = self._move
        if move is not None and move.worker == worker and self.holds[worker] == 0:
            self._drained(move)

    # -- the re-split ------------------------------------------------------------------------

    def resplit(self, to_role: str, reason: str = "") -> int:
        """Start moving one worker to ``to_role``; returns its id (module doc for the steps).

        The source is the worker of the other role holding the least in-flight work (ties: the
        highest id). ``ValueError`` for an unknown role, a re-split in progress, or a move that
        would leave a role with no worker."""
        if to_role not in ROLES:
            raise ValueError(f"to_role must be 'prefill' or 'decode', got {to_role!r}")
        if self._move is not None:
            m = self._move
            raise ValueError(
                f"a re-split is already in progress: worker {m.worker} {m.from_role} -> {m.to_role}"
            )
        target: Role = "prefill" if to_role == "prefill" else "decode"
        source = _OTHER[target]
        serving = self.views.workers(source)
        if len(serving) < 2:
            raise ValueError(
                f"cannot move a worker to {target}: {source} has {len(serving)} worker(s) and "
                f"must keep at least one"
            )
        worker = min(serving, key=lambda w: (self.holds[w], -w))
        move = _Move(worker, source, target, reason)
        self._move = move
        self._draining = True
        self.views.remove_worker(source, worker)
        self._emit("resplit_start", move)
        if self.holds[worker] == 0:
            self._drained(move)
        return worker

    def cancel(self, reason: str = "") -> bool:
        """Stop the move under way while its worker still drains: it serves its old role again
        at once, its cache intact. False when there is nothing to cancel (no move, or its
        engine has stopped: module docstring)."""
        move = self._move
        if move is None or not self._draining:
            return False
        self._move = None
        self._draining = False
        self.views.add_worker(move.from_role, move.worker)
        self._emit("cancelled", _Move(move.worker, move.from_role, move.to_role, reason))
        return True

    def _drained(self, move: _Move) -> None:
        self._draining = False
        self.host.stop_worker(move.worker, move.from_role)
        self._emit("drained", move)
        self.loop.after(self.role_switch_s, self._warm, move)

    def _warm(self, move: _Move) -> None:
        # A new engine takes no queued request away: admission waits on the backlog (routed,
        # not started), which an idle worker does not change, so nothing needs waking here.
        self._incarnation[move.worker] += 1
        self.host.start_worker(move.worker, move.to_role, self._incarnation[move.worker])
        self.views.add_worker(move.to_role, move.worker)
        self._move = None
        metrics.RESPLITS.inc()
        self._emit("warm", move)

    def _emit(self, action: Action, move: _Move) -> None:
        now = self.pools
        change = PoolChange(
            self.loop.now,
            action,
            move.worker,
            move.from_role,
            move.to_role,
            now.prefill,
            now.decode,
            move.reason,
        )
        self.history.append(change)
        self._set_gauges()
        for listener in self.listeners:
            listener(change)

    def _set_gauges(self) -> None:
        now = self.pools
        metrics.POOL_WORKERS.labels("prefill").set(now.prefill)
        metrics.POOL_WORKERS.labels("decode").set(now.decode)
        metrics.RESPLIT_IN_PROGRESS.set(int(self._move is not None))
