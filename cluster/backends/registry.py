"""The backends' registry: a name, and the package whose ``PLUG`` is the backend
(``cluster.backends``). Light on purpose: the configuration checks a backend's name here and the
CLI lists them before anything heavy loads."""

from __future__ import annotations

from collections.abc import Mapping

from cluster.worker_spec import EngineSpec

__all__ = ["BACKENDS", "backend_names", "engine_spec", "register_backend"]

BACKENDS: dict[str, str] = {"sim": "cluster.backends.sim", "dynamo": "cluster.backends.dynamo"}


def register_backend(name: str, module: str) -> None:
    """Make backend ``name`` (the ``PLUG`` of package ``module``) known to the service."""
    EngineSpec(backend=name, module=module)  # the shapes a WorkerSpec will carry
    BACKENDS[name] = module


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def engine_spec(name: str, settings: Mapping[str, object] | None = None) -> EngineSpec:
    """The ``EngineSpec`` naming backend ``name`` (its workers' own ``settings``)."""
    return EngineSpec(backend=name, module=BACKENDS[name], settings=dict(settings or {}))
