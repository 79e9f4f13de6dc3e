"""What the HTTP edge hands to the request path, and what the path hands back (docs/design.md
"Serve runtime").

The ingress authenticates, validates and tokenizes; everything after that (admission by the
auction actor, routing, prefill, decode, NATS events, charging) is a :class:`RequestPath`. The
ingress needs only this module to talk to it, so the edge is tested with a fake path and the real
one, over Ray actor handles, is written against the same Protocol.

Event order of one request: ``Admitted``, then ``Routed``, then one or more ``TokenChunk``, then
``Finished``. Failures raise :class:`PathError`. Closing the iterator early (``aclose``: the
client went away) means the request is abandoned: the path must leave the system, never charge,
and release what it holds (its ``finally``/``GeneratorExit`` handling).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias

__all__ = [
    "Admitted",
    "Finished",
    "PathError",
    "PathEvent",
    "PathRequest",
    "RequestPath",
    "Routed",
    "TokenChunk",
]


@dataclass(frozen=True)
class PathRequest:
    """One authenticated, validated and tokenized request.

    ``bid`` is the most the user will pay (finite, ≥ 0); ``tokens`` the prompt's token ids (chat
    template applied); ``max_tokens`` the output length asked for (prompt + output fit the
    model's context: the ingress checked)."""

    request_id: str
    user: str
    bid: float
    tokens: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Admitted:
    """The auction released the request. ``payment`` is the expected charge (≤ bid; the final
    one is in ``Finished``); ``mode`` is ``"fcfs"`` or ``"auction"``; ``batch_id`` is None for
    FCFS pass-through."""

    position: int
    payment: float
    batch_id: str | None
    mode: str


@dataclass(frozen=True)
class Routed:
    """Where the request runs; ``prefill_worker`` is None when the decode worker prefills
    locally. ``cached_tokens`` is the prompt prefix found in the KV cache (usage's
    ``prompt_tokens_details.cached_tokens``)."""

    decode_worker: int
    prefill_worker: int | None
    policy_version: int
    regime: str
    cached_tokens: int


@dataclass(frozen=True)
class TokenChunk:
    """Output token ids, in order (≥ 1 per chunk)."""

    token_ids: list[int]


@dataclass(frozen=True)
class Finished:
    """The request was answered; ``payment_charged`` is what the ledger captured."""

    payment_charged: float


PathEvent: TypeAlias = Admitted | Routed | TokenChunk | Finished


class PathError(Exception):
    """A failure the client must see with an HTTP status: 401 unknown user, 402 bid above the
    remaining budget, 503 no worker (after one retry). ``code`` is the machine-readable reason
    where the refusal was decided (``budget_exceeded``, ``queue_full``, ``lease_expired``...;
    None: the edge names it by its status). Nothing is charged for a request that ends in a
    PathError."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(status, message, code)
        self.status = status
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


class RequestPath(Protocol):
    """The request's way through the actors. Implement ``run`` as an async generator
    (``async def run(self, req): ... yield event``); calling it returns the iterator, which the
    ingress consumes and, when the client leaves, closes with ``aclose()``."""

    def run(self, req: PathRequest) -> AsyncIterator[PathEvent]: ...
