"""The other ingress replicas' loads, as their reports say (docs/design.md "Data flow").

Each replica routes with its own view: its own in-flight requests exactly, plus what the other
replicas hold. Those arrive as absolute per-worker reports (``cluster.events.LoadEvent``), each
valid for its ``ttl_s``: a replica that dies stops reporting, and its load leaves every other
view when its last report expires. A newer report of a replica replaces its older one, so a lost
report costs nothing but staleness.

Bounded: at most :data:`MAX_PEERS` replicas are remembered. A report from a new name when the
map is full takes the place of the one reported least recently (which, every report having the
same TTL, expires first), so a publisher inventing a million replica names costs a fixed amount
of memory; the real replicas, which report every period, come back at their next report.

``PeerLoads`` is a plain object: the caller passes ``now`` (seconds on any monotonic clock).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from cluster.dataplane.routing import ROLES, Role
from router import LoadView

__all__ = ["MAX_PEERS", "PeerLoads", "PeerReport", "ReportGate"]

# Serve runs tens of ingress replicas per deployment at most; ten times that is no constraint.
MAX_PEERS = 512


class ReportGate:
    """When a load report is worth sending (a replica's, an engine's): when what it says changed,
    or as a heartbeat once a third of its ``ttl_s`` has passed, so an idle publisher stays in
    the views through two lost messages without a message every period."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._last: object = None
        self._at = -math.inf

    def due(self, key: object, now: float) -> bool:
        return key != self._last or now - self._at >= self.ttl_s / 3

    def sent(self, key: object, now: float) -> None:
        self._last, self._at = key, now


@dataclass(frozen=True, slots=True)
class PeerReport:
    """One replica's loads per role and worker, and its cumulative routing counters."""

    replica: str
    loads: Mapping[Role, Mapping[int, LoadView]]
    routed: int
    retries: int
    routed_to: Mapping[Role, Mapping[int, int]]
    expires: float


class PeerLoads:
    """The latest unexpired report of every other replica."""

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self._reports: dict[str, PeerReport] = {}
        self.max_peers = max_peers
        self.evicted = 0  # reports that made room for a new name (a count, for the metrics)

    def update(self, report: PeerReport) -> None:
        reports = self._reports  # in the order last reported: the first is the stalest
        if reports.pop(report.replica, None) is None and len(reports) >= self.max_peers:
            del reports[next(iter(reports))]
            self.evicted += 1
        reports[report.replica] = report

    def __len__(self) -> int:
        return len(self._reports)

    def expire(self, now: float) -> list[str]:
        """Forget the reports past their TTL; the replicas they came from."""
        gone = [r for r, rep in self._reports.items() if rep.expires <= now]
        for replica in gone:
            del self._reports[replica]
        return gone

    def replicas(self) -> tuple[str, ...]:
        return tuple(sorted(self._reports))

    def totals(self, role: Role) -> dict[int, LoadView]:
        """Σ over replicas of their loads on each worker of ``role``."""
        out: dict[int, list[int]] = {}
        for report in self._reports.values():
            for worker, view in report.loads.get(role, {}).items():
                acc = out.setdefault(worker, [0, 0, 0])
                acc[0] += view.active_prefill_tokens
                acc[1] += view.active_decode_blocks
                acc[2] += view.active_requests
        return {w: LoadView(*acc) for w, acc in out.items()}

    def routed_by_replica(self) -> dict[str, int]:
        """Requests each reporting replica has routed (its last report's count)."""
        return {replica: r.routed for replica, r in sorted(self._reports.items())}

    def counters(self) -> tuple[int, int, dict[Role, dict[int, int]]]:
        """(routed, retries, routed_to) summed over the replicas reporting."""
        routed = sum(r.routed for r in self._reports.values())
        retries = sum(r.retries for r in self._reports.values())
        routed_to: dict[Role, dict[int, int]] = {role: {} for role in ROLES}
        for report in self._reports.values():
            for role, counts in report.routed_to.items():
                for worker, n in counts.items():
                    routed_to[role][worker] = routed_to[role].get(worker, 0) + n
        return routed, retries, routed_to
