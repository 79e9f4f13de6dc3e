"""The serve runtime's P/D pools and their re-split (docs/design.md §4 "Two levers", §5).

:class:`ActorPools` is the ``controller.resplit.PoolTarget`` of the controller actor: the
resplitter decides, this moves one worker actor (one TP group) from one role to the other:

1. ``resplit_start``: the least-loaded worker of the other role leaves the router actor's pool
   (``remove_worker``), so nothing new is routed to it;
2. it drains (``drain(timeout)``): what it holds finishes, no request is lost. A drain that
   times out abandons the re-split: the worker takes work again (``resume``) and goes back into
   its router, and an ``abandoned`` event closes the re-split. The resplitter may call the move
   off while it drains (``cancel``: its overload is over); the worker goes back the same way,
   and a ``cancelled`` event closes it;
3. ``drained``: the old actor is stopped (``ray.kill``) and its placement group freed;
4. the new-role actor starts (``cluster.ray.worker_factory``: the options and placement its
   role gets at deploy time), answers ``ready()``, then warms up for the profile's
   ``role_switch_s`` (virtual seconds: ``role_switch_s / speedup`` wall seconds, as every
   engine time of the wall-clock simulator is stretched);
5. ``warm``: it joins the router actor's pool of its new role and serves.

Worker ids: the moved worker keeps its id. One id names one TP group for the service's life, so
the set of ids never changes and a restarted controller (or anyone) finds every worker by probing
``<ns>-prefill-<id>`` and ``<ns>-decode-<id>``; ids stay unique across roles because a worker
is in one pool at a time (it leaves the old pool before it joins the new one). The names differ
by role, so the new actor's name never collides with the old one's while Ray forgets it.

Each step publishes a ``PoolsEvent`` on ``disagg.<ns>.pools`` and sets
``disagg_pool_workers{role}``; ``disagg_resplit_in_progress`` is 1 from start to warm (or
abandon) and ``disagg_resplits_total`` counts re-splits that finished.

The actors are reached through a :class:`Launcher` (Ray in the service, fakes in unit tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, Protocol

from cluster.actor_ref import ActorRef
from cluster.events import PoolAction, PoolsEvent
from cluster.ray.refs import RouterRef, WorkerRef
from cluster.ray.status import EngineInflight, PoolsSnapshot, ResplitStep
from cluster.sim.wallclock import EngineLoad
from controller.resplit import Pools, Role
from telemetry import metrics

__all__ = ["ActorPools", "Launcher"]

log = logging.getLogger(__name__)

OTHER: Final[dict[Role, Role]] = {"prefill": "decode", "decode": "prefill"}
MAX_STEPS = 64  # recent steps kept for snapshot()


class Launcher(Protocol):
    """Starts, stops and finds worker actors (handles with ``.method.remote(...)``)."""

    async def start(self, role: Role, worker_id: int) -> ActorRef:
        """A new ``role`` actor for ``worker_id``, once it answered ``ready()``."""
        ...

    async def stop(self, role: Role, worker_id: int, handle: ActorRef) -> None:
        """Kill the actor and free what it held (its placement group)."""
        ...

    def find(self, role: Role, worker_id: int) -> ActorRef | None:
        """The running ``role`` actor of ``worker_id``, or None."""
        ...


def _load_key(role: Role, load: object) -> float:
    """The figure a role's router balances on: queued prefill tokens, or decode KV blocks."""
    if isinstance(load, EngineLoad):
        held = load.active_prefill_tokens if role == "prefill" else load.active_decode_blocks
        return float(held + load.waiting)
    if isinstance(load, EngineInflight):  # an engine process that tells only what it has in flight
        return float(load.inflight or 0)
    return float("inf")  # a worker that does not answer is the last one to move


class ActorPools:
    """The pools of worker actors and the re-split that moves one (module docstring)."""

    def __init__(
        self,
        *,
        workers: Mapping[Role, Mapping[int, ActorRef | None]],
        router: ActorRef | None,
        launcher: Launcher,
        publish: Callable[[PoolsEvent], object],
        warmup_s: float,
        drain_timeout_s: float,
        call_timeout_s: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        # None: a worker known by its id only, found by name when first needed.
        self.workers: dict[Role, dict[int, ActorRef | None]] = {
            r: dict(workers.get(r, {})) for r in OTHER
        }
        self._router_ref = None if router is None else RouterRef(router)
        self.launcher = launcher
        self.publish = publish
        self.warmup_s = warmup_s
        self.drain_timeout_s = drain_timeout_s
        self.call_timeout_s = call_timeout_s
        self.sleep = sleep
        self.steps: deque[ResplitStep] = deque(maxlen=MAX_STEPS)
        self.moving: tuple[int, Role] | None = None  # (worker id, role it is moving to)
        self.completed = 0
        self.abandoned = 0
        self.cancelled = 0
        self.failed = 0
        self._task: asyncio.Task[str] | None = None
        self._recall: asyncio.Future[str] | None = None  # set while a drain can be called off
        self._gauges()

    @property
    def router(self) -> RouterRef:
        """The router actor, whose pools every move changes (none: no move can start)."""
        if self._router_ref is None:
            raise LookupError("the pools were given no router actor")
        return self._router_ref

    # -- PoolTarget --------------------------------------------------------------------------

    def pools(self) -> Pools:
        return Pools(len(self.workers["prefill"]), len(self.workers["decode"]))

    def resplitting(self) -> bool:
        return self.moving is not None or (self._task is not None and not self._task.done())

    def switch_s(self) -> float:
        """The warm-up in wall seconds (the drain, bounded by ``drain_timeout_s`` and usually
        a few seconds of decode, left out)."""
        return self.warmup_s

    def cancel(self, reason: str) -> bool:
        """Call off the move under way while its worker drains (module docstring, step 2)."""
        if self._recall is None or self._recall.done():
            return False
        self._recall.set_result(reason)
        return True

    def max_step(self) -> int:
        """One: a move here is one worker actor's drain and restart, told step by step."""
        return 1

    def resplit(self, to_role: Role, reason: str, workers: int = 1) -> None:
        """Start moving the least-loaded worker of the other role (in the background)."""
        if workers != 1:
            raise ValueError(f"the service moves one worker at a time, asked {workers}")
        if self.resplitting():
            raise RuntimeError("a re-split is already in progress")
        self.moving = (-1, to_role)  # taken now: a second call before the task runs is refused
        self._task = asyncio.get_running_loop().create_task(
            self._guarded(to_role, reason), name=f"resplit-to-{to_role}"
        )

    # -- the move ----------------------------------------------------------------------------

    async def move(self, to_role: Role, reason: str, worker_id: int | None = None) -> str:
        """Move ``worker_id`` (default: the least-loaded worker of the other role) to
        ``to_role`` and wait for the end: "warm", "abandoned", "cancelled" or "failed"."""
        if self._task is not None and not self._task.done():
            raise RuntimeError("a re-split is already in progress")
        self.moving = (-1, to_role)
        self._task = asyncio.get_running_loop().create_task(
            self._guarded(to_role, reason, worker_id), name=f"resplit-to-{to_role}"
        )
        return await asyncio.shield(self._task)

    async def wait(self) -> str | None:
        """The end of the re-split under way (None when there is none)."""
        return None if self._task is None else await asyncio.shield(self._task)

    async def _guarded(self, to_role: Role, reason: str, worker_id: int | None = None) -> str:
        metrics.RESPLIT_IN_PROGRESS.set(1)
        try:
            return await self._move(to_role, reason, worker_id)
        except Exception:  # a control loop's background task: report, never crash the actor
            self.failed += 1
            log.exception("re-split to %s failed", to_role)
            return "failed"
        finally:
            self.moving = None
            metrics.RESPLIT_IN_PROGRESS.set(0)
            self._gauges()

    async def _move(self, to_role: Role, reason: str, worker_id: int | None) -> str:
        if to_role not in OTHER:
            raise ValueError(f"to_role must be 'prefill' or 'decode', got {to_role!r}")
        from_role = OTHER[to_role]
        source = self.workers[from_role]
        if from_role == "decode" and len(source) <= 1:
            raise ValueError("the decode pool cannot lose its last worker")
        wid = await self._pick(from_role) if worker_id is None else worker_id
        if wid not in source:
            raise ValueError(f"worker {wid} is not in the {from_role} pool")
        self.moving = (wid, to_role)
        handle = self._handle(from_role, wid)
        t = self.call_timeout_s
        await asyncio.wait_for(self.router.remove_worker(from_role, wid), t)
        del source[wid]
        self._step("resplit_start", wid, to_role, f"{from_role} worker {wid}: {reason}")
        recall = self._recall = asyncio.get_running_loop().create_future()
        drain = asyncio.ensure_future(
            asyncio.wait_for(
                WorkerRef(handle).drain(self.drain_timeout_s), self.drain_timeout_s + t
            )
        )
        try:
            await asyncio.wait({drain, recall}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._recall = None
        if recall.done():  # the worker's resume() ends its drain with False: nothing stops
            drain.cancel()
            self.cancelled += 1
            return await self._restore(from_role, wid, handle, to_role, "cancelled",
                                       f"cancelled: {recall.result()}")  # fmt: skip
        recall.cancel()
        try:
            drained = drain.result()
        except Exception as exc:  # dead or hung: treated like a drain that did not finish
            log.warning("worker %d: drain failed: %r", wid, exc)
            drained = False
        if drained is not True:
            self.abandoned += 1
            why = (
                f"abandoned: {from_role} worker {wid} did not drain within "
                f"{self.drain_timeout_s:g} s; it is back in the {from_role} pool"
            )
            return await self._restore(from_role, wid, handle, to_role, "abandoned", why)
        await self.launcher.stop(from_role, wid, handle)
        self._step("drained", wid, to_role, f"{from_role} worker {wid} drained and stopped")
        new = await self.launcher.start(to_role, wid)
        await self.sleep(self.warmup_s)  # the model load of role_switch_s (module docstring)
        await asyncio.wait_for(self.router.add_worker(to_role, wid), t)
        self.workers[to_role][wid] = new
        self.completed += 1
        metrics.RESPLITS.inc()
        self._step("warm", wid, to_role, f"worker {wid} serves as {to_role} after "
                   f"{self.warmup_s:.3g} s of warm-up")  # fmt: skip
        return "warm"

    async def _restore(
        self, role: Role, wid: int, handle: ActorRef, to_role: Role, action: PoolAction, why: str
    ) -> str:
        """The drain did not finish, or was called off: the worker serves its old role again."""
        t = self.call_timeout_s
        with contextlib.suppress(Exception):  # a dead worker is Ray's to restart
            await asyncio.wait_for(WorkerRef(handle).resume(), t)
        await asyncio.wait_for(self.router.add_worker(role, wid), t)
        self.workers[role][wid] = handle
        self._step(action, wid, to_role, why)
        return action

    def _handle(self, role: Role, wid: int) -> ActorRef:
        """The worker's handle; None entries (known by id only) are found by name."""
        handle = self.workers[role][wid]
        if handle is None:
            handle = self.launcher.find(role, wid)
            if handle is None:
                raise LookupError(f"no {role} actor for worker {wid}")
            self.workers[role][wid] = handle
        return handle

    async def _pick(self, role: Role) -> int:
        ids = sorted(self.workers[role])

        async def load(wid: int) -> object:
            return await asyncio.wait_for(
                WorkerRef(self._handle(role, wid)).load(), self.call_timeout_s
            )

        loads = await asyncio.gather(*(load(w) for w in ids), return_exceptions=True)
        return min(zip(ids, loads, strict=True), key=lambda x: (_load_key(role, x[1]), x[0]))[0]

    def _step(self, action: PoolAction, wid: int, to_role: Role, reason: str) -> None:
        self._gauges()
        pre, dec = tuple(sorted(self.workers["prefill"])), tuple(sorted(self.workers["decode"]))
        step = ResplitStep(time.time(), action, wid, to_role, pre, dec, reason)
        self.steps.append(step)
        log.info("re-split %s: %s (pools %dP/%dD)", action, reason, len(pre), len(dec))
        try:
            self.publish(
                PoolsEvent(t=step.t, prefill_workers=pre, decode_workers=dec, action=action,
                           reason=reason[:1024])
            )  # fmt: skip
        except Exception:  # an event is a report: the re-split goes on without it
            log.exception("could not publish the pools event")

    def _gauges(self) -> None:
        for role, pool in self.workers.items():
            metrics.POOL_WORKERS.labels(role=role).set(len(pool))

    # -- restart and shutdown ----------------------------------------------------------------

    def discover(self) -> None:
        """Find each worker id's actor by name in either role (after a restart of the
        controller actor the deploy-time roles it was given may be stale); ids with no actor
        found keep their entry. Not during a re-split (the moving worker has no actor then)."""
        if self.resplitting():
            return
        for wid in sorted({*self.workers["prefill"], *self.workers["decode"]}):
            for role in OTHER:
                handle = self.launcher.find(role, wid)
                if handle is not None:
                    self.workers[OTHER[role]].pop(wid, None)
                    self.workers[role][wid] = handle
                    break
        self._gauges()

    async def sync_router(self, routed: Mapping[Role, tuple[int, ...]]) -> None:
        """Put the router's pools (``routed``: its ``stats().workers``) back to the ones the
        workers serve now: a router restarted after a re-split starts from its deploy-time
        pools. Never while a re-split is moving a worker; a failed call is retried next tick."""
        if self.resplitting():
            return
        for role, serving in self.workers.items():
            have = routed.get(role)
            if have is None:
                continue
            router = self.router
            changes = [(router.remove_worker, w) for w in sorted(set(have) - set(serving))]
            changes += [(router.add_worker, w) for w in sorted(set(serving) - set(have))]
            for change, wid in changes:
                try:
                    await asyncio.wait_for(change(role, wid), self.call_timeout_s)
                except Exception as exc:
                    log.warning("router %s(%s, %s) failed: %r", change.__name__, role, wid, exc)

    def snapshot(self) -> PoolsSnapshot:
        return PoolsSnapshot(
            prefill=tuple(sorted(self.workers["prefill"])),
            decode=tuple(sorted(self.workers["decode"])),
            resplitting=self.resplitting(),
            moving=self.moving,
            completed=self.completed,
            abandoned=self.abandoned,
            cancelled=self.cancelled,
            failed=self.failed,
            steps=tuple(self.steps),
        )
