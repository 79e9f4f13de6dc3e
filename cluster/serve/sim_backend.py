"""The simulated engines as a :class:`~cluster.serve.backend.Backend`: the replica's own router
places a request (``cluster.dataplane.replica.ReplicaRouter``, in-process), the prefill worker
actor computes the prompt, the KV transfer is slept in the engines' virtual time, and the decode
worker actor streams the tokens through a Ray streaming generator (docs/design.md "Data flow").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Collection
from typing import Any

from ray.exceptions import ActorUnschedulableError, ObjectLostError, RayActorError, RayTaskError

from cluster.dataplane.replica import ReplicaRouter
from cluster.dataplane.routing import Route
from cluster.serve.backend import Excluded, Placement, WorkerFailed
from cluster.serve.path_types import PathRequest, TokenChunk
from cluster.serve.replica_metrics import routing_cost_text, view_requests_text
from cluster.serve.worker_handles import Workers
from cluster.sim.profile import HardwareProfile

__all__ = ["RAY_FAILURES", "SimBackend", "ray_cancel"]

# A worker actor that died, is restarting, or cannot be placed. Anything else is our bug and
# propagates as a 500 with its message.
RAY_FAILURES: tuple[type[BaseException], ...] = (
    RayActorError,
    ObjectLostError,
    ActorUnschedulableError,
)
# Errors a worker raises when it takes no new work: draining for a re-split (cluster/ray/pools.py:
# the router stopped routing to it a moment ago) or shutting down. The request goes elsewhere.
_NOT_TAKING_WORK = ("EngineDraining", "EngineClosed")


def _not_taking_work(exc: RayTaskError) -> bool:
    cause = getattr(exc, "cause", None)
    return any(type(c).__name__ in _NOT_TAKING_WORK for c in (cause, exc))


class SimBackend:
    """The simulated prefill and decode worker actors, placed by the replica's router."""

    def __init__(
        self, *, router: ReplicaRouter, workers: Workers, profile: HardwareProfile,
        speedup: float, chunk_interval_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.router, self.workers, self.profile = router, workers, profile
        self.speedup = speedup
        self.chunk_interval_s = chunk_interval_s  # the decode stream's coalescing (workers.py)
        self.calls: collections.Counter[str] | None = None  # the lifecycle's (it sets it)
        self._link_bytes_per_s = profile.link.bandwidth_gbps * 1e9 / 8
        self._routes: dict[str, Route] = {}

    async def start(self) -> None:
        return None

    async def place(self, req: PathRequest, excluded: Excluded) -> Placement:
        banned: Collection[int] = [*excluded.get("decode", ()), *excluded.get("prefill", ())]
        route = self.router.route(req.request_id, req.tokens, req.user, banned)
        self._routes[req.request_id] = route
        return Placement(route.decode_worker, route.prefill_worker, route.prompt_tokens,
                         route.cached_tokens, route.policy_version, route.regime)  # fmt: skip

    async def stream(self, req: PathRequest, placement: Placement) -> AsyncIterator[TokenChunk]:
        route = self._routes[req.request_id]
        decode = self._decode(req, route, route.decode_worker, route.prefill_worker is None)
        try:
            if route.prefill_worker is not None:
                await self._prefill(req, route, route.prefill_worker)
            async for chunk in decode:
                yield chunk
        finally:
            await decode.aclose()

    async def release(self, request_id: str) -> None:
        self._routes.pop(request_id, None)
        self.router.complete(request_id)

    def own_metrics_text(self) -> str:
        cost = self.router.last_cost
        text = view_requests_text(self.router.replica_id, self.router.view_requests())
        return text if cost is None else routing_cost_text(cost) + text

    async def aclose(self) -> None:
        await self.router.aclose()

    # -- the workers -------------------------------------------------------------------------

    async def _prefill(self, req: PathRequest, route: Route, worker: int) -> None:
        handle = await self.workers.get("prefill", worker)
        if handle is None:
            raise WorkerFailed("prefill", worker, "not in the pool")
        try:
            if self.calls is not None:
                self.calls["prefill"] += 1
            await handle.prefill.remote(
                req.request_id, route.prompt_tokens, list(route.local_hashes),
                list(route.seq_hashes),
            )  # fmt: skip
        except RAY_FAILURES as exc:
            self.workers.forget("prefill", worker, handle)
            raise WorkerFailed("prefill", worker, type(exc).__name__) from None
        except RayTaskError as exc:
            if not _not_taking_work(exc):
                raise
            raise WorkerFailed("prefill", worker, "takes no new work (draining)") from None
        self.router.finish_prefill(req.request_id)
        # The KV crosses the link: latency + bytes / bandwidth, in the engines' virtual time.
        virtual_s = self.profile.link.latency_s + (
            route.uncached_tokens * self.profile.kv_bytes_per_token / self._link_bytes_per_s
        )
        await asyncio.sleep(virtual_s / self.speedup)

    async def _decode(
        self, req: PathRequest, route: Route, worker: int, prefill_locally: bool
    ) -> AsyncGenerator[TokenChunk, None]:
        handle = await self.workers.get("decode", worker)
        if handle is None:
            raise WorkerFailed("decode", worker, "not in the pool")
        refs = handle.generate.remote(
            req.request_id, route.prompt_tokens, list(route.local_hashes),
            list(route.seq_hashes), req.max_tokens, prefill_locally, self.chunk_interval_s,
        )  # fmt: skip
        try:
            async for ref in refs:
                try:
                    chunk = await ref
                except RAY_FAILURES as exc:
                    self.workers.forget("decode", worker, handle)
                    raise WorkerFailed("decode", worker, type(exc).__name__) from None
                except RayTaskError as exc:
                    if not _not_taking_work(exc):
                        raise
                    raise WorkerFailed("decode", worker, "takes no new work (draining)") from None
                yield TokenChunk(token_ids=[int(token[1]) for token in chunk])
        except RAY_FAILURES as exc:
            self.workers.forget("decode", worker, handle)
            raise WorkerFailed("decode", worker, type(exc).__name__) from None
        finally:
            # A consumer that stops (client gone) cancels the worker's generator, which
            # withdraws the sequence from the engine.
            ray_cancel(refs)


def ray_cancel(refs: Any) -> None:
    import ray

    # Outside a Ray session there is nothing to cancel; calling ray.cancel there would start
    # a local Ray of its own (Ray's API auto-initialises).
    if not ray.is_initialized():
        return
    # Already finished, or the actor is gone: nothing is left to cancel.
    with contextlib.suppress(Exception):
        ray.cancel(refs)
