"""A Dynamo deployment's settings, and the commands and environment that start its processes.

:class:`DynamoSettings` is the edge shape (strict, frozen, bounded; every error names its field).
The functions below are pure: they turn settings into argv lists and environments, so the tests can
hold them exactly and the process layer (``process.py``) never assembles a flag itself. Flag and
variable names are the ones ``ai-dynamo==1.6.1`` parses (checked in ``dynamo/mocker/args.py``,
``dynamo/vllm/args.py`` and ``dynamo/common/configuration/groups/runtime_args.py``):

- ``dynamo.mocker`` and ``dynamo.vllm`` serve ``dyn://<ns>.prefill.generate`` in prefill mode and
  ``dyn://<ns>.backend.generate`` otherwise; ``<ns>`` comes from ``DYN_NAMESPACE`` (default
  ``dynamo``). ``--endpoint`` is passed only where the settings name other components.
- The vLLM worker takes vLLM's own ``--model``/``--served-model-name``/``--block-size`` (its
  parser forwards unknown flags to vLLM's ``AsyncEngineArgs``) and Dynamo's
  ``--disaggregation-mode``.
"""

from __future__ import annotations

import random
import socket
import sys
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cluster.backends.dynamo.discovery import ETCD_URLS_PATTERN, LOOPBACK, Discovery
from cluster.backends.dynamo.etcd_auth import etcd_auth_env
from cluster.bus import redact_url
from cluster.models import StrictModel
from cluster.nats_auth import dynamo_auth_env

__all__ = [
    "DEFAULT_COMPONENTS",
    "DynamoSettings",
    "Role",
    "dynamo_env",
    "free_system_port",
    "frontend_command",
    "worker_command",
]

Role = Literal["prefill", "decode"]
_TOKEN = r"^[A-Za-z0-9_-]{1,64}$"  # one NATS subject token: no dots, spaces or wildcards
# What Dynamo's workers register as when no --endpoint is given (per role).
DEFAULT_COMPONENTS: dict[str, str] = {"prefill": "prefill", "decode": "backend"}
DEFAULT_ENDPOINT = "generate"
MAX_VLLM_ARGS = 64
MAX_VLLM_ARG_CHARS = 512
# Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a signed 16-bit integer and exits on a larger one, so
# system ports come from below the kernel's ephemeral range (free_system_port).
MAX_SYSTEM_PORT = 32767
SYSTEM_PORT_RANGE = (20000, MAX_SYSTEM_PORT)


class DynamoSettings(StrictModel):
    """One Dynamo deployment's engine and worker settings (docs/design.md §6 "Dynamo")."""

    engine: Literal["mocker", "vllm"] = "mocker"
    namespace: str = Field(default="dynamo", pattern=_TOKEN)
    prefill_component: str = Field(default="prefill", pattern=_TOKEN)
    decode_component: str = Field(default="backend", pattern=_TOKEN)
    endpoint: str = Field(default="generate", pattern=_TOKEN)
    block_size: int = Field(default=16, ge=1, le=1024)
    # The mocker's --num-gpu-blocks-override: the simulated KV capacity per worker.
    num_gpu_blocks: int = Field(default=512, ge=16, le=10_000_000)
    # The mocker's --speedup-ratio: simulated time runs this much faster than wall time.
    speedup_ratio: float = Field(default=10.0, gt=0.0, le=1000.0)
    # --max-num-seqs of either engine: the most sequences one worker runs at once (None: the
    # engine's default). Past it requests wait in the engine's queue, where priority counts.
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    # Extra flags for dynamo.vllm (e.g. "--tensor-parallel-size", "4"); ignored by the mocker.
    # A YAML list arrives as a list: accepted here (the items stay strict strings).
    vllm_args: tuple[str, ...] = Field(default=(), max_length=MAX_VLLM_ARGS, strict=False)
    model_path: str | None = Field(default=None, min_length=1, max_length=4096)
    model_name: str = Field(default="disagg-tiny", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$")
    startup_timeout_s: float = Field(default=60.0, gt=0.0, le=3600.0)
    max_restarts: int = Field(default=5, ge=0, le=1000)
    restart_backoff_s: float = Field(default=0.5, ge=0.0, le=300.0)
    # Liveness: a running process whose /health has not said "generate: ready" for this many
    # checks in a row (one per health_period_s) is hung, and is killed and restarted.
    health_period_s: float = Field(default=5.0, gt=0.0, le=3600.0)
    health_failures: int = Field(default=3, ge=1, le=1000)
    # Where the processes find each other (cluster/backends/dynamo/discovery.py): "file", a folder
    # on one
    # host; "etcd", across hosts, at etcd_endpoints (None: the service starts an etcd itself).
    discovery: Literal["file", "etcd"] = "file"
    etcd_endpoints: str | None = Field(default=None, max_length=1024, pattern=ETCD_URLS_PATTERN)
    # The address the processes listen on and announce: loopback, or the Ray node's IP address
    # (workers and ingress replicas on several hosts).
    bind: Literal["loopback", "node"] = "loopback"
    # Where each worker writes its process's log, on its own node (None: the folder of the
    # service's ledger_path, dynamo-logs/). On Kubernetes a writable scratch volume (/tmp).
    log_dir: str | None = Field(default=None, min_length=1, max_length=4096)

    @field_validator("vllm_args")
    @classmethod
    def _bounded_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, arg in enumerate(value):
            if len(arg) > MAX_VLLM_ARG_CHARS or "\x00" in arg:
                raise ValueError(
                    f"item {i} must be at most {MAX_VLLM_ARG_CHARS} characters without NUL"
                )
        return value

    @model_validator(mode="after")
    def _endpoints_need_etcd(self) -> DynamoSettings:
        if self.etcd_endpoints is not None and self.discovery != "etcd":
            raise ValueError("etcd_endpoints: set only with discovery: etcd")
        return self

    def component(self, role: Role) -> str:
        """The Dynamo component a worker of ``role`` registers under."""
        return self.prefill_component if role == "prefill" else self.decode_component


def free_system_port(attempts: int = 200) -> int:
    """A loopback port Dynamo accepts as ``DYN_SYSTEM_PORT`` (at most 32767) that is free now.

    ``cluster.nats_server.free_port`` asks the kernel, which answers from the ephemeral range
    (above 32767 on Linux): Dynamo would exit on it. Free now is not free later: a process that
    loses the race logs that its system port was taken (``process.PORT_TAKEN_MARK``)."""
    rng = random.SystemRandom()
    for _ in range(attempts):
        port = rng.randint(*SYSTEM_PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {SYSTEM_PORT_RANGE} after {attempts} tries")


def _check_role(role: str) -> Role:
    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
    return role  # type: ignore[return-value]


def _endpoint_flag(settings: DynamoSettings, role: Role) -> list[str]:
    """``--endpoint dyn://ns.comp.ep`` only when the settings leave Dynamo's default names."""
    component = settings.component(role)
    if component == DEFAULT_COMPONENTS[role] and settings.endpoint == DEFAULT_ENDPOINT:
        return []
    return ["--endpoint", f"dyn://{settings.namespace}.{component}.{settings.endpoint}"]


def _engine_flags(settings: DynamoSettings) -> list[str]:
    if settings.max_num_seqs is None:
        return []
    return ["--max-num-seqs", str(settings.max_num_seqs)]


def _vllm_scheduling(settings: DynamoSettings) -> list[str]:
    """``--scheduling-policy priority`` unless ``vllm_args`` picks a policy: without it vLLM
    serves first-come and ignores the ``routing.priority`` each request carries."""
    if any(a.startswith("--scheduling-policy") for a in settings.vllm_args):
        return []
    return ["--scheduling-policy", "priority"]


def worker_command(settings: DynamoSettings, role: str, model_path: str) -> list[str]:
    """The argv of one worker of ``role`` (prefill or decode) serving ``model_path``."""
    r = _check_role(role)
    if settings.engine == "mocker":
        return [
            sys.executable,
            "-m",
            "dynamo.mocker",
            "--model-path",
            model_path,
            "--model-name",
            settings.model_name,
            "--block-size",
            str(settings.block_size),
            "--num-gpu-blocks-override",
            str(settings.num_gpu_blocks),
            "--speedup-ratio",
            repr(settings.speedup_ratio),
            "--disaggregation-mode",
            r,
            *_endpoint_flag(settings, r),
            *_engine_flags(settings),
        ]
    return [
        sys.executable,
        "-m",
        "dynamo.vllm",
        "--model",
        model_path,
        "--served-model-name",
        settings.model_name,
        "--block-size",
        str(settings.block_size),
        "--disaggregation-mode",
        r,
        *_endpoint_flag(settings, r),
        *_engine_flags(settings),
        *_vllm_scheduling(settings),
        *settings.vllm_args,
    ]


def frontend_command(
    settings: DynamoSettings, http_port: int, router_mode: str = "kv"
) -> list[str]:
    """The argv of ``dynamo.frontend`` on loopback ``http_port`` (namespace from the env)."""
    if not 1 <= http_port <= 65535:
        raise ValueError(f"http_port must lie in [1, 65535], got {http_port}")
    if router_mode not in ("kv", "round-robin", "random", "power-of-two"):
        raise ValueError(f"router_mode {router_mode!r} is not one this project uses")
    return [
        sys.executable,
        "-m",
        "dynamo.frontend",
        "--router-mode",
        router_mode,
        "--http-host",
        LOOPBACK,
        "--http-port",
        str(http_port),
    ]


def dynamo_env(
    settings: DynamoSettings, *, nats_url: str, discovery: Discovery, system_port: int | None,
    host: str = LOOPBACK,
) -> dict[str, str]:  # fmt: skip
    """The variables a Dynamo process needs besides the inherited environment: its
    ``discovery``, NATS for events (as the ``dynamo`` role when the bus has credentials), TCP
    requests on ``host`` (cluster/backends/dynamo/discovery.py: loopback or the node's address), the
    system port on loopback, offline Hugging Face."""
    if not nats_url.startswith(("nats://", "tls://")):
        raise ValueError(f"nats_url must be a nats:// URL, got {redact_url(nats_url)!r}")
    env = {
        "DYN_NAMESPACE": settings.namespace,
        **discovery.env(),
        **(etcd_auth_env() if discovery.backend == "etcd" else {}),  # the dynamo etcd user
        "DYN_EVENT_PLANE": "nats",
        "DYN_REQUEST_PLANE": "tcp",
        **dynamo_auth_env(nats_url),  # NATS_SERVER, and the dynamo role's credentials
        "HF_HUB_OFFLINE": "1",
        "DYN_TCP_RPC_HOST": host,
        "DYN_TCP_RESPONSE_STREAM_HOST": host,
        "DYN_EVENT_PLANE_HOST": host,
        "DYN_SYSTEM_HOST": LOOPBACK,  # read only by the owning actor, on this host
    }
    if system_port is not None:
        if not 1 <= system_port <= MAX_SYSTEM_PORT:
            raise ValueError(
                f"system_port must lie in [1, {MAX_SYSTEM_PORT}] (Dynamo 1.6.1 parses "
                f"DYN_SYSTEM_PORT as an i16), got {system_port}"
            )
        env["DYN_SYSTEM_PORT"] = str(system_port)
    return env
