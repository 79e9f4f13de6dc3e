"""The simulated workers' methods the request path calls, typed (docs/design.md "Serve runtime").

Thin wrappers over a worker's Ray handle (:class:`cluster.actor_ref.ActorRef`), one per role;
the worker classes are ``cluster/backends/sim/workers.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

from cluster.actor_ref import ActorRef, answer_of, stream_method
from cluster.backends.sim.token_streams import DecodeOrder

__all__ = ["DecodeWorkerRef", "PrefillWorkerRef"]


@dataclass(frozen=True)
class PrefillWorkerRef:
    """A prefill worker (``PrefillWorkerActor``)."""

    actor: ActorRef

    async def prefill(
        self, request_id: str, prompt_tokens: int, local_hashes: list[int],
        seq_hashes: list[int], priority: int,
    ) -> None:  # fmt: skip
        """Returns once the prompt's KV is on the worker (what it answers, the path needs not)."""
        await self.actor.prefill.remote(
            request_id, prompt_tokens, local_hashes, seq_hashes, priority
        )


@dataclass(frozen=True)
class DecodeWorkerRef:
    """A decode worker (``DecodeWorkerActor``): one token stream per replica, orders in batches."""

    actor: ActorRef

    def frames(self, stream_id: str, interval_s: float) -> AsyncIterator[Awaitable[object]]:
        """The stream's frames as Ray streams them: cancel it with ``ray_cancel``."""
        return stream_method(self.actor, "frames").remote(stream_id, interval_s)

    async def submit(
        self, stream_id: str, orders: list[DecodeOrder], withdrawn: list[str]
    ) -> list[str | None]:
        """Per order None, or why the worker refused it."""
        answer = await self.actor.submit.remote(stream_id, orders, withdrawn)
        refused: list[str | None] = answer_of(list, answer, "a decode worker's submit")
        return refused
