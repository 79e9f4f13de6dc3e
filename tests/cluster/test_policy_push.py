"""The controller actor's changes out (cluster/ray/policy_push.py): what fails stays pending
and goes out on a later kick; the newest policy wins; nobody to tell is not a failure."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.ray.policy_push import PolicyPush
from router import Policy


class _Method:
    def __init__(self, owner: _Peer, name: str) -> None:
        self.owner, self.name = owner, name

    async def remote(self, *args: Any) -> None:
        if self.owner.down:
            raise ConnectionError("actor restarting")
        self.owner.calls.append((self.name, *args))


class _Peer:
    """A router or auction actor handle that can be down."""

    def __init__(self) -> None:
        self.down = False
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


def test_a_failed_delivery_stays_pending_and_the_newest_policy_goes_out_once_back() -> None:
    async def scenario() -> None:
        router, auction = _Peer(), _Peer()
        push = PolicyPush(router, auction, timeout_s=1.0)
        router.down = auction.down = True
        push.target.set_policy(Policy(0.8, 0.1, 2, "saturated"))
        push.regime_changed("saturated")
        await push.push()
        assert push.target.pending == Policy(0.8, 0.1, 2, "saturated") and push.regime_pending
        assert push.failures == 2 and push.delivered_version == 0
        newest = Policy(0.0, 1.0, 3, "saturated")
        push.target.set_policy(newest)  # a newer one while the router is down
        router.down = auction.down = False
        push.kick()
        assert push.task is not None
        await push.task
        assert router.calls == [("set_policy", newest)]
        assert auction.calls == [("set_regime", "saturated")]
        assert push.target.pending is None and push.regime_pending is None
        assert (push.delivered_version, push.delivered_regime) == (3, "saturated")
        push.kick()  # nothing pending: no delivery starts
        assert push.task.done() and router.calls == [("set_policy", newest)]

    asyncio.run(scenario())


def test_without_a_receiver_nothing_stays_pending_and_nothing_fails() -> None:
    async def scenario() -> None:
        push = PolicyPush(None, None, timeout_s=1.0)
        push.target.set_policy(Policy(0.0, 1.0, 1))
        push.regime_changed("below")
        await push.push()
        assert push.target.pending is None and push.regime_pending is None
        assert (push.failures, push.delivered_version, push.delivered_regime) == (0, 0, None)

    asyncio.run(scenario())
