"""An ingress replica's token streams, one per decode worker (docs/design.md "Tokens"; the worker
side and the frame rule: ``cluster/backends/sim/token_streams.py``).

A request joins the stream of its decode worker: its order waits for the link's next ``submit``
(one call in flight per link; orders that arrive meanwhile ride the next one, so a lone request
waits for nothing and a burst shares a call), and its tokens come back in the link's frames,
sorted into one queue per request by a reader task. The link is opened on first use and
dropped when its stream fails; every request it carried then fails with ``WorkerFailed`` (before
the first token the lifecycle places it again; after it, the stream ends with an error). A
request whose consumer leaves early is withdrawn in the link's next ``submit``. A worker that
leaves its role (a re-split's drain) says so in a frame: the link then takes no new request and
closes once the requests on it have ended, which tells the worker that its last frame arrived.

A ``submit`` only hands orders to the worker's queue, so it answers in milliseconds however
loaded the engine is; one that has not answered within ``submit_timeout_s`` means a wedged
worker, and the link is dropped as if the worker had died (its requests fail with
``WorkerFailed`` naming it: placed again before their first token, else a 503).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Coroutine

from ray.exceptions import RayTaskError

from cluster.actor_ref import ActorRef
from cluster.backends.sim.refs import DecodeWorkerRef
from cluster.backends.sim.token_streams import MAX_ORDERS_PER_SUBMIT, DecodeOrder, Frame, StreamPart
from cluster.dataplane.calls import call_detached, detached_task
from cluster.ray.worker_handles import RAY_FAILURES, Workers, ray_cancel
from cluster.serve.backend import WorkerFailed

__all__ = ["SUBMIT_TIMEOUT_S", "DecodeStreams"]

SUBMIT_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)

_Item = StreamPart | BaseException
# A submit that failed: the worker died (RAY_FAILURES) or raised (a bad batch: our bug).
_SUBMIT_FAILED: tuple[type[BaseException], ...] = (*RAY_FAILURES, RayTaskError)


class _Link:
    """One stream to one decode worker: the frames it reads, the orders it sends."""

    def __init__(
        self, owner: DecodeStreams, worker: int, handle: ActorRef, interval_s: float
    ) -> None:  # fmt: skip
        self.owner, self.worker, self.handle = owner, worker, handle
        self.calls = DecodeWorkerRef(handle)
        self.stream_id = f"{owner.replica}.{uuid.uuid4().hex[:12]}"
        self.queues: dict[str, asyncio.Queue[_Item]] = {}
        self.orders: list[DecodeOrder] = []
        self.withdrawn: list[str] = []
        self.sending = False
        self.failed: WorkerFailed | None = None
        self.closing = False  # the worker said it leaves its role (``Frame.closing``)
        # Whichever of this call and the first submit reaches the worker first opens the
        # stream's outbox there; the other finds it.
        self.frames = call_detached(self.calls.frames, self.stream_id, interval_s)
        self.reader = detached_task(self._read())

    def join(self, order: DecodeOrder) -> asyncio.Queue[_Item]:
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        if self.failed is not None:  # dropped already: the caller places the request again
            queue.put_nowait(self.failed)
            return queue
        if self.closing:  # its engine takes nothing new: place the request elsewhere
            queue.put_nowait(WorkerFailed("decode", self.worker, "is leaving its role"))
            return queue
        self.queues[order.request_id] = queue
        self.orders.append(order)
        self._kick()
        return queue

    def leave(self, request_id: str, ended: bool) -> None:
        if self.queues.pop(request_id, None) is not None and not ended and self.failed is None:
            self.withdrawn.append(request_id)
            self._kick()
        self._close_if_done()

    def _close_if_done(self) -> None:
        """Close a leaving worker's stream once every request on it has ended: closing it is
        the worker's sign that its last frame arrived (``StreamHost.close_streams``)."""
        if self.closing and not self.queues and self.failed is None:
            self.fail("it left its role", forget=False)
            if self.reader is not asyncio.current_task():
                self.reader.cancel()

    def _kick(self) -> None:
        if not self.sending and self.failed is None:
            self.sending = True
            self.owner.spawn(self._send())

    async def _send(self) -> None:
        try:
            while (self.orders or self.withdrawn) and self.failed is None:
                room = MAX_ORDERS_PER_SUBMIT
                orders, self.orders = self.orders[:room], self.orders[room:]
                room -= len(orders)
                withdrawn, self.withdrawn = self.withdrawn[:room], self.withdrawn[room:]
                self.owner.count("submit")
                deadline = self.owner.submit_timeout_s
                try:
                    refused = await asyncio.wait_for(
                        self.calls.submit(self.stream_id, orders, withdrawn), deadline
                    )
                except _SUBMIT_FAILED as exc:
                    self.fail(type(exc).__name__, forget=not isinstance(exc, RayTaskError))
                    return
                except TimeoutError:
                    self.fail(f"did not take its orders within {deadline:g} s", forget=True)
                    return
                for order, why in zip(orders, refused, strict=True):
                    queue = self.queues.get(order.request_id)
                    if why is not None and queue is not None:
                        queue.put_nowait(ValueError(f"decode worker {self.worker}: {why}"))
        finally:
            self.sending = False

    async def _read(self) -> None:
        seq = 0
        why = "its token stream ended"
        try:
            async for ref in self.frames:
                frame = await ref
                if not isinstance(frame, Frame):
                    raise TypeError(f"a decode worker streamed {type(frame).__name__}, not a Frame")
                if frame.seq != seq + 1:  # Ray delivers a stream's items in order, or fails it
                    raise RuntimeError(f"frame {frame.seq} after {seq}")
                seq = frame.seq
                for part in frame.parts:
                    queue = self.queues.get(part.request_id)
                    if queue is not None:
                        queue.put_nowait(part)
                if frame.closing:
                    self.closing = True
                    self._close_if_done()
                    if self.failed is not None:
                        return
        except RAY_FAILURES as exc:
            self.fail(type(exc).__name__, forget=True)
            return
        except RayTaskError as exc:
            why = f"its token stream failed: {exc.cause!r}"
        except asyncio.CancelledError:
            why = "the replica closed its token streams"
            raise
        finally:
            self.fail(why, forget=False)

    def fail(self, why: str, *, forget: bool) -> None:
        if self.failed is not None:
            return
        self.failed = WorkerFailed("decode", self.worker, why)
        self.owner.dropped(self, forget=forget)
        for queue in self.queues.values():
            queue.put_nowait(self.failed)
        ray_cancel(self.frames)


class DecodeStreams:
    """This replica's links to the decode workers, opened on demand."""

    def __init__(
        self, workers: Workers, replica: str, *, interval_s: float,
        calls: collections.Counter[str] | None = None,
        submit_timeout_s: float = SUBMIT_TIMEOUT_S,
    ) -> None:  # fmt: skip
        if not submit_timeout_s > 0:
            raise ValueError(f"submit_timeout_s must be > 0, got {submit_timeout_s!r}")
        self.workers, self.replica, self.interval_s = workers, replica, interval_s
        self.calls = calls
        self.submit_timeout_s = submit_timeout_s
        self._links: dict[int, _Link] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def tokens(self, worker: int, order: DecodeOrder) -> AsyncIterator[tuple[int, ...]]:
        """The order's token ids as they come, run on decode worker ``worker``. Raises
        ``WorkerFailed`` (the worker failed or takes no new work) or ``ValueError`` (it refused
        the order)."""
        link = await self._link(worker)
        queue = link.join(order)
        ended = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    ended = True
                    raise item
                if item.token_ids:
                    yield item.token_ids
                if item.end is not None:
                    ended = True
                    if item.end == "done":
                        return
                    if item.end == "invalid":
                        raise ValueError(f"decode worker {worker}: {item.message}")
                    raise WorkerFailed("decode", worker, f"takes no new work ({item.end})")
        finally:
            link.leave(order.request_id, ended)

    async def _link(self, worker: int) -> _Link:
        link = self._links.get(worker)
        if link is None:
            handle = await self.workers.get("decode", worker)
            if handle is None:
                raise WorkerFailed("decode", worker, "not in the pool")
            link = self._links.get(worker)  # another request may have opened it meanwhile
            if link is None:
                link = self._links[worker] = _Link(self, worker, handle, self.interval_s)
        return link

    def dropped(self, link: _Link, *, forget: bool) -> None:
        if self._links.get(link.worker) is link:
            del self._links[link.worker]
        if forget:  # the actor died: look it up again next time
            self.workers.forget("decode", link.worker, link.handle)

    def count(self, method: str) -> None:
        if self.calls is not None:
            self.calls[method] += 1

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = detached_task(coro)  # a submit carries other requests' orders too
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        for link in list(self._links.values()):
            link.reader.cancel()
        tasks = [link.reader for link in self._links.values()] + list(self._background)
        for task in self._background:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        self._links.clear()
