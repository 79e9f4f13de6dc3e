"""The request path's worker handles (docs/design.md "Serve runtime", §4 "Two levers").

A re-split (cluster/ray/pools.py) stops a worker's actor and starts one of the other role under
the same worker id while the ingress runs, so the path holds no fixed list: it looks a worker up
by role and id (the named actor ``<ns>-<role>-<id>``), caches the handle, and forgets it when
the actor died so that the next request looks again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ray import ObjectRef, ObjectRefGenerator
from ray.exceptions import ActorUnschedulableError, ObjectLostError, RayActorError, RayTaskError

from cluster.actor_ref import ActorRef

__all__ = ["RAY_FAILURES", "Workers", "named_worker_resolver", "not_taking_work", "ray_cancel"]

# A worker actor that died, is restarting, or cannot be placed. Anything else is our bug and
# propagates as a 500 with its message.
RAY_FAILURES: tuple[type[BaseException], ...] = (
    RayActorError,
    ObjectLostError,
    ActorUnschedulableError,
)
# Errors a worker raises when it takes no new work: draining for a re-split (cluster/ray/pools.py:
# the router stopped routing to it a moment ago) or shutting down. The request goes elsewhere.
_NOT_TAKING_WORK = ("EngineDraining", "EngineClosed")


def not_taking_work(exc: RayTaskError) -> bool:
    """Whether a worker's error says it takes no new work (the request goes elsewhere)."""
    cause = getattr(exc, "cause", None)
    return any(type(c).__name__ in _NOT_TAKING_WORK for c in (cause, exc))


def ray_cancel(refs: object) -> None:
    """Cancel a call (a streaming one: its generator) if Ray runs and it still runs."""
    import ray

    # Outside a Ray session there is nothing to cancel; calling ray.cancel there would start
    # a local Ray of its own (Ray's API auto-initialises).
    if not ray.is_initialized():
        return
    if not isinstance(refs, ObjectRef | ObjectRefGenerator):  # a test's stand-in
        return
    # Already finished, or the actor is gone: nothing is left to cancel.
    with contextlib.suppress(Exception):
        ray.cancel(refs)


Resolver = Callable[[str, int], ActorRef | None]


@dataclass
class Workers:
    """Worker handles by role and id, cached.

    A re-split (docs/design.md §4; cluster/ray/pools.py) stops a worker's actor and starts one
    of the other role under the same id, after this path was built. So the path never relies
    on a fixed list: ``resolve(role, id)`` (Ray: the named actor ``<ns>-<role>-<id>``) finds
    an id it has not seen, and :meth:`forget` drops a handle whose actor died so the next
    request looks again."""

    prefill: dict[int, ActorRef]
    decode: dict[int, ActorRef]
    resolve: Resolver | None = field(default=None, repr=False)

    def _pool(self, role: str) -> dict[int, ActorRef]:
        return self.prefill if role == "prefill" else self.decode

    async def get(self, role: str, worker: int) -> ActorRef | None:
        pool = self._pool(role)
        handle = pool.get(worker)
        if handle is None and self.resolve is not None:
            # ray.get_actor blocks on the GCS: off the event loop, once per new id.
            handle = await asyncio.to_thread(self.resolve, role, worker)
            if handle is not None:
                pool[worker] = handle
        return handle

    def forget(self, role: str, worker: int, handle: ActorRef | None = None) -> None:
        pool = self._pool(role)
        if handle is None or pool.get(worker) is handle:
            pool.pop(worker, None)

    def handles(self) -> list[tuple[str, int, ActorRef]]:
        return [("prefill", w, h) for w, h in self.prefill.items()] + [
            ("decode", w, h) for w, h in self.decode.items()
        ]


def named_worker_resolver(namespace: str) -> Resolver:
    """``(role, id)`` → the service's named worker actor, or None (none, or outside Ray)."""

    def resolve(role: str, worker: int) -> ActorRef | None:
        import ray

        from cluster.ray.worker_factory import RAY_NAMESPACE, worker_name

        if not ray.is_initialized():  # in-process compositions: the given handles are all
            return None
        try:
            return ray.get_actor(worker_name(namespace, role, worker), namespace=RAY_NAMESPACE)
        except ValueError:  # no such actor (yet, or any more)
            return None

    return resolve
