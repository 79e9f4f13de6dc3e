"""The request path of the simulated backend (docs/design.md "Data flow (serve mode)"):

    admit (auction) → route (in-process) → [prefill → KV transfer] → decode stream → finish

Routing happens in the ingress replica (``cluster.dataplane.replica.ReplicaRouter``): no actor
call. Admission too, under the auction's lease (``cluster.dataplane.admission``); a request the
lease does not cover queues at the auction through the replica's batched exchange
(``cluster.dataplane.auction_link``), which also carries its first token and its settlement. The
workers' prefill and decode are the actor calls left on the path. The path
keeps no state beyond the request in hand and its replica's routing view, so any number of
ingress replicas run it side by side. Failures are handled where they happen:

- a worker that dies before the first token is excluded and the request is routed once more
  (one retry, then 503); a decode worker that dies mid-stream ends the stream with an error
  (tokens already sent cannot be taken back), and the request is not charged;
- the routing view's and the auction's bookkeeping is always closed (``complete``,
  ``finished``), on success, error and client disconnect alike, so no slot, reservation or hold
  leaks;
- events (route, first_token, complete) are published best-effort: a NATS outage never fails a
  request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any

from ray.exceptions import (
    ActorUnschedulableError,
    ObjectLostError,
    RayActorError,
    RayTaskError,
)

from cluster.dataplane.admission import AdmissionGate
from cluster.dataplane.auction_link import AuctionLink
from cluster.dataplane.exchange import Refusal
from cluster.dataplane.lease import LeaseKeeper
from cluster.dataplane.replica import ReplicaRouter
from cluster.dataplane.routing import Route
from cluster.events import CompleteEvent, FirstTokenEvent
from cluster.ray.actor_support import ActorBus
from cluster.ray.metrics_export import merge_metrics_texts
from cluster.serve.path_types import (
    Admitted,
    Finished,
    PathError,
    PathEvent,
    PathRequest,
    Routed,
    TokenChunk,
)
from cluster.serve.worker_handles import Workers
from cluster.sim.profile import HardwareProfile

__all__ = ["ActorRequestPath", "WorkerFailed", "Workers"]

METRICS_TIMEOUT_S = 1.0

log = logging.getLogger(__name__)

# A worker actor that died, is restarting, or cannot be placed. Anything else is our bug and
# propagates as a 500 with its message.
_RAY_FAILURES: tuple[type[BaseException], ...] = (
    RayActorError,
    ObjectLostError,
    ActorUnschedulableError,
)


class WorkerFailed(Exception):  # noqa: N818  (a state, not a bug: "the worker failed")
    """A worker could not serve this request; ``worker`` is excluded when it is routed again."""

    def __init__(self, role: str, worker: int, why: str) -> None:
        super().__init__(f"{role} worker {worker}: {why}")
        self.role, self.worker = role, worker


# Errors a worker raises when it takes no new work: draining for a re-split (cluster/ray/pools.py:
# the router stopped routing to it a moment ago) or shutting down. The request goes elsewhere.
_NOT_TAKING_WORK = ("EngineDraining", "EngineClosed")


def _not_taking_work(exc: RayTaskError) -> bool:
    cause = getattr(exc, "cause", None)
    return any(type(c).__name__ in _NOT_TAKING_WORK for c in (cause, exc))


class ActorRequestPath:
    """A :class:`cluster.serve.path_types.RequestPath` over the service's actors."""

    def __init__(
        self,
        *,
        auction: Any,
        router: ReplicaRouter,
        workers: Workers,
        profile: HardwareProfile,
        speedup: float,
        bus: ActorBus | None = None,
        extra_metrics: tuple[Any, ...] = (),
        chunk_interval_s: float = 0.0,
        gate: AdmissionGate | None = None,
        exchange_period_s: float = 0.1,
        replica: str | None = None,
    ) -> None:
        self.auction = auction
        # Local FCFS admission under the auction's lease; None: every request asks the actor.
        self.gate = gate
        self.keeper: LeaseKeeper | None = None  # renews the gate's lease (replica_path.py)
        self.router = router
        self.workers = workers
        self.profile = profile
        self.speedup = speedup
        self.bus = bus
        self.extra_metrics = extra_metrics  # the router, PoA and controller actors: metrics only
        self.chunk_interval_s = chunk_interval_s  # the decode stream's coalescing (workers.py)
        self._link_bytes_per_s = profile.link.bandwidth_gbps * 1e9 / 8
        self._background: set[asyncio.Task[None]] = set()
        # Unary actor calls made for requests, by method (the decode stream is not one): what
        # bench.ingress divides by its requests (disagg_ingress_actor_calls_total).
        self.calls: collections.Counter[str] = collections.Counter()
        self.link = AuctionLink(
            auction, replica or router.replica_id, period_s=exchange_period_s, calls=self.calls,
            lease_id=self._overflowed_lease,
        )  # fmt: skip

    def _overflowed_lease(self) -> str | None:
        gate = self.gate
        return gate.lease.lease_id if gate and gate.overflowed and gate.lease else None

    async def run(self, req: PathRequest) -> AsyncIterator[PathEvent]:
        t0 = time.time()
        gate = self.gate
        if gate is not None and gate.try_admit(req.request_id, req.user, req.bid) is not None:
            yield Admitted(position=0, payment=0.0, batch_id=None, mode="fcfs")
        else:
            yield await self._admit(req)
        answered = False
        charged = 0.0
        try:
            async for event in self._serve(req, t0):
                yield event
            answered = True
        finally:
            # Shielded: a client disconnect cancels this generator, but the books must close.
            charged = await asyncio.shield(self._close_books(req, answered))
        yield Finished(payment_charged=charged)

    async def _admit(self, req: PathRequest) -> Admitted:
        """The auction's admission (through the replica's exchange): its hold, its queue, its
        order and price."""
        try:
            release = await self.link.admit(req.request_id, req.user, req.bid, req.tokens)
        except Refusal as refusal:
            raise PathError(refusal.status, refusal.message) from None
        return Admitted(release.position, release.payment, release.batch_id, release.mode)

    # -- the steps ---------------------------------------------------------------------------

    async def _serve(self, req: PathRequest, t0: float) -> AsyncIterator[PathEvent]:
        excluded: list[int] = []
        for attempt in (0, 1):
            try:
                route = self.router.route(req.request_id, req.tokens, req.user, excluded)
            except ValueError as exc:  # every worker excluded, or a request it cannot route
                raise PathError(503, f"no worker to route to: {exc}") from None
            decode_id = route.decode_worker
            prefill_id = route.prefill_worker
            stream = self._decode(req, route, decode_id, prefill_id is None)
            try:
                if prefill_id is not None:
                    await self._prefill(req, route, prefill_id)
                first = await anext(stream)
            except WorkerFailed as exc:
                log.warning("request %s: %s", req.request_id, exc)
                await stream.aclose()
                self.router.complete(req.request_id)
                if attempt == 1:
                    raise PathError(503, f"{exc}; failed on retry too") from None
                excluded.append(exc.worker)
                continue
            except StopAsyncIteration:
                raise PathError(503, f"decode worker {decode_id} produced no token") from None
            yield Routed(
                decode_worker=decode_id,
                prefill_worker=prefill_id,
                policy_version=route.policy_version,
                regime=route.regime,
                cached_tokens=route.cached_tokens,
            )
            ttft = time.time() - t0
            self._first_token(req, decode_id, prefill_id, ttft)
            yield first
            try:
                async for chunk in stream:
                    yield chunk
            except WorkerFailed as exc:
                raise PathError(503, f"{exc} mid-stream") from None
            self._publish_complete(req, route, ttft, t0)
            return

    async def _prefill(self, req: PathRequest, route: Route, worker: int) -> None:
        handle = await self.workers.get("prefill", worker)
        if handle is None:
            raise WorkerFailed("prefill", worker, "not in the pool")
        try:
            self.calls["prefill"] += 1
            await handle.prefill.remote(
                req.request_id, route.prompt_tokens, list(route.local_hashes),
                list(route.seq_hashes),
            )  # fmt: skip
        except _RAY_FAILURES as exc:
            self.workers.forget("prefill", worker, handle)
            raise WorkerFailed("prefill", worker, type(exc).__name__) from None
        except RayTaskError as exc:
            if not _not_taking_work(exc):
                raise
            raise WorkerFailed("prefill", worker, "takes no new work (draining)") from None
        self.router.finish_prefill(req.request_id)
        # The KV crosses the link: latency + bytes / bandwidth, in the engines' virtual time.
        missing = route.uncached_tokens
        virtual_s = self.profile.link.latency_s + (
            missing * self.profile.kv_bytes_per_token / self._link_bytes_per_s
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
                except _RAY_FAILURES as exc:
                    self.workers.forget("decode", worker, handle)
                    raise WorkerFailed("decode", worker, type(exc).__name__) from None
                except RayTaskError as exc:
                    if not _not_taking_work(exc):
                        raise
                    raise WorkerFailed("decode", worker, "takes no new work (draining)") from None
                yield TokenChunk(token_ids=[int(token[1]) for token in chunk])
        except _RAY_FAILURES as exc:
            self.workers.forget("decode", worker, handle)
            raise WorkerFailed("decode", worker, type(exc).__name__) from None
        finally:
            # A consumer that stops (client gone) cancels the worker's generator, which
            # withdraws the sequence from the engine.
            ray_cancel(refs)

    # -- what the ingress asks of its path ---------------------------------------------------

    async def metrics_text(self) -> str:
        """Every actor's own metric families, merged (docs/design.md §5: one ``/metrics``).
        An actor that does not answer within a second is left out of this scrape."""
        workers = self.workers.handles()
        actors = [self.auction, *self.extra_metrics, *(h for _, _, h in workers)]
        refs = [a.metrics_text.remote() for a in actors]
        done = await asyncio.gather(
            *(asyncio.wait_for(_awaitable(r), METRICS_TIMEOUT_S) for r in refs),
            return_exceptions=True,
        )
        fixed = len(actors) - len(workers)
        for (role, worker, handle), result in zip(workers, done[fixed:], strict=True):
            if isinstance(result, RayActorError):  # stopped by a re-split, or dead: look again
                self.workers.forget(role, worker, handle)
        # First in the merge: this replica's gauges win over the actors' (they no longer route).
        return merge_metrics_texts([self.own_metrics_text(),
                                    *(t for t in done if isinstance(t, str))])  # fmt: skip

    def own_metrics_text(self) -> str:
        """What this replica counts itself: its actor calls, its last routing cost."""
        cost = self.router.last_cost
        return actor_calls_text(self.calls) + ("" if cost is None else routing_cost_text(cost))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run bookkeeping in the background, kept until done (``settle`` waits for it)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self) -> None:
        """Wait for the bookkeeping calls this path runs in the background (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def aclose(self) -> None:
        if self.keeper is not None:
            await self.keeper.aclose()
        await self.link.aclose()
        await self.router.aclose()
        for task in list(self._background):
            task.cancel()
        if self.bus is not None:
            await self.bus.close()

    # -- books and events --------------------------------------------------------------------

    async def _release_route(self, request_id: str) -> None:
        self.router.complete(request_id)

    async def _close_books(self, req: PathRequest, answered: bool) -> float:
        """Release the routing reservation (idempotent) and settle the auction's hold:
        capture the payment if the request was answered, release it otherwise."""
        await self._release_route(req.request_id)
        if self.gate is not None and self.gate.is_local(req.request_id):
            self.gate.finished(req.request_id)  # admitted here, FCFS: nothing held, nothing due
            return 0.0
        return await self.link.settle(req.request_id, answered)

    def _first_token(
        self, req: PathRequest, decode_id: int, prefill_id: int | None, ttft: float
    ) -> None:
        """The auction learns the prefill slot is free; in the background, so the first token
        does not wait for it. Should it reach the auction after the request's ``finished``
        (an async actor may interleave one caller's calls), it changes nothing: both free the
        same slot, idempotently."""
        if self.gate is not None and self.gate.is_local(req.request_id):
            self.gate.started(req.request_id)
        else:
            self.link.started(req.request_id)
        if self.bus is not None:
            self.bus.publish(
                FirstTokenEvent(
                    request_id=req.request_id, t=time.time(), worker_id=decode_id,
                    prefill_worker_id=prefill_id, ttft_s=ttft,
                )
            )  # fmt: skip

    def _publish_complete(self, req: PathRequest, route: Route, ttft: float, t0: float) -> None:
        if self.bus is not None:
            self.bus.publish(
                complete_event(
                    req, t0, ttft, route.decode_worker, route.prefill_worker,
                    route.prompt_tokens, route.cached_tokens,
                )
            )  # fmt: skip


def complete_event(
    req: PathRequest, t0: float, ttft: float, decode_id: int, prefill_id: int | None,
    prompt_tokens: int, cached_tokens: int,
) -> CompleteEvent:  # fmt: skip
    """The ``complete`` event of an answered request that started at wall time ``t0``."""
    e2e = time.time() - t0
    outputs = max(1, req.max_tokens)
    return CompleteEvent(
        request_id=req.request_id, t=time.time(), worker_id=decode_id,
        prefill_worker_id=prefill_id, ttft_s=ttft, itl_s=(e2e - ttft) / max(1, outputs - 1),
        e2e_s=e2e, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
        output_tokens=outputs, status="ok",
    )  # fmt: skip


async def _awaitable(ref: Any) -> Any:
    return await ref


ACTOR_CALLS = "disagg_ingress_actor_calls_total"


def actor_calls_text(calls: collections.Counter[str]) -> str:
    """This replica's unary actor calls on requests' paths, as Prometheus text."""
    lines = [
        f"# HELP {ACTOR_CALLS} Unary Ray actor calls this ingress replica made for requests.",
        f"# TYPE {ACTOR_CALLS} counter",
    ]
    lines += [f'{ACTOR_CALLS}{{method="{m}"}} {n}' for m, n in sorted(calls.items())]
    return "\n".join(lines) + "\n"


def routing_cost_text(cost: float) -> str:
    """``disagg_routing_cost``: the chosen worker's cost in this replica's last decision."""
    return (
        "# HELP disagg_routing_cost Cost of the chosen worker in the last decision\n"
        "# TYPE disagg_routing_cost gauge\n"
        f"disagg_routing_cost {cost!r}\n"
    )


def ray_cancel(refs: Any) -> None:
    import ray

    # Outside a Ray session there is nothing to cancel; calling ray.cancel there would start
    # a local Ray of its own (Ray's API auto-initialises).
    if not ray.is_initialized():
        return
    # Already finished, or the actor is gone: nothing is left to cancel.
    with contextlib.suppress(Exception):
        ray.cancel(refs)
