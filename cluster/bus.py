"""The event bus on NATS: publish and subscribe ``disagg.<ns>.*`` events and Dynamo KV events.

A thin, robust layer over nats-py. It reconnects forever (the client buffers what is published
while the server is away and re-subscribes on return), and it never lets a bad message reach
the plain objects behind it: malformed JSON, unknown versions, missing fields and undecodable KV
envelopes are skipped and counted, as are the messages a subscriber can prove it missed (each
publisher numbers its messages per subject; a jump in ``seq`` is a gap). Counts go to
``disagg_events_dropped_total{reason}``.

    bus = EventBus("nats://127.0.0.1:4222", namespace="prod")
    await bus.connect()
    await bus.subscribe(on_event)          # on_event(RouteEvent | CompleteEvent | ...)
    await bus.publish(RouteEvent(...))
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoServersError

from cluster.events import KINDS, Event, MalformedEventError, decode, encode, subject
from cluster.kv_wire import decode_kv_events, encode_kv_events
from controller.metrics import EVENTS_DROPPED

EventHandler = Callable[[Event], None]
KvHandler = Callable[[Any], None]


class BusError(RuntimeError):
    pass


class EventBus:
    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        name: str = "disaggctl",
        reconnect_wait_s: float = 0.1,
        connect_timeout_s: float = 2.0,
        first_connect_s: float = 30.0,
    ) -> None:
        subject(namespace, "route")  # validates the namespace
        self.url = url
        self.namespace = namespace
        self.publisher = f"{name}-{uuid.uuid4().hex[:12]}"
        self._reconnect_wait = reconnect_wait_s
        self._connect_timeout = connect_timeout_s
        self._first_connect_s = first_connect_s
        self._nc: Client | None = None
        self._seq: Counter[str] = Counter()
        self._kv_seq = 0
        self._last_seen: dict[tuple[str, str], int] = {}
        self.received: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.disconnects = 0
        self.reconnects = 0
        self.errors = 0

    # -- connection --------------------------------------------------------------------------

    async def connect(self) -> None:
        async def disconnected() -> None:
            self.disconnects += 1

        async def reconnected() -> None:
            self.reconnects += 1

        async def error(exc: Exception) -> None:
            self.errors += 1  # the client retries; the disconnect/reconnect counts tell the story

        # The client reconnects forever once connected; the first connection we retry here, so
        # a bus started before its server (or during an outage) waits instead of failing.
        deadline = asyncio.get_running_loop().time() + self._first_connect_s
        while True:
            try:
                self._nc = await nats.connect(
                    servers=[self.url],
                    name=self.publisher,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=self._reconnect_wait,
                    connect_timeout=self._connect_timeout,
                    disconnected_cb=disconnected,
                    reconnected_cb=reconnected,
                    error_cb=error,
                )
                return
            except (OSError, NoServersError, TimeoutError) as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise BusError(f"cannot reach NATS at {self.url}: {exc}") from exc
                await asyncio.sleep(self._reconnect_wait)

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def flush(self, timeout_s: float = 2.0) -> None:
        await self._client().flush(timeout=timeout_s)

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()
        self._nc = None

    def _client(self) -> Client:
        if self._nc is None or self._nc.is_closed:
            raise BusError("the bus is not connected: call connect() first")
        return self._nc

    # -- disagg events -----------------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        # One sequence per subject: NATS keeps order within a subscription, not across them.
        self._seq[event.kind] += 1
        data = encode(event, self.publisher, self._seq[event.kind])
        await self._client().publish(subject(self.namespace, event.kind), data)

    async def subscribe(self, on_event: EventHandler, kinds: Iterable[str] = KINDS) -> None:
        nc = self._client()
        for kind in kinds:
            await nc.subscribe(subject(self.namespace, kind), cb=self._handler(kind, on_event))

    def _handler(self, kind: str, on_event: EventHandler) -> Callable[[Msg], Any]:
        async def handle(msg: Msg) -> None:
            try:
                event, publisher, seq = decode(kind, msg.data)
            except MalformedEventError as exc:
                self._drop(exc.reason)
                return
            if not self._in_sequence((publisher, kind), seq):
                return
            self.received[kind] += 1
            on_event(event)

        return handle

    @property
    def published(self) -> Counter[str]:
        """Messages this bus published, per event kind."""
        return Counter(self._seq)

    def last_seen(self, publisher: str, kind: str) -> int:
        """The highest ``seq`` received from ``publisher`` on ``kind`` (0: nothing yet)."""
        return self._last_seen.get((publisher, kind), 0)

    def _in_sequence(self, stream: tuple[str, str], seq: int) -> bool:
        last = self._last_seen.get(stream, 0)
        if seq <= last:
            self._drop("duplicate")
            return False
        if seq > last + 1:
            self._drop("gap", seq - last - 1)
        self._last_seen[stream] = seq
        return True

    def _drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] += n
        EVENTS_DROPPED.labels(reason).inc(n)

    # -- Dynamo KV events --------------------------------------------------------------------

    async def publish_kv(
        self, kv_subject: str, payloads: Sequence[dict[str, Any]], publisher_id: int
    ) -> None:
        """Publish flattened KV payloads (``router.to_payload``) in Dynamo's envelope."""
        self._kv_seq += 1
        data = encode_kv_events(payloads, publisher_id, self._kv_seq)
        await self._client().publish(kv_subject, data)

    async def subscribe_kv(self, kv_subject: str, on_payload: KvHandler) -> None:
        """``on_payload`` gets each RouterEvent dict (feed it to ``router.Router.apply_event``)."""

        async def handle(msg: Msg) -> None:
            payloads, _, reason = decode_kv_events(msg.data)
            if reason is not None:
                self._drop(f"kv_{reason}")
                return
            self.received["kv"] += len(payloads)
            for payload in payloads:
                on_payload(payload)

        await self._client().subscribe(kv_subject, cb=handle)
