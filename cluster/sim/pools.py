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

Pool *sizes* (``scale_to``), as Dynamo's planner sets them (``target_prefill``,
``target_decode``), use the same steps with a third place, ``parked``: a worker taken out of a
pool drains and its engine stops (``resplit_start``, ``drained``); it holds no GPU until a pool
grows again, when it starts in that role after the profile's role switch, as a fresh engine
loads its weights and warms up (``resplit_start``, ``warm``). Several such moves may run at
once. ``worker_seconds`` counts the time workers were not parked: what a budget pays for.
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
Place = Literal["prefill", "decode", "parked"]  # a worker's role, or none (module docstring)
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
    from_role: Place
    to_role: Place
    prefill: int
    decode: int
    reason: str = ""


@dataclass
class _Move:
    worker: int
    from_role: Place
    to_role: Place
    reason: str
    draining: bool = True  # its worker still runs its old role's engine


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
        self._moves: dict[int, _Move] = {}
        self._parked: set[int] = set()
        self._parked_since: dict[int, float] = {}
        self._parked_s = 0.0  # worker-seconds spent parked by workers that left it
        self._target: tuple[int, int] | None = None  # sizes asked by ``scale_to``, until met
        self._reconciling = False  # a drain inside ``_reconcile`` must not start another
        self._set_gauges()

    @property
    def pools(self) -> Topology:
        """Workers serving in each role now (draining or warming counts in neither)."""
        return Topology(len(self.views.workers("prefill")), len(self.views.workers("decode")))

    @property
    def resplitting(self) -> bool:
        return bool(self._moves)

    @property
    def draining(self) -> bool:
        """A move is under way and its worker has not drained yet (it can be cancelled)."""
        return any(m.draining for m in self._moves.values())

    @property
    def parked(self) -> tuple[int, ...]:
        return tuple(sorted(self._parked))

    def moving(self, place: Place) -> tuple[int, ...]:
        """Workers on their way to ``place`` (draining or warming up)."""
        return tuple(sorted(w for w, m in self._moves.items() if m.to_role == place))

    def size(self, role: Role) -> int:
        """The pool ``role`` is heading for: its serving workers and those on their way in."""
        return len(self.views.workers(role)) + len(self.moving(role))

    def starting(self, role: Role) -> tuple[int, ...]:
        """Workers warming up in ``role`` (their old engine stopped, or they were parked)."""
        return tuple(
            sorted(w for w, m in self._moves.items() if m.to_role == role and not m.draining)
        )

    def leaving(self, role: Role) -> tuple[int, ...]:
        """Workers still draining out of ``role``."""
        return tuple(
            sorted(w for w, m in self._moves.items() if m.from_role == role and m.draining)
        )

    def worker_seconds(self, until: float | None = None) -> float:
        """Σ over workers of the time they held their GPUs (serving, draining, warming up) up
        to ``until`` (default now; a replay ends at its last token, its ticks run on)."""
        now = self.loop.now if until is None else until
        parked = self._parked_s + sum(max(0.0, now - t) for t in self._parked_since.values())
        return len(self.holds) * now - parked

    # -- in-flight work ----------------------------------------------------------------------

    def hold(self, worker: int) -> None:
        """``worker`` took on one request (routed to it)."""
        self.holds[worker] += 1

    def let_go(self, worker: int) -> None:
        """``worker`` is done with one request; a draining worker may now be empty."""
        self.holds[worker] -= 1
        move = self._moves.get(worker)
        if move is not None and move.draining and self.holds[worker] == 0:
            self._drained(move)

    # -- the re-split ------------------------------------------------------------------------

    def resplit(self, to_role: str, reason: str = "", workers: int = 1) -> int:
        """Start moving ``workers`` to ``to_role`` at once; returns the first one's id (module
        doc for the steps). Each source is the worker of the other role holding the least
        in-flight work (ties: the highest id). ``ValueError`` for an unknown role, a re-split in
        progress, or a move that would leave a role with no worker."""
        if to_role not in ROLES:
            raise ValueError(f"to_role must be 'prefill' or 'decode', got {to_role!r}")
        if self._moves:
            m = next(iter(self._moves.values()))
            raise ValueError(
                f"a re-split is already in progress: worker {m.worker} {m.from_role} -> {m.to_role}"
            )
        target: Role = "prefill" if to_role == "prefill" else "decode"
        serving = len(self.views.workers(_OTHER[target]))
        if not 1 <= workers < max(serving, 2):
            raise ValueError(
                f"cannot move {workers} worker(s) to {target}: {_OTHER[target]} has {serving} "
                "worker(s) and must keep at least one"
            )
        moved = [self._leave(_OTHER[target], target, reason) for _ in range(workers)]
        return moved[0]

    def scale_to(self, prefill: int, decode: int, reason: str = "") -> None:
        """Aim the pools at ``prefill`` and ``decode`` serving workers (module docstring): a pool
        above its size gives workers up (they drain and park), one below it takes parked ones
        (they warm up in its role). A pool keeps one worker if it has one; a size the parked
        workers cannot fill yet is filled as workers park."""
        if prefill < 0 or decode < 1:
            raise ValueError(f"pool sizes need prefill >= 0 and decode >= 1: {prefill}, {decode}")
        self._target = (prefill, decode)
        self._reconcile(reason)

    def _reconcile(self, reason: str) -> None:
        if self._target is None or self._reconciling:
            return
        self._reconciling = True
        try:
            self._toward(self._target, reason)
        finally:
            self._reconciling = False
        if all(
            len(self.views.workers(r)) == n and not self.moving(r)
            for r, n in zip(ROLES, self._target, strict=True)
        ):
            self._target = None

    def _toward(self, target: tuple[int, int], reason: str) -> None:
        for role, size in zip(ROLES, target, strict=True):
            while self.size(role) > size:
                if len(self.views.workers(role)) < 2:
                    break  # a pool keeps its last worker
                self._leave(role, "parked", reason)
        for role, size in zip(ROLES, target, strict=True):
            while self._parked and self.size(role) < size:
                self._unpark(max(self._parked), role, reason)

    def cancel(self, reason: str = "") -> bool:
        """Stop the moves under way whose workers still drain: each serves its old role again
        at once, its cache intact. False when there is nothing to cancel (no move, or its
        engine has stopped: module docstring)."""
        draining = [m for m in self._moves.values() if m.draining]
        for move in draining:
            del self._moves[move.worker]
            if move.from_role != "parked":
                self.views.add_worker(move.from_role, move.worker)
            self._emit("cancelled", _Move(move.worker, move.from_role, move.to_role, reason))
        return bool(draining)

    def _leave(self, source: Role, to: Place, reason: str) -> int:
        serving = self.views.workers(source)
        if len(serving) < 2:
            raise ValueError(
                f"cannot move a worker to {to}: {source} has {len(serving)} worker(s) and "
                f"must keep at least one"
            )
        worker = min(serving, key=lambda w: (self.holds[w], -w))
        move = _Move(worker, source, to, reason)
        self._moves[worker] = move
        self.views.remove_worker(source, worker)
        self._emit("resplit_start", move)
        if self.holds[worker] == 0:
            self._drained(move)
        return worker

    def _unpark(self, worker: int, role: Role, reason: str) -> None:
        self._parked.discard(worker)
        self._parked_s += self.loop.now - self._parked_since.pop(worker)
        move = _Move(worker, "parked", role, reason, draining=False)
        self._moves[worker] = move
        self._emit("resplit_start", move)
        self.loop.after(self.role_switch_s, self._warm, move)

    def _drained(self, move: _Move) -> None:
        move.draining = False
        if move.from_role != "parked":
            self.host.stop_worker(move.worker, move.from_role)
        if move.to_role == "parked":
            del self._moves[move.worker]
            self._parked.add(move.worker)
            self._parked_since[move.worker] = self.loop.now
            self._emit("drained", move)
            self._reconcile(move.reason)
            return
        self._emit("drained", move)
        self.loop.after(self.role_switch_s, self._warm, move)

    def _warm(self, move: _Move) -> None:
        # A new engine takes no queued request away: admission waits on the backlog (routed,
        # not started), which an idle worker does not change, so nothing needs waking here.
        role: Role = "prefill" if move.to_role == "prefill" else "decode"
        self._incarnation[move.worker] += 1
        self.host.start_worker(move.worker, role, self._incarnation[move.worker])
        self.views.add_worker(role, move.worker)
        del self._moves[move.worker]
        metrics.RESPLITS.inc()
        self._emit("warm", move)
        self._reconcile(move.reason)

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
        metrics.RESPLIT_IN_PROGRESS.set(int(bool(self._moves)))
