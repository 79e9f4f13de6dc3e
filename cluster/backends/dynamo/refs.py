"""A Dynamo worker actor's methods its starters call, typed (docs/design.md "Serve runtime")."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.actor_ref import ActorRef, answer_of
from cluster.backends.dynamo.worker_actor import EngineProcess

__all__ = ["DynamoWorkerRef"]


@dataclass(frozen=True)
class DynamoWorkerRef:
    """A :class:`cluster.backends.dynamo.worker_actor.DynamoWorkerActor`."""

    actor: ActorRef

    async def attach(self, router: ActorRef) -> None:
        """Tell it the router to bind each new instance id at."""
        await self.actor.attach.remote(router)

    async def start(self) -> EngineProcess:
        """Start its process; what runs once it serves."""
        answer = await self.actor.start.remote()
        return answer_of(EngineProcess, answer, "a Dynamo worker's start()")
