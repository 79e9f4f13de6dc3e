"""The engines' own load snapshots, and how they correct a replica's view (docs/design.md "Data
flow", "Router replicas").

A replica's view of worker w holds its own reservations o_w exactly and the other replicas'
reports p_w (``peers.py``). Both are routers' bookkeeping: the requests of a router that died
keep running on the engine, but leave every view when its last report expires. Each worker's
engine publishes what it holds, e_w (``EngineLoadEvent``: prefill tokens queued, decode blocks,
requests running or queued), and the view takes, field by field,

    m_w = max(p_w, e_w − o_w)

as the load held elsewhere: never less than the engine says others hold. A max, not a
replacement, because the snapshot lags the routers (a request routed but not yet arrived is not
in it) and because a request of this replica that the engine finished before the replica
released it makes e_w − o_w an undercount. The engine counts a sequence's output blocks as well
as its prompt's (Dynamo's count), so with long outputs e_w − o_w runs above p_w and the view
carries the engine's figure: busier workers look busier, the direction routing wants.

A snapshot is valid ``ttl_s`` after it arrives, as a report is; :class:`EngineReporter` is the
worker's side, publishing on the replicas' report schedule. :class:`EngineLoads` is a plain
object: the caller passes ``now`` (seconds on any monotonic clock).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cluster.dataplane.peers import ReportGate
from cluster.dataplane.routing import Role
from cluster.dataplane.settings import RoutingSettings
from cluster.events import EngineLoadEvent
from router import LoadView

__all__ = ["EngineLoads", "EngineReporter", "EngineSnapshot", "engine_snapshot"]

log = logging.getLogger(__name__)

# The workers report on the replicas' schedule (the serve config's ``routing:`` defaults).
REPORT_PERIOD_S = RoutingSettings().report_period_s
REPORT_TTL_S = RoutingSettings().report_ttl_s

IDLE = LoadView(0, 0, 0)


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What worker ``worker`` (in ``role``) held at its last snapshot, valid until ``expires``."""

    worker: int
    role: Role
    load: LoadView
    expires: float


def engine_snapshot(event: EngineLoadEvent, now: float) -> EngineSnapshot:
    """An ``engine_load`` event as the view counts it: valid ``ttl_s`` from its arrival."""
    load = LoadView(event.prefill_tokens, event.decode_blocks, event.requests)
    return EngineSnapshot(event.worker_id, event.role, load, now + event.ttl_s)


class EngineLoads:
    """The latest unexpired snapshot of every worker's engine."""

    def __init__(self) -> None:
        self._latest: dict[int, EngineSnapshot] = {}

    def update(self, snapshot: EngineSnapshot) -> None:
        self._latest[snapshot.worker] = snapshot

    def expire(self, now: float) -> None:
        for worker in [w for w, s in self._latest.items() if s.expires <= now]:
            del self._latest[worker]

    def __len__(self) -> int:
        return len(self._latest)

    def corrected(
        self, role: Role, peers: Mapping[int, LoadView], own: Mapping[int, LoadView]
    ) -> dict[int, LoadView]:
        """m_w = max(p_w, e_w − o_w) per field for ``role``'s workers with a snapshot, p_w for
        the rest (module docstring)."""
        out = dict(peers)
        for worker, snap in self._latest.items():
            if snap.role != role:
                continue  # a snapshot from before the worker changed role
            p, e, o = peers.get(worker, IDLE), snap.load, own.get(worker, IDLE)
            out[worker] = LoadView(
                max(p.active_prefill_tokens, e.active_prefill_tokens - o.active_prefill_tokens),
                max(p.active_decode_blocks, e.active_decode_blocks - o.active_decode_blocks),
                max(p.active_requests, e.active_requests - o.active_requests),
            )
        return out


class EngineReporter:
    """A worker's side: publish its engine's snapshot every ``period_s`` when it changed, or as a
    heartbeat once a third of ``ttl_s`` has passed (an idle worker stays in the views without a
    message every period). ``load()`` answers (prefill tokens, decode blocks, requests)."""

    def __init__(
        self, worker_id: int, role: Role, load: Callable[[], tuple[int, int, int]],
        publish: Callable[[EngineLoadEvent], object], *, period_s: float = REPORT_PERIOD_S,
        ttl_s: float = REPORT_TTL_S, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.worker_id, self.role = worker_id, role
        self.load, self.publish = load, publish
        self.period_s, self.ttl_s, self.clock = period_s, ttl_s, clock
        self._gate = ReportGate(ttl_s)
        self.reports = 0

    def report(self) -> bool:
        """Publish the snapshot if it changed or a heartbeat is due; True if published."""
        now, load = self.clock(), self.load()
        if not self._gate.due(load, now):
            return False
        prefill_tokens, decode_blocks, requests = load
        self.publish(EngineLoadEvent(
            worker_id=self.worker_id, role=self.role, t=time.time(), ttl_s=self.ttl_s,
            prefill_tokens=prefill_tokens, decode_blocks=decode_blocks, requests=requests,
        ))  # fmt: skip
        self._gate.sent(load, now)
        self.reports += 1
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                self.report()
            except Exception:  # best-effort, as the replicas' reports: the next period retries
                log.exception("engine load report failed")
