"""What a Dynamo service's workers carry in ``WorkerSpec.engine.settings``
(``cluster.worker_spec``), and the settings each worker's process gets from it."""

from __future__ import annotations

from pydantic import Field

from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.settings import DynamoSettings
from cluster.models import StrictModel
from cluster.worker_spec import WorkerSpec

__all__ = ["DynamoWorkerSpec", "dynamo_worker_settings"]


class DynamoWorkerSpec(StrictModel):
    """Where a service's Dynamo workers run (``WorkerSpec.engine.settings``): their settings
    (``DynamoSettings`` as a dict), the discovery every Dynamo process of the service shares
    (``cluster.backends.dynamo.discovery``) and the folder of their logs (one file per worker, on
    each worker's node)."""

    settings: dict[str, object]  # DynamoSettings.model_dump(), validated where it runs
    discovery: Discovery
    log_dir: str = Field(min_length=1, max_length=4096)


def dynamo_worker_settings(spec: WorkerSpec) -> dict[str, object]:
    """A Dynamo worker's settings: the service's, and for vLLM the TP size of its placement
    (``--tensor-parallel-size``, unless ``vllm_args`` already sets it), so the engine spans
    exactly the GPUs its bundle holds."""
    if spec.engine.backend != "dynamo":
        raise ValueError(f"not a Dynamo service: its backend is {spec.engine.backend!r}")
    own = DynamoSettings.model_validate(
        DynamoWorkerSpec.model_validate(spec.engine.settings).settings
    )
    settings: dict[str, object] = own.model_dump()
    args = own.vllm_args
    if settings["engine"] == "vllm" and "--tensor-parallel-size" not in args:
        settings["vllm_args"] = (*args, "--tensor-parallel-size", str(spec.tp))
    return settings
