"""The data path's calls to the control-plane actors, typed (docs/design.md "Serve runtime").

An ingress replica calls two actors: the auction (its exchange and its lease) and the router
(the routing view it starts from). Each wrapper holds the actor's handle and checks that the
answer is the record the actor's method returns, so a wrong answer fails where it arrives.
The control plane's own calls to the same actors extend these in ``cluster/ray/refs.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.actor_ref import ActorRef, answer_of
from cluster.dataplane.admission import Lease
from cluster.dataplane.exchange import ExchangeIn, ExchangeOut
from cluster.dataplane.routing import RoutingView

__all__ = ["AuctionCalls", "RouterCalls"]


@dataclass(frozen=True)
class AuctionCalls:
    """The auction actor's data-path methods (``cluster/ray/auction_exchange.py``)."""

    actor: ActorRef

    async def exchange(self, message: ExchangeIn) -> ExchangeOut:
        reply = await self.actor.exchange.remote(message)
        return answer_of(ExchangeOut, reply, "the auction's exchange")

    async def lease(self, replica: str) -> Lease:
        return answer_of(Lease, await self.actor.lease.remote(replica), "the auction's lease")


@dataclass(frozen=True)
class RouterCalls:
    """The router actor's data-path method (``cluster/ray/router_actor.py``)."""

    actor: ActorRef

    async def view(self) -> RoutingView:
        return answer_of(RoutingView, await self.actor.view.remote(), "the router's view")
