"""ASGI plumbing of the ingress: closing the request path when the client leaves, and the
headers every response carries (docs/design.md "Serve runtime").

A client can leave at three moments, and each must close the path's iterator so the request
leaves the system (the path then releases its slot and its hold, and charges nothing):
- while the ingress waits for admission or, not streaming, for the whole answer: nothing is
  being sent, so Starlette would not notice; :func:`until_disconnect` watches ``receive`` for
  ``http.disconnect`` and cancels the wait;
- mid-stream: Starlette stops iterating the body when a send fails or (ASGI spec < 2.4) when it
  sees the disconnect, but leaves the body generator suspended; :class:`ClosingStream` closes it;
- under Ray Serve a disconnect also cancels the handler task; the same ``finally`` blocks run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import TypeVar

from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.serve.path_types import PathEvent

__all__ = [
    "PAYMENT_HEADER",
    "POSITION_HEADER",
    "ClientGoneError",
    "ClosingStream",
    "DefaultHeaders",
    "close_path",
    "next_event",
    "until_disconnect",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

PAYMENT_HEADER, POSITION_HEADER = "x-disagg-payment", "x-disagg-position"
_DEFAULT_HEADERS = ((PAYMENT_HEADER.encode(), b"0"), (POSITION_HEADER.encode(), b"-1"))


class DefaultHeaders:
    """Adds ``x-disagg-payment: 0`` and ``x-disagg-position: -1`` to responses that lack them
    (errors, and the routes that admit nothing), so every response carries both."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_defaults(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in _DEFAULT_HEADERS if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_defaults if scope["type"] == "http" else send)


class ClientGoneError(Exception):
    """The client disconnected while the ingress waited on the path."""


class ClosingStream(StreamingResponse):
    """A StreamingResponse that always closes its body iterator (and so the path's): Starlette
    abandons it where it stands when the client leaves or a send fails."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            pass  # ASGI ≥ 2.4 reports a gone client so; nobody is left to answer
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def next_event(events: AsyncIterator[PathEvent]) -> PathEvent | None:
    """The path's next event, or None at its end (StopAsyncIteration cannot cross a task)."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None


async def until_disconnect(request: Request, work: Coroutine[object, object, T]) -> T:
    """``await work``, unless the client disconnects first: then cancel it (the path sees
    CancelledError where it waits) and raise :class:`ClientGoneError`."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    gone = True  # unless the work finished (also when we are cancelled ourselves)
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        gone = not task.done()
    finally:
        for t in (task, watch):
            t.cancel()  # a no-op on a finished task
        await asyncio.gather(task, watch, return_exceptions=True)
    if gone:
        raise ClientGoneError
    return task.result()


async def _disconnected(request: Request) -> None:
    # The body has been read: the next ASGI message can only be the disconnect.
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a broken receive channel is no proof the client left: keep working
        log.debug("receive failed while watching for a disconnect", exc_info=True)
        await asyncio.Event().wait()


async def close_path(events: AsyncIterator[PathEvent]) -> None:
    """Close the path's iterator (the request leaves the system); a cleanup that fails is logged,
    never raised into the response."""
    close = getattr(events, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception:
        log.warning("closing the request path failed", exc_info=True)
