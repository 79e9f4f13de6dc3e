"""The simulated engines as a :class:`~cluster.serve.backend.Backend`: the replica's own router
places a request (``cluster.dataplane.replica.ReplicaRouter``, in-process), the prefill worker
actor computes the prompt, the KV transfer is slept in the engines' virtual time, and the decode
worker streams the tokens through the replica's shared stream to it
(``cluster/backends/sim/decode_streams.py``; docs/design.md "Data flow", "Tokens").
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Collection

from ray.exceptions import RayTaskError

from auction import engine_priority
from cluster.backends.sim.decode_streams import SUBMIT_TIMEOUT_S, DecodeStreams
from cluster.backends.sim.refs import PrefillWorkerRef
from cluster.backends.sim.token_streams import DecodeOrder
from cluster.dataplane.replica import ReplicaRouter
from cluster.dataplane.routing import Route
from cluster.ray.worker_handles import RAY_FAILURES, Workers, not_taking_work
from cluster.serve.backend import Excluded, Placement, WorkerFailed
from cluster.serve.path_types import PathRequest, TokenChunk
from cluster.serve.replica_metrics import routing_cost_text, view_requests_text
from cluster.sim.profile import HardwareProfile

__all__ = ["PREFILL_TIMEOUT_S", "SimBackend"]

PREFILL_TIMEOUT_S = 600.0  # ServeConfig.prefill_timeout_s's default (its reason is there)


class SimBackend:
    """The simulated prefill and decode worker actors, placed by the replica's router."""

    def __init__(
        self, *, router: ReplicaRouter, workers: Workers, profile: HardwareProfile,
        speedup: float, chunk_interval_s: float = 0.0,
        submit_timeout_s: float = SUBMIT_TIMEOUT_S, prefill_timeout_s: float = PREFILL_TIMEOUT_S,
    ) -> None:  # fmt: skip
        if not prefill_timeout_s > 0:
            raise ValueError(f"prefill_timeout_s must be > 0, got {prefill_timeout_s!r}")
        self.router, self.workers, self.profile = router, workers, profile
        self.prefill_timeout_s = prefill_timeout_s
        self.speedup = speedup
        self._calls: collections.Counter[str] | None = None  # the lifecycle's (it sets it)
        self.decode = DecodeStreams(
            workers, router.replica_id, interval_s=chunk_interval_s,
            submit_timeout_s=submit_timeout_s,
        )  # fmt: skip
        self._link_bytes_per_s = profile.link.bandwidth_gbps * 1e9 / 8
        self._routes: dict[str, Route] = {}

    @property
    def calls(self) -> collections.Counter[str] | None:
        return self._calls

    @calls.setter
    def calls(self, calls: collections.Counter[str] | None) -> None:
        self._calls = self.decode.calls = calls

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
        if route.prefill_worker is not None:
            await self._prefill(req, route, route.prefill_worker)
        order = DecodeOrder(
            req.request_id, route.prompt_tokens, tuple(route.local_hashes),
            tuple(route.seq_hashes), req.max_tokens, route.prefill_worker is None,
            engine_priority(req.bid),
        )  # fmt: skip
        async for token_ids in self.decode.tokens(route.decode_worker, order):
            yield TokenChunk(token_ids=list(token_ids))

    async def release(self, request_id: str) -> None:
        self._routes.pop(request_id, None)
        self.router.complete(request_id)

    def own_metrics_text(self) -> str:
        cost = self.router.last_cost
        text = view_requests_text(self.router.replica_id, self.router.view_requests())
        return text if cost is None else routing_cost_text(cost) + text

    async def aclose(self) -> None:
        await self.decode.aclose()
        await self.router.aclose()

    # -- the workers -------------------------------------------------------------------------

    async def _prefill(self, req: PathRequest, route: Route, worker: int) -> None:
        handle = await self.workers.get("prefill", worker)
        if handle is None:
            raise WorkerFailed("prefill", worker, "not in the pool")
        try:
            if self.calls is not None:
                self.calls["prefill"] += 1
            await asyncio.wait_for(PrefillWorkerRef(handle).prefill(
                req.request_id, route.prompt_tokens, list(route.local_hashes),
                list(route.seq_hashes), engine_priority(req.bid),
            ), self.prefill_timeout_s)  # fmt: skip
        except TimeoutError:
            # Kept in the pool (a slow engine is not a dead one); this request goes elsewhere.
            raise WorkerFailed(
                "prefill", worker, f"no answer within {self.prefill_timeout_s:g} s"
            ) from None
        except RAY_FAILURES as exc:
            self.workers.forget("prefill", worker, handle)
            raise WorkerFailed("prefill", worker, type(exc).__name__) from None
        except RayTaskError as exc:
            if not not_taking_work(exc):
                raise
            raise WorkerFailed("prefill", worker, "takes no new work (draining)") from None
        self.router.finish_prefill(req.request_id)
        # The KV crosses the link: latency + bytes / bandwidth, in the engines' virtual time.
        virtual_s = self.profile.link.latency_s + (
            route.uncached_tokens * self.profile.kv_bytes_per_token / self._link_bytes_per_s
        )
        await asyncio.sleep(virtual_s / self.speedup)
