"""The control plane's calls to its actors, typed (docs/design.md "Serve runtime").

One thin wrapper per actor over its Ray handle (:class:`cluster.actor_ref.ActorRef`): each
method awaits ``handle.<method>.remote(...)`` and checks that the answer is the record the
actor's method returns (``cluster.actor_ref.answer_of``). The router's and the auction's extend
the data path's wrappers (``cluster/dataplane/refs.py``) with their control-plane methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from cluster.actor_ref import ActorRef, answer_of
from cluster.dataplane.refs import AuctionCalls, RouterCalls
from cluster.ray.status import AuctionStats, PoaSnapshot, RouterStats
from router import Policy

__all__ = [
    "AuctionRef",
    "ControlRef",
    "PoaRef",
    "RouterRef",
    "WorkerRef",
    "get_answer",
    "get_answers",
    "kill_actor",
]

T = TypeVar("T")


class _Lifecycle:
    """What every actor of the service answers (``cluster/ray/actor_support.py``)."""

    actor: ActorRef

    async def metrics_text(self) -> str:
        return answer_of(str, await self.actor.metrics_text.remote(), "metrics_text()")

    async def shutdown(self) -> None:
        await self.actor.shutdown.remote()


@dataclass(frozen=True)
class ControlRef(_Lifecycle):
    """Any actor of the service, for its lifecycle alone."""

    actor: ActorRef


@dataclass(frozen=True)
class RouterRef(RouterCalls, _Lifecycle):
    """The router actor (``cluster/ray/router_actor.py``)."""

    async def stats(self) -> RouterStats:
        return answer_of(RouterStats, await self.actor.stats.remote(), "the router's stats")

    async def set_policy(self, policy: Policy) -> None:
        await self.actor.set_policy.remote(policy)

    async def add_worker(self, role: str, worker_id: int) -> None:
        await self.actor.add_worker.remote(role, worker_id)

    async def remove_worker(self, role: str, worker_id: int) -> None:
        await self.actor.remove_worker.remote(role, worker_id)


@dataclass(frozen=True)
class AuctionRef(AuctionCalls, _Lifecycle):
    """The auction actor (``cluster/ray/auction_actor.py``)."""

    async def stats(self) -> AuctionStats:
        return answer_of(AuctionStats, await self.actor.stats.remote(), "the auction's stats")

    async def set_regime(self, regime: str) -> None:
        await self.actor.set_regime.remote(regime)

    async def set_prefill_workers(self, count: int) -> int:
        answer = await self.actor.set_prefill_workers.remote(count)
        return answer_of(int, answer, "the auction's set_prefill_workers")


@dataclass(frozen=True)
class PoaRef(_Lifecycle):
    """The PoA estimator actor (``cluster/ray/poa_actor.py``)."""

    actor: ActorRef

    async def snapshot(self) -> PoaSnapshot:
        return answer_of(PoaSnapshot, await self.actor.snapshot.remote(), "the PoA snapshot")

    async def forget_before(self, since: float) -> PoaSnapshot:
        answer = await self.actor.forget_before.remote(since)
        return answer_of(PoaSnapshot, answer, "the PoA's forget_before")


@dataclass(frozen=True)
class WorkerRef(_Lifecycle):
    """A worker actor of any backend, as the re-split moves it (``cluster/ray/pools.py``)."""

    actor: ActorRef

    async def ready(self) -> object:
        """Once it serves: a record of the backend's own (a ``Ready``, an ``EngineProcess``)."""
        return await self.actor.ready.remote()

    async def load(self) -> object:
        """What the engine holds: a record of the backend's own (``EngineLoad``,
        ``EngineInflight``), which the pools read by its type."""
        return await self.actor.load.remote()

    async def drain(self, timeout_s: float) -> bool:
        return answer_of(bool, await self.actor.drain.remote(timeout_s), "a worker's drain")

    async def resume(self) -> bool:
        return answer_of(bool, await self.actor.resume.remote(), "a worker's resume")


def get_answers(pending: Sequence[Awaitable[object]], timeout_s: float) -> list[object]:
    """``ray.get`` of calls made through :class:`ActorRef` (``ref.method.remote(...)``), for the
    driver's synchronous code; each is checked by whoever reads it, as an awaited one is."""
    import ray
    from ray import ObjectRef

    refs = [p for p in pending if isinstance(p, ObjectRef)]
    if len(refs) != len(pending):
        raise TypeError("get_answers takes Ray calls (ObjectRefs) only")
    answers: list[object] = ray.get(refs, timeout=timeout_s)
    return answers


def get_answer(pending: Awaitable[object], kind: type[T], timeout_s: float) -> T:
    """One call's answer (:func:`get_answers`), checked to be a ``kind``."""
    (answer,) = get_answers([pending], timeout_s)
    return answer_of(kind, answer, f"a call answering {kind.__name__}")


def kill_actor(actor: ActorRef) -> None:
    """``ray.kill`` without a restart; a ``NamedActor`` is killed through its handle."""
    import ray
    from ray.actor import ActorHandle

    from cluster.ray.named_actor import NamedActor

    handle = actor.handle() if isinstance(actor, NamedActor) else actor
    if not isinstance(handle, ActorHandle):
        raise TypeError(f"not a Ray actor: {actor!r}")
    ray.kill(handle, no_restart=True)
