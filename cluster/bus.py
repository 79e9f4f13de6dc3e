"""The event bus on NATS: publish and subscribe ``disagg.<ns>.*`` events and Dynamo KV events.

A thin, robust layer over nats-py (docs/design.md §5). It reconnects forever and never lets a bad
message, a bad number or a bad callback out of a subscription handler: every message it does
not deliver is counted by reason in ``disagg_events_dropped_total{reason}`` (the fixed set
``cluster.wire.DROP_REASONS``) and in :attr:`EventBus.dropped`.

Receiving: messages are decoded by ``cluster.wire.decode_all`` (bounded size, strict models) and
sequence-checked per (publisher, subject) by ``cluster.sequence.SequenceTracker``: gaps count
what was provably missed, duplicates are dropped, a late join or a restarted publisher
resynchronises instead of counting absurd gaps.

Publishing never raises for an outage: while disconnected, messages wait in a bounded
``cluster.outbox.Outbox`` (10,000 messages / 16 MiB by default) and go out in order on reconnect;
what does not fit is dropped and counted (``buffer_full``). Accounting, per bus::

    sum(attempted) == sum(published) + sum(send_dropped) + buffered

where ``published`` counts messages the client accepted (core NATS is at most once: a message
accepted just before the connection died can still be lost; subscribers count it as a gap).
Every attempt takes a sequence number, so what a publisher drops shows as a gap downstream too.

    bus = EventBus("nats://127.0.0.1:4222", namespace="prod", role="observer")
    await bus.connect()
    await bus.subscribe(on_event)          # on_event(RouteEvent | CompleteEvent | ...)
    await bus.publish(RouteEvent(...))
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from cluster.events import KINDS, MAX_ID_CHARS, Event, subject
from cluster.kv_wire import decode_kv_events, encode_kv_events
from cluster.nats_auth import connect_options
from cluster.outbox import MAX_BYTES, MAX_MESSAGES, Outbox, Outgoing
from cluster.sequence import SequenceTracker
from cluster.wire import (
    DROP_REASONS,
    MAX_BATCH_EVENTS,
    MAX_MESSAGE_BYTES,
    MalformedEventError,
    decode_all,
    encode,
    encode_batch,
)
from telemetry.metrics import EVENTS_DROPPED

T = TypeVar("T")

EventHandler = Callable[[Event], None]
KvHandler = Callable[[object], None]

logger = logging.getLogger(__name__)

for _reason in sorted(DROP_REASONS):
    EVENTS_DROPPED.labels(_reason)  # every series exists (at 0) from the start, for rate()

# What nats-py raises from publish when the connection is going or gone.
_SEND_ERRORS = (nats.errors.Error, OSError, asyncio.TimeoutError)


def redact_url(url: str) -> str:
    """``url`` fit for a log or an error: the user and password (a token) replaced by ``***``.
    NATS URLs may carry credentials (``nats://user:token@host:4222``); a message that names the
    server must not hand them to whoever reads the logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host = rest.rpartition("@")
    return f"{scheme}://***@{host}" if at and userinfo else url


class BusError(RuntimeError):
    """A programming error (publishing before connect() or after close()), never an outage."""


class EventBus:
    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        role: str | None = None,
        name: str = "disaggctl",
        reconnect_wait_s: float = 0.1,
        connect_timeout_s: float = 2.0,
        first_connect_s: float = 30.0,
        buffer_messages: int = MAX_MESSAGES,
        buffer_bytes: int = MAX_BYTES,
        tracker: SequenceTracker | None = None,
    ) -> None:
        subject(namespace, "route")  # validates the namespace
        self.url = url
        self.namespace = namespace
        # The role's credentials (cluster.nats_auth): read now, so a missing or malformed
        # secret fails the constructor with its path instead of a refused connection later.
        self.role = role
        self._auth = connect_options(role)
        # A new id per start: a restarted publisher is a new stream, never a run of duplicates.
        self.publisher = f"{name}-{uuid.uuid4().hex[:12]}"
        if len(self.publisher) > MAX_ID_CHARS:  # subscribers would refuse every message
            raise ValueError(f"name is too long: at most {MAX_ID_CHARS - 13} characters")
        self._reconnect_wait = reconnect_wait_s
        self._connect_timeout = connect_timeout_s
        self._first_connect_s = first_connect_s
        self._nc: Client | None = None
        self._seq: Counter[str] = Counter()
        self._kv_seq = 0
        self._outbox = Outbox(buffer_messages, buffer_bytes)
        self._send_lock = asyncio.Lock()
        self._drain_task: asyncio.Task[None] | None = None
        self.sequence = tracker if tracker is not None else SequenceTracker()
        self.received: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()  # received, not delivered, by reason
        self.attempted: Counter[str] = Counter()  # publish calls, by kind ("kv" for KV)
        self.published: Counter[str] = Counter()  # accepted by the client, by kind
        self.send_dropped: Counter[str] = Counter()  # never sent, by reason
        self.disconnects = 0
        self.reconnects = 0
        self.errors = 0
        self.permission_errors = 0

    # -- connection --------------------------------------------------------------------------

    async def connect(self) -> None:
        async def disconnected() -> None:
            self.disconnects += 1

        async def reconnected() -> None:
            self.reconnects += 1
            self._kick_drain()  # not awaited: the client's reconnect task must not wait on us

        async def error(exc: Exception) -> None:
            self.errors += 1  # the client retries; the disconnect/reconnect counts tell the story
            if "permissions violation" in str(exc).lower():
                # A role sending or reading what it may not: a deployment bug, said each time
                # it doubles so it cannot flood the log.
                self.permission_errors += 1
                n = self.permission_errors
                if n & (n - 1) == 0:
                    logger.error("NATS (role %s): %s (%d so far)", self.role, exc, n)

        # The client reconnects forever once connected; the first connection we retry here, so
        # a bus started before its server (or during an outage) waits instead of failing.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._first_connect_s
        while True:
            try:
                # With unlimited reconnects nats-py retries a first connection forever as well:
                # the deadline is ours to keep.
                self._nc = await asyncio.wait_for(
                    nats.connect(
                        servers=[self.url],
                        name=self.publisher,
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=self._reconnect_wait,
                        connect_timeout=self._connect_timeout,
                        disconnected_cb=disconnected,
                        reconnected_cb=reconnected,
                        error_cb=error,
                        **self._auth,
                    ),
                    timeout=max(deadline - loop.time(), self._connect_timeout),
                )
                return
            except (OSError, nats.errors.Error, TimeoutError) as exc:
                if loop.time() >= deadline:
                    as_role = f" as role {self.role}" if "user" in self._auth else ""
                    raise BusError(
                        f"cannot reach NATS at {redact_url(self.url)}{as_role}: {exc}"
                    ) from exc
                await asyncio.sleep(self._reconnect_wait)

    @property
    def connected(self) -> bool:
        return self._nc is not None and _up(self._nc)

    @property
    def buffered(self) -> int:
        """Messages waiting in the outbound buffer for the connection to return."""
        return len(self._outbox)

    async def flush(self, timeout_s: float = 2.0) -> None:
        """Send what is buffered, then wait for the server to have it all (a subscription
        made before this call is in effect at the server when it returns)."""
        await self._drain()
        nc = self._client()
        # Twice: nats-py (2.15, 2.16) writes flush's PING straight to the socket, ahead of the
        # commands still in its own pending buffer (a SUB or PUB just made), so the first PONG
        # can come back before the server has them (seen: a SUB arriving after the PUB it was
        # meant to receive). The client's flusher writes that buffer while the first PING is
        # out, so the second PING follows it on the wire.
        for _ in range(2):
            await nc.flush(timeout=timeout_s)  # type: ignore[arg-type]

    async def close(self, drain_timeout_s: float = 2.0) -> None:
        """Close the connection; what is still buffered gets ``drain_timeout_s`` to go out, and
        whatever is left after that is counted as dropped (``closed``)."""
        if self._drain_task is not None:
            self._drain_task.cancel()
        nc = self._nc
        if nc is not None and not nc.is_closed:
            if self._outbox and _up(nc):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drain(), timeout=drain_timeout_s)
            await nc.close()
        while self._outbox:
            self._outbox.pop()
            self._send_drop("closed")
        self._nc = None

    def _client(self) -> Client:
        if self._nc is None or self._nc.is_closed:
            raise BusError("the bus is not connected: call connect() first")
        return self._nc

    # -- publishing --------------------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        """Publish ``event``; in an outage it is buffered or counted as dropped, never raised."""
        nc = self._client()
        # One sequence per subject: NATS keeps order within a subscription, not across them.
        self._seq[event.kind] += 1
        data = encode(event, self.publisher, self._seq[event.kind])
        await self._send(nc, Outgoing(event.kind, subject(self.namespace, event.kind), data))

    async def publish_batch(self, events: Sequence[Event]) -> None:
        """Publish ``events`` (one batched kind, ``cluster.wire.BATCHED``) in as few messages as
        the bounds allow (``MAX_BATCH_EVENTS`` events, ``MAX_MESSAGE_BYTES`` each); like
        :meth:`publish`, never raises for an outage."""
        nc = self._client()
        for chunk in _chunks(events, MAX_BATCH_EVENTS):
            kind = chunk[0].kind
            self._seq[kind] += 1
            data = encode_batch(chunk, self.publisher, self._seq[kind])
            if len(data) > MAX_MESSAGE_BYTES and len(chunk) > 1:  # halve until it fits
                self._seq[kind] -= 1
                half = len(chunk) // 2
                await self.publish_batch(chunk[:half])
                await self.publish_batch(chunk[half:])
                continue
            await self._send(nc, Outgoing(kind, subject(self.namespace, kind), data))

    async def _send(self, nc: Client, item: Outgoing) -> None:
        self.attempted[item.kind] += 1
        if len(item.data) > MAX_MESSAGE_BYTES:
            self._send_drop("too_large")  # no subscriber would accept it
            return
        # Every send takes the lock (free and not yielding in the common case): asyncio's lock
        # is FIFO, so no message can overtake one that waits in the buffer or for the lock.
        async with self._send_lock:
            await self._drain_locked(nc)
            if self._outbox or not _up(nc):
                self._hold(item)  # behind what already waits, so order holds across the outage
                return
            await self._publish_one(nc, item)

    async def _publish_one(self, nc: Client, item: Outgoing) -> bool:
        """Hand ``item`` to the client; False (item untouched) if the connection just went."""
        try:
            await nc.publish(item.subject, item.data)
        except _SEND_ERRORS as exc:
            if not _up(nc):
                if not self._outbox or self._outbox.peek() is not item:
                    self._hold(item)
                return False
            logger.debug("publish refused on %s: %r", item.subject, exc)
            self._send_drop("publish_error")
            return True
        self.published[item.kind] += 1
        return True

    def _hold(self, item: Outgoing) -> None:
        if not self._outbox.offer(item):
            self._send_drop("buffer_full")

    def _kick_drain(self) -> None:
        if self._outbox and (self._drain_task is None or self._drain_task.done()):
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        async with self._send_lock:
            if self._nc is not None:
                await self._drain_locked(self._nc)

    async def _drain_locked(self, nc: Client) -> None:
        """Send the buffer in order while the connection holds; stop (keep the rest) if it goes."""
        while self._outbox and _up(nc):
            item = self._outbox.peek()
            if not await self._publish_one(nc, item):
                return  # gone again: the next reconnect resumes here
            self._outbox.pop()

    def _send_drop(self, reason: str) -> None:
        self.send_dropped[reason] += 1
        _count(reason)

    # -- subscribing -------------------------------------------------------------------------

    async def subscribe(self, on_event: EventHandler, kinds: Iterable[str] = KINDS) -> None:
        """Deliver the events of ``kinds`` to ``on_event``, in one publisher's order.

        One subscription on ``disagg.<ns>.*`` for all of them, filtered here: NATS keeps one
        publisher's order within a subscription, not across two. So the ingress's ``first_token``
        always comes before the same request's ``complete``; with a subscription per kind, each
        with its own delivery task, the two could swap."""
        wanted = frozenset(kinds)
        unknown = wanted - set(KINDS)
        if unknown:
            raise ValueError(f"unknown event kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        if not wanted:
            return
        prefix = subject(self.namespace, KINDS[0]).rsplit(".", 1)[0]
        await self._client().subscribe(f"{prefix}.*", cb=self._handler(wanted, on_event))

    def _handler(
        self, kinds: frozenset[str], on_event: EventHandler
    ) -> Callable[[Msg], Awaitable[None]]:
        async def handle(msg: Msg) -> None:
            kind = msg.subject.rsplit(".", 1)[-1]
            if kind not in kinds:
                return  # another consumer's kind on the shared wildcard: not ours to count
            for event in self.accept_all(kind, msg.data):
                self._deliver(on_event, event)

        return handle

    def accept(self, kind: str, data: bytes) -> Event | None:
        """The one event of a message on ``kind``'s subject (the first of a batch), or None."""
        events = self.accept_all(kind, data)
        return events[0] if events else None

    def accept_all(self, kind: str, data: bytes) -> tuple[Event, ...]:
        """The events in one message on ``kind``'s subject (one, or a batch), or none (the
        message dropped and counted). A batch counts as one message for sequence checks.

        Everything a subscription handler does short of calling back; never raises.
        """
        try:
            events, publisher, seq = decode_all(kind, data)
        except MalformedEventError as exc:
            self._drop(exc.reason)
            return ()
        except Exception:  # decode promises MalformedEventError only; a bug must not kill us
            logger.exception("unexpected error decoding a %s message", kind)
            self._drop("malformed")
            return ()
        verdict = self.sequence.observe((publisher, kind), seq)
        if verdict.lost:
            self._drop("gap", verdict.lost)
        if not verdict.deliver:
            self._drop("duplicate")
            return ()
        self.received[kind] += len(events)
        return events

    def _deliver(self, callback: Callable[[T], None], item: T) -> None:
        try:
            callback(item)
        except Exception:
            self._drop("handler_error")
            n = self.dropped["handler_error"]
            if n & (n - 1) == 0:  # 1st, 2nd, 4th, ...: a broken callback must not flood the log
                logger.exception("event callback raised (%d times so far)", n)

    def last_seen(self, publisher: str, kind: str) -> int:
        """The highest ``seq`` delivered from ``publisher`` on ``kind`` (0: nothing yet)."""
        return self.sequence.last_seen((publisher, kind))

    def _drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] += n
        _count(reason, n)

    # -- Dynamo KV events --------------------------------------------------------------------

    async def publish_kv(
        self, kv_subject: str, payloads: Sequence[Mapping[str, object]], publisher_id: int
    ) -> None:
        """Publish flattened KV payloads (``router.to_payload``) in Dynamo's envelope."""
        nc = self._client()
        self._kv_seq += 1
        data = encode_kv_events(payloads, publisher_id, self._kv_seq)
        await self._send(nc, Outgoing("kv", kv_subject, data))

    async def subscribe_kv(self, kv_subject: str, on_payload: KvHandler) -> None:
        """``on_payload`` gets each RouterEvent dict (feed it to ``router.Router.apply_event``)."""

        async def handle(msg: Msg) -> None:
            payloads, _, reason = decode_kv_events(msg.data)
            if reason is not None:
                self._drop(f"kv_{reason}")
                return
            self.received["kv"] += len(payloads)
            for payload in payloads:
                self._deliver(on_payload, payload)

        await self._client().subscribe(kv_subject, cb=handle)


def _chunks(events: Sequence[Event], n: int) -> list[Sequence[Event]]:
    return [events[i : i + n] for i in range(0, len(events), n)]


def _up(nc: Client) -> bool:
    # A function, not the property inline: the state changes across every await, and a type
    # checker that narrows the property would call the re-check after an await unreachable.
    return bool(nc.is_connected)


def _count(reason: str, n: int = 1) -> None:
    # The label set is fixed (docs/design.md §5): an unknown reason is a bug here, not a label.
    if reason not in DROP_REASONS:
        raise AssertionError(f"unknown drop reason {reason!r}")
    EVENTS_DROPPED.labels(reason).inc(n)
