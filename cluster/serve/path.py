"""One request's lifecycle on an ingress replica, whatever engines serve it (docs/design.md
"Data flow (serve mode)"):

    admit → place → [prefill → KV transfer] → decode stream → settle

Admission is the replica's own under the auction's lease (``cluster.dataplane.admission``); a
request the lease does not cover queues at the auction through the replica's batched exchange
(``cluster.dataplane.auction_link``), which also carries its first token and its settlement.
Placement and the tokens are the :class:`~cluster.serve.backend.Backend`'s: the simulated worker
actors (``cluster/backends/sim/backend.py``) or Dynamo's (``cluster/backends/dynamo/backend.py``).
The path
keeps no state beyond the request in hand, so any number of ingress replicas run it side by side.
Failures are handled where they happen:

- a worker that fails before the first token is excluded and the request is placed once more
  (one retry, then 503); one that fails mid-stream ends the stream with an error (tokens already
  sent cannot be taken back);
- money: the auction sells a position, which is delivered with the first token. The request's
  price is captured then, in the same exchange that frees its prefill slot, not when the stream
  ends: a client that disconnects after its first token pays what it was quoted (it cannot dodge
  the price by hanging up), and so does a stream a worker cuts later. A request that fails or is
  abandoned before its first token is released and pays nothing (docs/design.md §1, "Money");
- the backend's reservations and the auction's books are always closed (``release``,
  ``settle``), on success, error and client disconnect alike, so no slot, reservation or hold
  leaks;
- events (first_token, complete; the backend publishes the route) are best-effort: a NATS
  outage never fails a request.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Coroutine

from cluster.actor_bus import ActorBus
from cluster.actor_ref import ActorRef
from cluster.dataplane.admission import AdmissionGate
from cluster.dataplane.auction_link import AuctionLink
from cluster.dataplane.exchange import Refusal
from cluster.dataplane.lease import LeaseKeeper
from cluster.dataplane.settings import EXCHANGE_PERIOD_S
from cluster.lifecycle import Lifecycle
from cluster.ray.metrics_export import merge_metrics_texts
from cluster.ray.metrics_server import actors_metrics_text
from cluster.ray.scrape_cache import ScrapeCache
from cluster.ray.worker_handles import Workers
from cluster.serve.backend import Backend, WorkerFailed
from cluster.serve.path_types import (
    Admitted,
    Finished,
    PathError,
    PathEvent,
    PathRequest,
    Routed,
)
from cluster.serve.replica_metrics import actor_calls_text

__all__ = ["ActorRequestPath", "WorkerFailed", "Workers"]

log = logging.getLogger(__name__)


class ActorRequestPath:
    """A :class:`cluster.serve.path_types.RequestPath` over a backend and the auction."""

    def __init__(
        self,
        *,
        auction: ActorRef,
        backend: Backend,
        replica: str,
        workers: Workers | None = None,
        bus: ActorBus | None = None,
        extra_metrics: tuple[ActorRef, ...] = (),
        gate: AdmissionGate | None = None,
        exchange_period_s: float = EXCHANGE_PERIOD_S,
    ) -> None:
        self.auction = auction
        self.backend = backend
        # Local FCFS admission under the auction's lease; None: every request asks the auction.
        self.gate = gate
        self.keeper: LeaseKeeper | None = None  # renews the gate's lease (replica_path.py)
        self.workers = workers  # the worker actors, for /metrics
        self.bus = bus
        self.extra_metrics = extra_metrics  # the router, PoA and controller actors: metrics only
        self._background: set[asyncio.Task[None]] = set()
        # Unary actor calls made for requests, by method (the decode stream is not one): what
        # bench.ingress divides by its requests (disagg_ingress_actor_calls_total).
        self.calls: collections.Counter[str] = collections.Counter()
        if hasattr(backend, "calls"):
            backend.calls = self.calls
        self._actors_metrics = ScrapeCache(self._fetch_actors_metrics)  # for metrics_text
        self.link = AuctionLink(
            auction, replica, period_s=exchange_period_s, calls=self.calls,
            lease_id=self._overflowed_lease,
        )  # fmt: skip

    def _overflowed_lease(self) -> str | None:
        gate = self.gate
        return gate.lease.lease_id if gate and gate.overflowed and gate.lease else None

    async def run(self, req: PathRequest) -> AsyncIterator[PathEvent]:
        life = Lifecycle(
            req.request_id, req.user, time.time(), len(req.tokens), max(1, req.max_tokens), req.bid
        )
        gate = self.gate
        if gate is not None and gate.try_admit(req.request_id, req.user, req.bid) is not None:
            admitted = Admitted(position=0, payment=0.0, batch_id=None, mode="fcfs")
        else:
            admitted = await self._admit(req)
        life.release(time.time(), admitted.payment, admitted.batch_id)
        capture: asyncio.Task[float] | None = None
        try:
            # In the try: a client gone while its admission is in hand still closes the books.
            yield admitted
            async for event in self._serve(req, life):
                if isinstance(event, Routed):  # the first token is in hand: the position is sold
                    capture = self._capture(req)
                yield event
        except (GeneratorExit, asyncio.CancelledError):
            life.close("abandoned")  # the client went away
            raise
        except BaseException:
            life.close("failed")
            raise
        finally:
            # Shielded: a client disconnect cancels this generator, but the books must close.
            charged = await asyncio.shield(self._close_books(req, life, capture))
        yield Finished(payment_charged=charged)

    async def _admit(self, req: PathRequest) -> Admitted:
        """The auction's admission (through the replica's exchange): its hold, its queue, its
        order and price."""
        try:
            release = await self.link.admit(req.request_id, req.user, req.bid, req.tokens)
        except Refusal as refusal:
            raise PathError(refusal.status, refusal.message, refusal.code) from None
        return Admitted(release.position, release.payment, release.batch_id, release.mode)

    # -- the steps ---------------------------------------------------------------------------

    async def _serve(self, req: PathRequest, life: Lifecycle) -> AsyncIterator[PathEvent]:
        await self.backend.start()
        while True:
            try:
                placement = await self.backend.place(req, life.excluded)
            except ValueError as exc:  # every worker excluded, or a request it cannot place
                await self.backend.release(req.request_id)
                raise PathError(503, f"no worker to route to: {exc}") from None
            except WorkerFailed as exc:
                await self.backend.release(req.request_id)
                raise PathError(503, str(exc)) from None
            life.place(
                time.time(), placement.decode_worker, placement.prefill_worker,
                placement.cached_tokens,
            )  # fmt: skip
            stream = self.backend.stream(req, placement)
            try:
                first = await anext(stream)
            except WorkerFailed as exc:
                log.warning("request %s: %s", req.request_id, exc)
                await stream.aclose()  # type: ignore[attr-defined]
                await self.backend.release(req.request_id)
                if not life.worker_failed(exc.role, exc.worker):
                    raise PathError(503, f"{exc}; failed on retry too") from None
                continue
            except StopAsyncIteration:
                raise PathError(503, f"decode worker {placement.decode_worker} produced no "
                                     "token") from None  # fmt: skip
            life.start(time.time())
            yield Routed(
                decode_worker=-1 if placement.decode_worker is None else placement.decode_worker,
                prefill_worker=placement.prefill_worker,
                policy_version=placement.policy_version,
                regime=placement.regime,
                cached_tokens=placement.cached_tokens,
            )
            self._first_token(req, life)
            yield first
            try:
                async for chunk in stream:
                    yield chunk
            except WorkerFailed as exc:
                raise PathError(503, f"{exc} mid-stream") from None
            life.finish(time.time())
            if self.bus is not None and life.decode_worker is not None:
                self.bus.publish(life.complete_event())
            return

    # -- what the ingress asks of its path ---------------------------------------------------

    def own_metrics_text(self) -> str:
        """This replica's own families (its actor calls, its backend's counts): what it pushes
        to the service's metrics server (cluster/ray/metrics_server.py)."""
        return actor_calls_text(self.calls) + self.backend.own_metrics_text()

    async def metrics_text(self) -> str:
        """Every actor's own metric families, merged (docs/design.md §5: one ``/metrics``), for
        an app that serves ``/metrics`` itself: this replica's counts at every scrape, the
        actors' at most once a second."""
        # First in the merge: this replica's gauges win over the actors' (they no longer route).
        return merge_metrics_texts([self.own_metrics_text(), await self._actors_metrics.text()])

    async def _fetch_actors_metrics(self) -> str:
        """The actors' families (cluster/ray/metrics_server.py: ``actors_metrics_text``)."""
        return await actors_metrics_text([self.auction, *self.extra_metrics], self.workers)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run bookkeeping in the background, kept until done (``settle`` waits for it)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self) -> None:
        """Wait for the bookkeeping this path runs in the background (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def aclose(self) -> None:
        if self.keeper is not None:
            await self.keeper.aclose()
        await self.link.aclose()
        await self.backend.aclose()
        for task in list(self._background):
            task.cancel()
        if self.bus is not None:
            await self.bus.close()

    # -- books and events --------------------------------------------------------------------

    def _capture(self, req: PathRequest) -> asyncio.Task[float] | None:
        """At the first token: capture the request's price from its hold (in the next
        exchange, beside its first token); None for one admitted here (nothing is held)."""
        if self.gate is not None and self.gate.is_local(req.request_id):
            return None
        return asyncio.get_running_loop().create_task(self.link.settle(req.request_id, True))

    async def _close_books(
        self, req: PathRequest, life: Lifecycle, capture: asyncio.Task[float] | None
    ) -> float:
        """Release the backend's reservations (idempotent) and close the auction's hold: capture
        the price once it is due (``Lifecycle.due``: the first token is out), else release."""
        await self.backend.release(req.request_id)
        if self.gate is not None and self.gate.is_local(req.request_id):
            self.gate.finished(req.request_id)  # admitted here, FCFS: nothing held, nothing due
            return 0.0
        # The price is due once the first token is out (Lifecycle.due), captured by then in
        # the exchange that freed its slot; a request that never got one is released.
        if capture is not None:
            return await capture
        return await self.link.settle(req.request_id, life.first_token is not None)

    def _first_token(self, req: PathRequest, life: Lifecycle) -> None:
        """The auction's slot is free (the lease's here, or in the next exchange), and the
        ``first_token`` event (when the worker has a slot)."""
        if self.gate is not None and self.gate.is_local(req.request_id):
            self.gate.started(req.request_id)
        else:
            self.link.started(req.request_id)
        if self.bus is not None and life.decode_worker is not None:
            self.bus.publish(life.first_token_event())
