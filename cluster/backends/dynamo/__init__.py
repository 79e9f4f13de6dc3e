"""The real Dynamo backend (docs/design.md §6 "Dynamo"): Dynamo's worker and frontend processes.

Optional: nothing here imports ``dynamo``; the processes do, so ``make demo`` runs without it and
``require_dynamo()`` names ``make dynamo`` when it is missing. ``settings`` turns settings into
argv and environment (pure), ``process`` runs one process under the owner-death watchdog,
``worker_actor`` keeps one worker slot up (restarts, new instance ids told to the router) and
``frontend`` runs Dynamo's own OpenAI frontend, the baseline the benchmarks compare against;
``plug`` is the backend's registry entry (``cluster.backends``), ``service`` its steps in a
service's start and stop, ``backend`` its request path in each ingress replica.
"""

from cluster.backends.dynamo.frontend import DynamoFrontend
from cluster.backends.dynamo.install import (
    DYNAMO_VERSION,
    DynamoMissingError,
    dynamo_available,
    require_dynamo,
)
from cluster.backends.dynamo.plug import PLUG, DynamoPlug
from cluster.backends.dynamo.process import (
    DynamoProcess,
    DynamoStartError,
    instance_id_from_metrics,
)
from cluster.backends.dynamo.settings import (
    DynamoSettings,
    dynamo_env,
    frontend_command,
    worker_command,
)
from cluster.backends.dynamo.worker_actor import DynamoWorkerActor, dynamo_worker_name

__all__ = [
    "DYNAMO_VERSION",
    "PLUG",
    "DynamoFrontend",
    "DynamoMissingError",
    "DynamoPlug",
    "DynamoProcess",
    "DynamoSettings",
    "DynamoStartError",
    "DynamoWorkerActor",
    "dynamo_available",
    "dynamo_env",
    "dynamo_worker_name",
    "frontend_command",
    "instance_id_from_metrics",
    "require_dynamo",
    "worker_command",
]
