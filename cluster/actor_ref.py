"""A Ray actor as this project calls it, and its answers checked for their type (docs/design.md
"Serve runtime").

Ray leaves a handle's methods untyped: ``ref.method.remote(*args)`` gives an awaitable whose
value no checker can know. :class:`ActorRef` says exactly that much, so a handle, a
``NamedActor`` and a test's stand-in all fit it; each actor the service calls then gets a thin
wrapper whose methods name the record they return (``cluster/dataplane/refs.py`` for the data
path's calls, ``cluster/ray/refs.py`` for the control plane's), and :func:`answer_of` checks the
record at the one place it arrives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

__all__ = [
    "ActorHandles",
    "ActorRef",
    "RemoteMethod",
    "StreamMethod",
    "answer_of",
    "stream_method",
]

T = TypeVar("T")


class RemoteMethod(Protocol):
    """``handle.method``: ``.remote(*args)`` starts the call and gives what awaits its answer."""

    def remote(self, *args: object) -> Awaitable[object]: ...


class StreamMethod(Protocol):
    """``handle.method`` of a generator method: ``.remote(*args)`` gives, as they come, what
    awaits each item (Ray's ``ObjectRefGenerator``)."""

    def remote(self, *args: object) -> AsyncIterator[Awaitable[object]]: ...


class ActorRef(Protocol):
    """A Ray actor handle (or a ``NamedActor``, or a stand-in): every attribute is a method."""

    def __getattr__(self, method: str, /) -> RemoteMethod: ...


def answer_of(kind: type[T], value: object, where: str) -> T:
    """``value`` as a ``kind``, or TypeError naming the call ``where`` that answered otherwise."""
    if not isinstance(value, kind):
        raise TypeError(f"{where} answered {type(value).__name__}, not {kind.__name__}")
    return value


def stream_method(ref: ActorRef, method: str) -> StreamMethod:
    """``ref.<method>`` of a generator method (Ray streams its items)."""
    found: StreamMethod = getattr(ref, method)
    return found


@dataclass(frozen=True)
class ActorHandles:
    """The service's actors as an ingress replica is given them (picklable, so a Serve
    deployment carries them): the control plane's (None where the service runs without one)
    and the workers' handles by worker id."""

    auction: ActorRef
    router: ActorRef | None = None
    poa: ActorRef | None = None
    controller: ActorRef | None = None
    prefill: Mapping[int, ActorRef] = field(default_factory=dict)
    decode: Mapping[int, ActorRef] = field(default_factory=dict)

    def control_plane(self) -> tuple[ActorRef, ...]:
        """The control actors other than the auction that run (whose metrics a replica adds)."""
        return tuple(a for a in (self.router, self.poa, self.controller) if a is not None)
