"""The auction actor reached in-process the way an ingress replica reaches it: through an
``AuctionLink`` over a stand-in handle (no Ray)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from auction.admission import Release
from cluster.dataplane.auction_link import AuctionLink
from cluster.ray.auction_actor import AuctionActor


class InProcess:
    """An actor object as a handle: ``handle.method.remote(...)`` is the coroutine."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.calls = 0

    def __getattr__(self, name: str) -> SimpleNamespace:
        method = getattr(self.actor, name)

        def remote(*args: Any) -> Any:
            self.calls += 1
            return method(*args)

        return SimpleNamespace(remote=remote)


class Replica:
    """One replica's requests at ``actor``: ``admit`` → ``started`` → ``finished``, each as the
    request path makes it (``cluster/serve/path.py``), over the batched exchange."""

    def __init__(
        self, actor: AuctionActor, name: str = "r1", period_s: float = 0.002,
        lease_id: Callable[[], str | None] = lambda: None,
    ) -> None:  # fmt: skip
        """``lease_id``: the replica's lease while its share ran over (sent with its bids)."""
        self.actor = actor
        self.link = AuctionLink(InProcess(actor), name, period_s=period_s, lease_id=lease_id)

    async def admit(self, request_id: str, user: str, bid: float, tokens: list[int]) -> Release:
        """The release, or the ``Refusal`` a client reads (its HTTP status and code)."""
        return await self.link.admit(request_id, user, bid, tokens)

    async def started(self, request_id: str) -> None:
        """First token: told to the auction by the next exchange, made here."""
        self.link.started(request_id)
        await self.link.exchange_once()

    async def finished(self, request_id: str, answered: bool) -> float:
        """What was charged: the price if answered and auctioned, else nothing."""
        return await self.link.settle(request_id, answered)

    async def aclose(self) -> None:
        await self.link.aclose()
