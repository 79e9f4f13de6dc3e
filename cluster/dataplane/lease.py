"""Keeping a replica's admission lease (cluster/dataplane/admission.py) by heartbeat.

The replica asks the auction actor for its lease at start and then every third of the lease's
TTL. A renewal that fails (the auction restarting) leaves the gate with what it had until that
expires; the gate then admits nothing locally and every request goes to the actor, which answers
503 while it is down, as it did before leases.
"""

from __future__ import annotations

import asyncio

from cluster.actor_ref import ActorRef
from cluster.dataplane.admission import AdmissionGate
from cluster.dataplane.calls import FailureCount, ask, detached_task
from cluster.dataplane.refs import AuctionCalls

__all__ = ["LeaseKeeper"]

CALL_TIMEOUT_S = 2.0


class LeaseKeeper:
    """Renews ``gate``'s lease from the auction actor ``auction`` for replica ``replica``."""

    def __init__(self, gate: AdmissionGate, auction: ActorRef, replica: str) -> None:
        self.gate, self.auction, self.replica = gate, AuctionCalls(auction), replica
        self.renewals = 0
        self._failures = FailureCount("lease renewal")
        self._task: asyncio.Task[None] | None = None

    @property
    def failures(self) -> int:
        return self._failures.n

    async def renew(self) -> bool:
        lease = await ask(lambda: self.auction.lease(self.replica), CALL_TIMEOUT_S,
                          self._failures)  # fmt: skip
        if lease is None:
            return False
        self.gate.grant(lease)
        self.renewals += 1
        return True

    async def start(self) -> None:
        """The first lease (awaited, so the replica admits locally from its first request),
        then the heartbeat."""
        await self.renew()
        self._task = detached_task(self._beat(), name="lease")

    async def _beat(self) -> None:
        while True:
            lease = self.gate.lease
            ttl = lease.ttl_s if lease is not None else 3.0
            await asyncio.sleep(ttl / 3)
            await self.renew()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
            self._task = None
