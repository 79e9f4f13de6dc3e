"""Backends: what a service's workers run, one package and one registry entry each
(docs/design.md "Layout").

A backend supplies one :class:`BackendPlug`, its package's ``PLUG``:

- the worker side (:class:`cluster.worker_spec.WorkerPlug`): the worker actor class, its
  arguments, what runs after a worker starts at run time, its warm-up after a role switch. The
  launcher (deploy time and re-split alike) reaches it through the ``EngineSpec`` inside every
  ``WorkerSpec``, so ``cluster/ray/`` imports no backend;
- the driver side (:class:`Engines`, from :meth:`BackendPlug.engines`): the spec every worker
  starts with, the steps once the workers and then the control plane run, the router actor, the
  request path each ingress replica builds (its path pieces), and what to release at stop;
- its settings model (the section of the service's configuration named after it, if any).

:data:`BACKENDS` maps a backend's name to its package. :func:`register_backend` adds one
(``tests/cluster/toy_backend`` is a third, outside the product); ``ServeConfig.backend`` takes
any name registered here.
"""

from cluster.backends.protocol import BackendPlug, Engines, backend_plug, engines_for
from cluster.backends.registry import BACKENDS, backend_names, engine_spec, register_backend

__all__ = [
    "BACKENDS",
    "BackendPlug",
    "Engines",
    "backend_names",
    "backend_plug",
    "engine_spec",
    "engines_for",
    "register_backend",
]
