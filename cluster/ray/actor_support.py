"""What the serve runtime's actors share (docs/design.md "Serve runtime"): ``Ready`` for
``ready()``, argument checks, and coming back after Ray restarted an actor. Their NATS link,
off the request path, is ``cluster.actor_bus.ActorBus``."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from cluster.events import MAX_ID_CHARS
from router.hashing import U64_MASK

__all__ = [
    "MAX_PROMPT_TOKENS",
    "Ready",
    "check_hashes",
    "check_int",
    "check_request_id",
    "ready_record",
]

log = logging.getLogger(__name__)


MAX_PROMPT_TOKENS = 1 << 20  # a longer prompt is refused: bounds the work one request causes


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
