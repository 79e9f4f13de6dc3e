"""The controller actor's changes out (docs/design.md §4): the newest policy to the router actor
(``set_policy(policy)``, one ``router.Policy``), the regime to the auction actor
(``set_regime``), delivered in the background and retried tick after tick.

The plain ``Controller`` calls its target's ``set_policy`` synchronously, inside its tick, so the
target (``PendingTarget``) only records the newest policy; ``PolicyPush.kick`` then starts one
background delivery. A call that fails or times out (the actor is dead or restarting) leaves
what it carried pending for the next kick, so the newest version always gets through once its
receiver is back, and the control loop never waits on a peer: the router keeps its last policy
meanwhile. Failures are counted and logged at the 1st, 2nd, 4th, 8th, ... so that a long outage
does not flood the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cluster.actor_ref import ActorRef
from cluster.ray.refs import AuctionRef, RouterRef
from router import Policy

__all__ = ["PendingTarget", "PolicyPush"]

log = logging.getLogger(__name__)


class PendingTarget:
    """The Controller's target: remembers the newest policy for the background push."""

    def __init__(self) -> None:
        self.pending: Policy | None = None

    def set_policy(self, policy: Policy) -> None:
        self.pending = policy


class PolicyPush:
    """Delivers the pending policy to ``router`` and regime to ``auction`` (module docstring);
    a handle that is None has nobody to tell, so nothing stays pending for it."""

    def __init__(self, router: ActorRef | None, auction: ActorRef | None, timeout_s: float) -> None:
        self.router = RouterRef(router) if router is not None else None
        self.auction = AuctionRef(auction) if auction is not None else None
        self.timeout_s = timeout_s
        self.target = PendingTarget()
        self.regime_pending: str | None = None
        self.delivered_version = 0  # newest version the router acknowledged
        self.delivered_regime: str | None = None  # newest regime the auction acknowledged
        self.failures = 0
        self.task: asyncio.Task[None] | None = None

    def regime_changed(self, label: str) -> None:
        self.regime_pending = label

    def kick(self) -> None:
        """Start a delivery unless nothing is pending or one is under way."""
        if self.target.pending is None and self.regime_pending is None:
            return
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.push())

    async def push(self) -> None:
        """Deliver the pending policy and regime; what fails stays pending for the next kick."""
        policy = self.target.pending
        router = self.router
        if policy is not None and await self.deliver(
            None if router is None else (lambda: router.set_policy(policy)), f"set_policy({policy})"
        ):
            self.delivered_version = policy.version if self.router is not None else 0
            if self.target.pending == policy:  # a newer one may have come meanwhile
                self.target.pending = None
        regime = self.regime_pending
        auction = self.auction
        if regime is not None and await self.deliver(
            None if auction is None else (lambda: auction.set_regime(regime)),
            f"set_regime({regime!r})",
        ):
            self.delivered_regime = regime if self.auction is not None else None
            if self.regime_pending == regime:
                self.regime_pending = None

    async def deliver(self, call: Callable[[], Awaitable[object]] | None, what: str) -> bool:
        """``call()`` (an actor call, ``what``) within the timeout: whether it went through
        (True for None: nobody to tell); a failure is counted and logged sparsely."""
        if call is None:
            return True
        try:
            await asyncio.wait_for(call(), self.timeout_s)
        except Exception as exc:
            self.failures += 1
            n = self.failures
            if n & (n - 1) == 0:  # 1st, 2nd, 4th, ...: a long outage must not flood the log
                log.warning("%s failed (%d failures so far), retrying: %r", what, n, exc)
            return False
        return True
