"""NATS off the request path for every actor and ingress replica (docs/design.md "Serve
runtime", §5 events): :class:`ActorBus`, and the background loops that use it.

An actor's request methods must never wait on NATS: a slow or absent server may not stop
requests. So ``publish``/``publish_kv`` only put the message on a bounded queue and return; one
background task connects (retrying for as long as it takes), subscribes and then drains the
queue through ``cluster.bus.EventBus`` (which buffers further across outages). What the queue
cannot hold is dropped and counted in ``disagg_events_dropped_total{reason="buffer_full"}``.

With ``nats_url=None`` there is no NATS: every message goes to the callbacks in ``local``
instead, ``(subject, item)``, in order. Tests and an in-process composition observe it there.

The background task starts on the first ``start()`` from inside the owner's event loop (a Ray
actor's ``__init__`` runs outside its loop), so every async actor method calls ``start()``.
Nothing here imports Ray: an ingress replica's data plane uses it as the actors do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping

from cluster.bus import BusError, EventBus, KvHandler
from cluster.events import Event, subject
from cluster.wire import BATCH_ORDER, BATCHED, MAX_BATCH_EVENTS
from telemetry.metrics import EVENTS_DROPPED

__all__ = [
    "BATCH_PERIOD_S",
    "ActorBus",
    "LocalSink",
    "cancel_all",
    "start_loops",
    "subscribe_when_connected",
    "wait_subscribed",
]

log = logging.getLogger(__name__)

KvPayloads = list[Mapping[str, object]]  # flattened, as ``router.to_payload`` gives them
LocalSink = Callable[[str, Event | KvPayloads], None]  # (subject, what was published)
# (subject, what, publisher): an event, or one KV envelope's payloads
_Item = tuple[str, Event | KvPayloads, int]


MAX_PENDING = 4096  # queued messages; a KV message holds one engine iteration's events


# The data plane's events (cluster.wire.BATCHED) leave in one message per subject this often: at
# hundreds of requests per second that is three messages per period instead of three per
# request, and 25 ms is far below what the consumers resolve (the controller's TTFT EMA ticks
# every second; the PoA estimator's windows are seconds long).
BATCH_PERIOD_S = 0.025


_RETRY_S = 1.0  # between failed first-connection attempts (each already retries ~30 s)


class ActorBus:
    """A non-blocking publisher (and KV subscriber) for one actor."""

    def __init__(
        self,
        nats_url: str | None,
        namespace: str,
        *,
        role: str,
        name: str,
        max_pending: int = MAX_PENDING,
        batch_period_s: float = BATCH_PERIOD_S,
    ) -> None:
        subject(namespace, "route")  # validates the namespace before anything starts
        self.namespace = namespace
        # In-process (no NATS) the sinks get each event at once: there is no message to save.
        self.batch_period_s = batch_period_s if nats_url is not None else 0.0
        self.bus: EventBus | None = None
        if nats_url is not None:
            self.bus = EventBus(nats_url, namespace, role=role, name=name)
        self.local: list[LocalSink] = []
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(max_pending)
        self._held: list[tuple[str, Event]] = []  # this period's batched events, by subject
        self._kv_subscriptions: list[tuple[str, KvHandler]] = []
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0  # queue full, or delivery raised

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> None:
        """Start the background task (idempotent; needs the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="actor-bus")

    async def wait_connected(self, timeout_s: float) -> bool:
        """True once connected (always true without NATS); False after ``timeout_s``."""
        self.start()
        if self.bus is None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), timeout_s)
        return self.connected

    # -- out ---------------------------------------------------------------------------------

    def publish(self, event: Event) -> bool:
        """Queue ``event`` for ``disagg.<ns>.<kind>``; False if dropped. Never blocks."""
        return self._offer((subject(self.namespace, event.kind), event, 0))

    def publish_kv(self, kv_subject: str, payloads: KvPayloads, publisher: int) -> bool:
        """Queue one Dynamo KV envelope of ``payloads``; False if dropped. Never blocks."""
        return self._offer((kv_subject, payloads, publisher))

    def _offer(self, item: _Item) -> bool:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1
            EVENTS_DROPPED.labels("buffer_full").inc()
            return False
        return True

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until everything queued so far is delivered (to NATS's client or ``local``)."""
        self.start()

        async def settle() -> None:
            await self._queue.join()
            if self.bus is not None and self.connected:
                await self.bus.flush(timeout_s)

        await asyncio.wait_for(settle(), timeout_s)

    # -- in ----------------------------------------------------------------------------------

    async def subscribe_kv(self, kv_subject: str, handler: KvHandler) -> None:
        """Feed each KV payload on ``kv_subject`` to ``handler`` (from the next connection on)."""
        self._kv_subscriptions.append((kv_subject, handler))
        if self.bus is not None and self.connected:
            await self.bus.subscribe_kv(kv_subject, handler)

    # -- the task ----------------------------------------------------------------------------

    async def _run(self) -> None:
        if self.bus is not None:
            while True:
                try:
                    await self.bus.connect()
                    break
                except BusError as exc:  # unreachable for ~30 s: keep trying, keep queueing
                    log.warning("NATS not reachable yet: %s", exc)
                    await asyncio.sleep(_RETRY_S)
            for kv_subject, handler in list(self._kv_subscriptions):
                await self.bus.subscribe_kv(kv_subject, handler)
            self._connected.set()
        loop = asyncio.get_running_loop()
        deadline = 0.0
        while True:
            try:
                if self._held:
                    got = await asyncio.wait_for(self._queue.get(), deadline - loop.time())
                else:
                    got = await self._queue.get()
            except TimeoutError:
                await self._send_held()
                continue
            where, what, _ = got
            if not isinstance(what, list) and what.kind in BATCHED and self.batch_period_s > 0:
                if not self._held:
                    deadline = loop.time() + self.batch_period_s
                self._held.append((where, what))
                if len(self._held) >= MAX_BATCH_EVENTS:
                    await self._send_held()
                continue
            await self._send_items([got], batch=False)

    async def _send_held(self) -> None:
        """One period's batched events, a message per subject in ``BATCH_ORDER`` (a request's
        route before its first token before its completion)."""
        held, self._held = self._held, []
        for kind in BATCH_ORDER:
            items: list[_Item] = [(at, e, 0) for at, e in held if e.kind == kind]
            if items:
                await self._send_items(items, batch=True)

    async def _send_items(self, items: list[_Item], *, batch: bool) -> None:
        where = items[0][0]
        try:
            if batch and self.bus is not None:
                await self.bus.publish_batch([e for _, e, _ in items if not isinstance(e, list)])
            else:
                for at, what, publisher in items:
                    await self._deliver(at, what, publisher)
            self.sent += len(items)
        except Exception:  # a bad item or a broken callback must not stop the next one
            self.dropped += len(items)
            EVENTS_DROPPED.labels("publish_error").inc(len(items))
            log.exception("could not deliver %d message(s) on %s", len(items), where)
        finally:
            for _ in items:
                self._queue.task_done()

    async def _deliver(self, where: str, item: Event | KvPayloads, publisher: int) -> None:
        if self.bus is None:
            for sink in self.local:
                sink(where, item)
        elif isinstance(item, list):  # a KV envelope's payloads
            await self.bus.publish_kv(where, item, publisher)
        else:
            await self.bus.publish(item)

    async def close(self, drain_timeout_s: float = 1.0) -> None:
        """Deliver what is queued (up to ``drain_timeout_s``), then stop the task and close
        NATS; what is still queued then is dropped and counted (``closed``)."""
        if self._task is not None and (self.bus is None or self.connected):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), drain_timeout_s)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        left = self._queue.qsize() + len(self._held)
        self._held = []
        if left:
            self.dropped += left
            EVENTS_DROPPED.labels("closed").inc(left)
        if self.bus is not None:
            await self.bus.close()
        self._connected.clear()


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel background tasks and wait until each has stopped (whatever it raised)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def subscribe_when_connected(
    actor_bus: ActorBus, on_event: Callable[[Event], None], kinds: tuple[str, ...]
) -> bool:
    """Wait (as long as it takes) for NATS, then subscribe ``on_event`` to ``kinds``; nats-py
    re-subscribes after every reconnect, so one subscription lasts the actor's life. False when
    there is no NATS (events then come through ``on_event`` in-process)."""
    bus = actor_bus.bus
    if bus is None:
        return False
    while not await actor_bus.wait_connected(60.0):
        pass
    await bus.subscribe(on_event, kinds=kinds)
    return True


async def wait_subscribed(actor_bus: ActorBus, subscribed: Callable[[], bool]) -> None:
    """After a connection, give the subscription the few ms it takes (at most 0.5 s)."""
    for _ in range(50):
        if subscribed() or actor_bus.bus is None:
            return
        await asyncio.sleep(0.01)


def start_loops(
    actor_bus: ActorBus, **loops: Coroutine[object, object, None]
) -> list[asyncio.Task[None]]:
    """Start the bus and one named task per background loop, on the running event loop.

    An actor's ``__init__`` runs outside its event loop, so actors call this from their first
    method call (see :func:`wake_after_restart`)."""
    actor_bus.start()
    loop = asyncio.get_running_loop()
    return [loop.create_task(coro, name=name) for name, coro in loops.items()]
