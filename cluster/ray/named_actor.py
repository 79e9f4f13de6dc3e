"""A control-plane actor named rather than handed over (docs/design.md "Serve runtime").

Ray keeps an actor handle given as a constructor argument in the object store, and an actor
that may restart (``max_restarts`` > 0) then logs an ERROR at creation: should that object be
lost, the restart fails (ray-project/ray#53727). The service's actors are named
(``worker_factory.control_actor_name``), so an actor that calls another is given its name and
finds it on first use; the handle it gets survives the other's restarts, as Ray's handles do.
"""

from __future__ import annotations

from cluster.actor_ref import ActorRef, RemoteMethod
from cluster.ray.worker_factory import RAY_NAMESPACE

__all__ = ["NamedActor"]


class NamedActor:
    """``NamedActor(name).method.remote(...)`` calls the running actor named ``name``."""

    __slots__ = ("_handle", "name", "namespace")

    def __init__(self, name: str, namespace: str = RAY_NAMESPACE) -> None:
        self.name, self.namespace = name, namespace
        self._handle: ActorRef | None = None  # Ray's handle, found on first use

    def handle(self) -> ActorRef:
        if self._handle is None:
            import ray

            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle

    def __getattr__(self, method: str) -> RemoteMethod:
        if method.startswith("_"):  # pickling and copying probe dunders: not actor methods
            raise AttributeError(method)
        remote: RemoteMethod = getattr(self.handle(), method)
        return remote

    def __reduce__(self) -> tuple[type[NamedActor], tuple[str, str]]:
        return NamedActor, (self.name, self.namespace)

    def __repr__(self) -> str:
        return f"NamedActor({self.name!r})"
