"""Token streams: one per (ingress replica, decode worker), shared by the replica's requests
(docs/design.md "Data flow (serve mode)", "Tokens").

A replica opens one Ray streaming call per decode worker (``frames``) and hands that worker its
requests in batches (``submit``: the orders, and the requests it no longer wants). The worker
runs each order on its engine and collects the tokens in the stream's outbox; a :class:`Frame`
carries everything the outbox holds: per request, the token ids produced since the previous
frame and, at its end, how it ended. When a frame leaves:

    at once when a request has its first token or its end (the TTFT and E2E wait for nothing);
    otherwise at most every ``interval_s`` wall seconds, holding every token decoded meanwhile.

So the Ray objects a worker sends per second are bounded by its first tokens and ends plus
``1 / interval_s``, whatever the number of requests it decodes; one streaming call per request
sent one object per chunk per request (the measurement behind the choice is in the design doc).

Failure and departure, per stream: a consumer that goes away (the replica closed the stream,
died, or Ray cancelled the call) withdraws every request of that stream from the engine; a
stream opened by a ``submit`` that no ``frames`` call claims within ``ATTACH_TIMEOUT_S`` is
dropped the same way. An engine that refuses a request (draining for a re-split, closed) ends
it with that reason, so the replica places it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from cluster.sim.wallclock import EngineClosed, EngineDraining

__all__ = [
    "ATTACH_TIMEOUT_S",
    "MAX_ORDERS_PER_SUBMIT",
    "DecodeOrder",
    "EndReason",
    "Frame",
    "StreamHost",
    "StreamPart",
    "check_stream_id",
]

MAX_ORDERS_PER_SUBMIT = 1024  # one submit's orders (and withdrawals); a replica sends more in turn
MAX_STREAMS = 256  # open streams per worker: a few per ingress replica at most
ATTACH_TIMEOUT_S = 30.0  # a stream's submit without its frames call: the replica is gone
_STREAM_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

EndReason = Literal["done", "draining", "closed", "invalid"]


@dataclass(frozen=True, slots=True)
class DecodeOrder:
    """One request for a decode worker: its prompt (length, block hashes) and its output."""

    request_id: str
    prompt_tokens: int
    local_hashes: tuple[int, ...]
    seq_hashes: tuple[int, ...]
    output_tokens: int
    prefill_locally: bool  # no prefill worker computed its KV: the decode engine prefills
    priority: int = 0  # its place in the engine's queue, lower first (auction.engine_priority)


@dataclass(frozen=True, slots=True)
class StreamPart:
    """What one frame says of one request: its new token ids, and ``end`` once it is over
    (``done``: every token is in; otherwise why the engine gave up on it, in ``message``)."""

    request_id: str
    token_ids: tuple[int, ...]
    end: EndReason | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int  # 1, 2, ... per stream: a gap would be a lost frame
    parts: tuple[StreamPart, ...]
    # The worker is leaving its role (a drained re-split): every frame before this one holds
    # all it will send, so the consumer closes the stream once its requests have ended.
    closing: bool = False


def check_stream_id(value: object) -> str:
    if not isinstance(value, str) or not _STREAM_ID.fullmatch(value):
        raise ValueError(f"stream_id must be 1-128 characters of [A-Za-z0-9_.:-], got {value!r}")
    return value


@dataclass
class _Outbox:
    """One stream's requests on this worker and what they produced since the last frame."""

    pumps: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    ends: dict[str, tuple[EndReason, str]] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)  # requests whose first token has left
    due: set[str] = field(default_factory=set)  # requests with a first token or an end waiting
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # something waits to leave
    urgent: asyncio.Event = field(default_factory=asyncio.Event)  # a first token or an end
    attached: bool = False
    listening: bool = False  # its frames() waits for news: every frame taken has left
    closing: bool = False  # the worker leaves its role: the next frame says so

    @property
    def delivered(self) -> bool:
        """Nothing runs, nothing waits to leave, and the last frame taken has left."""
        return not (self.pumps or self.tokens or self.ends) and (
            self.listening or not self.attached
        )

    def put(self, request_id: str, token_id: int) -> None:
        waiting = self.tokens.setdefault(request_id, [])
        if not waiting and request_id not in self.started:  # its first token: due at once
            self.started.add(request_id)
            self.due.add(request_id)
            self.urgent.set()
        waiting.append(token_id)
        self.ready.set()

    def end(self, request_id: str, reason: EndReason, message: str = "") -> None:
        self.ends[request_id] = (reason, message)
        self.started.discard(request_id)
        self.due.add(request_id)
        self.ready.set()
        self.urgent.set()

    def take(self, seq: int, *, everything: bool) -> Frame:
        """The next frame: every request's news, or (``everything`` False) only the due ones'
        (first tokens and ends); the others' tokens wait for the next tick."""
        rids = list(self.tokens.keys() | self.ends.keys()) if everything else list(self.due)
        parts = tuple(
            StreamPart(rid, tuple(self.tokens.pop(rid, ())), *self.ends.pop(rid, (None, "")))
            for rid in rids
        )
        self.due.clear()
        self.urgent.clear()
        if not (self.tokens or self.ends):
            self.ready.clear()
        return Frame(seq, parts, self.closing)

    def close(self) -> None:
        """Send a frame that says the worker is leaving, news or not."""
        self.closing = True
        self.ready.set()
        self.urgent.set()

    def withdraw(self, request_ids: Sequence[str] | None = None) -> None:
        for rid in list(self.pumps) if request_ids is None else request_ids:
            task = self.pumps.pop(rid, None)
            if task is not None:
                task.cancel()  # the engine drops the sequence (cluster/sim/engines.py)
            self.tokens.pop(rid, None)
            self.ends.pop(rid, None)
            self.started.discard(rid)
            self.due.discard(rid)


class StreamHost:
    """A decode worker's open streams. ``generate(order)`` is the engine's token ids for one
    order, ``check(order)`` its validation (ValueError naming the field)."""

    def __init__(
        self,
        generate: Callable[[DecodeOrder], AsyncIterator[int]],
        check: Callable[[DecodeOrder], None],
    ) -> None:
        self._generate, self._check = generate, check
        self._streams: dict[str, _Outbox] = {}
        self.closing = False

    def submit(
        self, stream_id: str, orders: Sequence[DecodeOrder], withdrawn: Sequence[str] = ()
    ) -> list[str | None]:
        """Start ``orders`` on the engine, their tokens for stream ``stream_id``; stop the
        ``withdrawn`` requests. Per order: None, or why it was refused (it never started)."""
        stream_id = check_stream_id(stream_id)
        if len(orders) + len(withdrawn) > MAX_ORDERS_PER_SUBMIT:
            raise ValueError(f"at most {MAX_ORDERS_PER_SUBMIT} orders and withdrawals per submit")
        box = self._streams.get(stream_id)
        if box is None:
            if len(self._streams) >= MAX_STREAMS:
                raise ValueError(f"this worker has {MAX_STREAMS} open streams already")
            box = self._streams[stream_id] = self._outbox()
            asyncio.get_running_loop().call_later(ATTACH_TIMEOUT_S, self._unclaimed, stream_id)
        box.withdraw([str(rid) for rid in withdrawn])
        return [self._start(box, order) for order in orders]

    def _start(self, box: _Outbox, order: object) -> str | None:
        if not isinstance(order, DecodeOrder):
            return f"an order must be a DecodeOrder, got {type(order).__name__}"
        try:
            self._check(order)
        except ValueError as exc:
            return str(exc)
        if order.request_id in box.pumps:
            return f"request_id {order.request_id!r} is already running on this stream"
        loop = asyncio.get_running_loop()
        box.pumps[order.request_id] = loop.create_task(
            self._pump(box, order), name=f"decode-{order.request_id}"
        )
        return None

    async def _pump(self, box: _Outbox, order: DecodeOrder) -> None:
        rid = order.request_id
        try:
            async with contextlib.aclosing(self._generate(order)) as tokens:  # type: ignore[type-var]
                async for token_id in tokens:
                    box.put(rid, token_id)
            box.end(rid, "done")
        except EngineDraining as exc:  # subclass first: draining is a kind of closed
            box.end(rid, "draining", str(exc))
        except EngineClosed as exc:
            box.end(rid, "closed", str(exc))
        except ValueError as exc:
            box.end(rid, "invalid", str(exc))
        finally:
            if box.pumps.get(rid) is asyncio.current_task():
                del box.pumps[rid]

    async def frames(self, stream_id: str, interval_s: float) -> AsyncGenerator[Frame, None]:
        """The stream's frames, until the consumer leaves (then its requests are withdrawn)."""
        stream_id = check_stream_id(stream_id)
        box = self._streams.get(stream_id)
        if box is None:
            if len(self._streams) >= MAX_STREAMS:
                raise ValueError(f"this worker has {MAX_STREAMS} open streams already")
            box = self._streams[stream_id] = self._outbox()
        if box.attached:
            raise ValueError(f"stream {stream_id!r} is open already")
        box.attached = True
        loop = asyncio.get_running_loop()
        seq, tick = 0, loop.time()
        try:
            while True:
                box.listening = True
                await box.ready.wait()
                box.listening = False
                wait = tick + interval_s - loop.time()
                if wait > 0 and not box.urgent.is_set():  # gather what decodes meanwhile
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(box.urgent.wait(), wait)
                everything = loop.time() >= tick + interval_s
                if everything:
                    tick = loop.time()
                seq += 1
                yield box.take(seq, everything=everything)
        finally:
            box.withdraw()
            self._streams.pop(stream_id, None)

    def _unclaimed(self, stream_id: str) -> None:
        box = self._streams.get(stream_id)
        if box is not None and not box.attached:
            box.withdraw()
            del self._streams[stream_id]

    def _outbox(self) -> _Outbox:
        box = _Outbox()
        if self.closing:
            box.close()
        return box

    def close_streams(self) -> None:
        """The worker leaves its role: every stream's next frame says so (``Frame.closing``),
        and its consumer closes the stream once its requests have ended. That close is the
        acknowledgement a drain waits for (``attached``): the frame that announced it came
        last, so the consumer holds every frame before it. Without it the worker could be
        stopped while its last frame is still on the way, and its requests would fail
        mid-stream."""
        self.closing = True
        for box in self._streams.values():
            box.close()

    @property
    def attached(self) -> int:
        """Streams a consumer still reads."""
        return sum(box.attached for box in self._streams.values())

    def close(self) -> None:
        for box in self._streams.values():
            box.withdraw()
        self._streams.clear()

    @property
    def delivered(self) -> bool:
        """Every request's tokens and end have left in a frame (what a drain waits for after
        the engine's: the worker may stop only once its consumers have everything)."""
        return all(box.delivered for box in self._streams.values())

    @property
    def running(self) -> int:
        return sum(len(box.pumps) for box in self._streams.values())
