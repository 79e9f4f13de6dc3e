"""What the serve runtime's actors share (docs/design.md "Serve runtime", §5 events): NATS off
the request path (``ActorBus``), ``Ready`` for ``ready()``, and argument checks.

An actor's request methods must never wait on NATS: a slow or absent server may not stop
requests. So ``publish``/``publish_kv`` only put the message on a bounded queue and return; one
background task connects (retrying for as long as it takes), subscribes and then drains the
queue through ``cluster.bus.EventBus`` (which buffers further across outages). What the queue
cannot hold is dropped and counted in ``disagg_events_dropped_total{reason="buffer_full"}``.

With ``nats_url=None`` there is no NATS: every message goes to the callbacks in ``local``
instead, ``(subject, item)``, in order. Tests and an in-process composition observe it there.

The background task starts on the first ``start()`` from inside the actor's event loop (a Ray
actor's ``__init__`` runs outside its loop), so every async actor method calls ``start()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.bus import BusError, EventBus, KvHandler
from cluster.events import MAX_ID_CHARS, Event, subject
from cluster.wire import BATCH_ORDER, BATCHED, MAX_BATCH_EVENTS
from router.hashing import U64_MASK
from telemetry.metrics import EVENTS_DROPPED

__all__ = [
    "MAX_PROMPT_TOKENS",
    "ActorBus",
    "LocalSink",
    "Ready",
    "check_hashes",
    "check_int",
    "check_request_id",
    "ready_record",
]

log = logging.getLogger(__name__)

LocalSink = Callable[[str, Any], None]  # (subject, event or list of KV payloads)

MAX_PROMPT_TOKENS = 1 << 20  # a longer prompt is refused: bounds the work one request causes
MAX_PENDING = 4096  # queued messages; a KV message holds one engine iteration's events
# The data plane's events (cluster.wire.BATCHED) leave in one message per subject this often: at
# hundreds of requests per second that is three messages per period instead of three per
# request, and 25 ms is far below what the consumers resolve (the controller's TTFT EMA ticks
# every second; the PoA estimator's windows are seconds long).
BATCH_PERIOD_S = 0.025
_RETRY_S = 1.0  # between failed first-connection attempts (each already retries ~30 s)


@dataclass(frozen=True)
class Ready:
    """An actor's answer to ``ready()`` once it serves, the same record for every actor of the
    service: its ``role``, its process and Ray placement (``node_id`` None and
    ``accelerators`` empty outside a Ray actor; ``accelerators`` holds the custom resources Ray
    assigned, e.g. ``{"B200": 4.0}``), and its links: ``nats`` whether its bus is connected
    (None: it runs without NATS), ``subscribed`` whether its subscriptions are in place (None:
    it subscribes to nothing). A worker names itself (``worker_id``); the auction says how many
    open holds it released at start (``released_at_start``: abandoned by its last instance)."""

    role: str
    pid: int
    node_id: str | None = None
    accelerators: Mapping[str, float] = field(default_factory=dict)
    nats: bool | None = None
    subscribed: bool | None = None
    worker_id: int | None = None
    released_at_start: int | None = None


def ready_record(
    role: str,
    *,
    nats: bool | None = None,
    subscribed: bool | None = None,
    worker_id: int | None = None,
    released_at_start: int | None = None,
) -> Ready:
    """This process's ``Ready``, its placement read from Ray."""
    node_id, accelerators = None, {}
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            node_id = ctx.get_node_id()
            assigned = ctx.get_assigned_resources()  # type: ignore[no-untyped-call]
            # Custom resources only: {"B200": 4.0}, as the composer requested them.
            accelerators = {
                k: float(v)
                for k, v in assigned.items()
                if k not in ("CPU", "GPU", "memory", "object_store_memory")
            }
    except Exception:  # not in an actor (driver-side tests): the plain facts are enough
        pass
    return Ready(
        role, os.getpid(), node_id, accelerators, nats, subscribed, worker_id, released_at_start
    )


def check_request_id(request_id: object) -> str:
    """A non-empty str of at most ``MAX_ID_CHARS`` (what the NATS events accept)."""
    if type(request_id) is not str or not 0 < len(request_id) <= MAX_ID_CHARS:
        raise ValueError(
            f"request_id must be a non-empty str of at most {MAX_ID_CHARS} characters, "
            f"got {request_id!r:.80}"
        )
    return request_id


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    """An int (not a bool) in [lo, hi]; ValueError naming ``name`` otherwise."""
    if type(value) is not int or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r:.80}")
    return value


def check_hashes(name: str, hashes: object, max_len: int) -> list[int]:
    """A list of at most ``max_len`` u64 block hashes."""
    if not isinstance(hashes, list | tuple) or len(hashes) > max_len:
        raise ValueError(f"{name} must be a list of at most {max_len} hashes")
    if not all(type(h) is int and 0 <= h <= U64_MASK for h in hashes):
        raise ValueError(f"{name} must hold ints in [0, 2**64)")
    return list(hashes)


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
        self._queue: asyncio.Queue[tuple[str, str, Any, int]] = asyncio.Queue(max_pending)
        self._held: list[tuple[str, str, Any, int]] = []  # this period's batched events
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
        return self._offer(("event", subject(self.namespace, event.kind), event, 0))

    def publish_kv(self, kv_subject: str, payloads: list[dict[str, Any]], publisher: int) -> bool:
        """Queue one Dynamo KV envelope of ``payloads``; False if dropped. Never blocks."""
        return self._offer(("kv", kv_subject, payloads, publisher))

    def _offer(self, item: tuple[str, str, Any, int]) -> bool:
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
            if got[0] == "event" and got[2].kind in BATCHED and self.batch_period_s > 0:
                if not self._held:
                    deadline = loop.time() + self.batch_period_s
                self._held.append(got)
                if len(self._held) >= MAX_BATCH_EVENTS:
                    await self._send_held()
                continue
            await self._send_items([got], batch=False)

    async def _send_held(self) -> None:
        """One period's batched events, a message per subject in ``BATCH_ORDER`` (a request's
        route before its first token before its completion)."""
        held, self._held = self._held, []
        for kind in BATCH_ORDER:
            items = [item for item in held if item[2].kind == kind]
            if items:
                await self._send_items(items, batch=True)

    async def _send_items(self, items: list[tuple[str, str, Any, int]], *, batch: bool) -> None:
        where = items[0][1]
        try:
            if batch and self.bus is not None:
                await self.bus.publish_batch([item[2] for item in items])
            else:
                for kind, at, payload, publisher in items:
                    await self._deliver(kind, at, payload, publisher)
            self.sent += len(items)
        except Exception:  # a bad item or a broken callback must not stop the next one
            self.dropped += len(items)
            EVENTS_DROPPED.labels("publish_error").inc(len(items))
            log.exception("could not deliver %d message(s) on %s", len(items), where)
        finally:
            for _ in items:
                self._queue.task_done()

    async def _deliver(self, kind: str, where: str, item: Any, publisher: int) -> None:
        if self.bus is None:
            for sink in self.local:
                sink(where, item)
        elif kind == "kv":
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


def wake_after_restart() -> None:
    """From an actor's ``__init__``: queue a call of its own ``ready()``.

    ``__init__`` runs outside the actor's event loop, so background loops (subscriptions, ticks)
    start on the first method call. A fresh actor gets that call from the composer; one that Ray
    restarted after a crash gets none, and would sit idle until something happens to call it.
    Outside Ray (in-process tests) this does nothing.
    """
    try:
        import ray

        if not ray.is_initialized():
            return
        me = ray.get_runtime_context().current_actor
    except Exception:  # not inside an actor
        return
    me.ready.remote()


def restore_after_restart(method: str) -> bool:
    """From an actor's ``__init__``: when Ray is restarting this actor (after its process or
    its node died), queue a call of its own ``method``, which puts back what the composer set
    up the first time (a fresh actor gets that from the composer); whether it is restarting.
    Outside Ray, or on a first start, this does nothing (False)."""
    try:
        import ray

        if not ray.is_initialized():
            return False
        context = ray.get_runtime_context()
        if not context.was_current_actor_reconstructed:
            return False
        me = context.current_actor
    except Exception:  # not inside an actor
        return False
    getattr(me, method).remote()
    return True


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
    actor_bus: ActorBus, **loops: Coroutine[Any, Any, None]
) -> list[asyncio.Task[None]]:
    """Start the bus and one named task per background loop, on the running event loop.

    An actor's ``__init__`` runs outside its event loop, so actors call this from their first
    method call (see :func:`wake_after_restart`)."""
    actor_bus.start()
    loop = asyncio.get_running_loop()
    return [loop.create_task(coro, name=name) for name, coro in loops.items()]
