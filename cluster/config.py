"""The service's configuration file (``disaggctl serve --config FILE``), one strict model per shape.

Every field has a default, so an empty file (or none) serves the embedded default: a simulated
Llama-3.1-70B FP8 cluster, 1P/5D at TP = 4, an embedded NATS server, the auction and the adaptive
controller. Errors name the file and the field (:mod:`cluster.models`).

``speedup`` is the simulated engines' virtual seconds per wall second. Below 1 the cluster runs
slower than the hardware it models, so that one small machine can carry the HTTP streams of a
load that saturates the modelled GPUs: at 0.25 the 70B 1P/5D ceiling of 47 req/s becomes about
12 req/s of real HTTP traffic, with the same queueing (every engine time is stretched alike).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from auction import prefill_slots_per_worker
from cluster.backends.dynamo.settings import DynamoSettings
from cluster.backends.registry import backend_names
from cluster.dataplane.settings import AdmissionSettings, RoutingSettings
from cluster.ledger.urls import MAX_URL_CHARS, SCHEMA_PATTERN, check_postgres_url
from cluster.models import StrictModel, load_yaml_model
from cluster.ray.auction_settings import AuctionSettingsModel
from cluster.ray.controller_actor import ControllerSettings
from cluster.serve.limits import LimitSettings
from cluster.sim.profile import available_profiles, load_profile, normalise_topology
from cluster.sim.wallclock import MAX_SPEEDUP, MIN_SPEEDUP

__all__ = ["DEFAULT_CONFIG", "ServeConfig", "load_config"]


DYNAMO_DEFAULT_MAX_NUM_SEQS = 256  # dynamo.mocker's and vLLM's default --max-num-seqs


def _known_backend(name: str) -> str:
    if name not in backend_names():  # cluster.backends: one registry entry per backend
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(backend_names())}")
    return name


def _known_profile(name: str) -> str:
    if name not in available_profiles():
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(available_profiles())}")
    return name


class ServeConfig(StrictModel):
    """What ``disaggctl serve`` deploys (docs/design.md "Serve runtime")."""

    profile: Annotated[str, AfterValidator(_known_profile)] = "b200-llama70b-fp8-tp4"
    topology: str = "1P/5D"
    speedup: float = Field(default=0.25, ge=MIN_SPEEDUP, le=MAX_SPEEDUP)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    namespace: str = Field(default="disagg", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # None: start an embedded nats-server (loopback, free port, dies with the service).
    nats_url: str | None = Field(default=None, max_length=512)
    model_name: str = Field(default="disagg-tiny", pattern=r"^[A-Za-z0-9._/-]{1,128}$")
    # None: the project's tiny offline model directory (cluster.model_dir.default_model_dir). A
    # model's own directory (its tokenizer files; the weights vLLM loads) is used as it is.
    model_dir: str | None = Field(default=None, max_length=4096)
    # The auction's ledger: a SQLite file by default (one host: the auction runs on Ray's
    # head); on a cluster a PostgreSQL URL without a password (libpq reads PGPASSWORD or
    # PGPASSFILE; TLS from the URL's sslmode), whose schema ``ledger_schema`` holds the tables.
    ledger_path: str = Field(default="results/serve/ledger.sqlite", max_length=4096)
    ledger_url: Annotated[str, AfterValidator(check_postgres_url)] | None = Field(
        default=None, max_length=MAX_URL_CHARS
    )
    ledger_schema: str = Field(default="disaggctl", pattern=SCHEMA_PATTERN)
    allow_anonymous: bool = True
    # /metrics on its own port, never the API's (docs/design.md "Security model"): a scraper is
    # not a client. 0: any free port (the service says which). The Helm chart binds 0.0.0.0
    # and lets only the ServiceMonitor's Prometheus reach it.
    metrics_host: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:-]{1,253}$")
    metrics_port: int = Field(default=9464, ge=0, le=65_535)
    ingress_replicas: int = Field(default=1, ge=1, le=64)
    # Each ingress replica also serves HTTP itself, replica i on direct_port + i, beside Serve's
    # proxy on the API port (cluster/serve/direct_ingress.py: one process less per request).
    # None: the proxy only.
    direct_port: int | None = Field(default=None, ge=1024, le=65_535)
    # Per-identity rate and concurrency limits, and the share kept for paid users
    # (cluster/serve/limits.py): 429 with Retry-After. Service-wide; each replica takes 1/N.
    limits: LimitSettings = LimitSettings()
    # Ray Serve's default of 5 collapses a burst to ~12 req/s (docs/design.md §6 "Ray").
    max_ongoing_requests: int = Field(default=2000, ge=1, le=100_000)
    # Each simulated worker asks for its TP share of this Ray resource; on real nodes the
    # accelerator is named by the node's resources (e.g. {"B200": 8} per node).
    accelerator_resource: str = Field(default="B200", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    # A Ray custom resource that only the nodes allowed to run the control plane (router,
    # auction, PoA, controller, metrics) and the ingress replicas declare; None: any node. The
    # chart's head declares it, so its worker pods run worker actors only and hold only the
    # worker's (and Dynamo's) NATS credentials, never the controller's beside a model's code.
    control_resource: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    # On real GPU nodes each worker also asks Ray for its TP share of GPUs (num_gpus), so Ray
    # sets CUDA_VISIBLE_DEVICES for it; the simulated engines need none.
    request_gpus: bool = False
    worker_max_restarts: int = Field(default=3, ge=0, le=100)
    auction: AuctionSettingsModel = AuctionSettingsModel()
    controller: ControllerSettings = ControllerSettings()
    # The decode stream's coalescing: after the first token (sent at once), a worker sends what
    # it decoded at most every this many wall seconds, one Ray object each (0: one per decode
    # iteration). 50 ms: a stream read by a person then updates 20 times a second, as often
    # as a screen needs, while each Ray object (and SSE event) carries several decode steps
    # (8.5 ms each on the 70B profile). cluster/backends/sim/workers.py; docs/design.md "Data flow"
    # has the measurement (TTFT is not affected: the first token never waits).
    stream_chunk_s: float = Field(default=0.05, ge=0.0, le=1.0)
    # A decode worker's submit only queues orders (milliseconds, whatever the load); one that
    # has not answered within this is wedged, and its requests are placed again or get a 503
    # naming it (cluster/backends/sim/decode_streams.py).
    submit_timeout_s: float = Field(default=10.0, gt=0.0, le=600.0)
    # A prefill call answers when the prompt is computed, its queue at the engine included: in
    # the deepest overload replayed here (1P/5D, Mooncake ×2) TTFTs reach 5 min. One with no
    # answer after this is wedged: the request is placed again or gets a 503 naming the worker.
    prefill_timeout_s: float = Field(default=600.0, gt=0.0, le=3600.0)
    # How each ingress replica's routing view stays current (cluster/dataplane/settings.py).
    routing: RoutingSettings = RoutingSettings()
    # The auction's lease and the batched exchange at saturation (cluster/dataplane/settings.py).
    admission: AdmissionSettings = AdmissionSettings()
    # "sim": the simulated engines of ``profile``; "dynamo": real Dynamo worker processes
    # (``dynamo.mocker`` on CPU, ``dynamo.vllm`` on GPU nodes) routed by Dynamo's KvRouter with
    # the controller's override, our router in shadow (docs/design.md §6 "Dynamo backend").
    backend: Annotated[str, AfterValidator(_known_backend)] = "sim"
    dynamo: DynamoSettings = DynamoSettings()

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: str) -> str:
        return normalise_topology(value)

    @model_validator(mode="after")
    def _direct_ports_fit(self) -> ServeConfig:
        if self.direct_port is None:
            return self
        last = self.direct_port + self.ingress_replicas - 1
        if last > 65_535:
            raise ValueError(
                f"direct_port: {self.ingress_replicas} replicas need ports {self.direct_port}"
                f"-{last}, beyond 65535"
            )
        if self.direct_port <= self.metrics_port <= last:
            raise ValueError(
                f"direct_port: the replicas' ports {self.direct_port}-{last} include "
                f"metrics_port {self.metrics_port}"
            )
        return self

    @model_validator(mode="after")
    def _dynamo_needs_prefill(self) -> ServeConfig:
        if self.backend == "dynamo" and self.topology.startswith("0P"):
            raise ValueError(
                "topology: the dynamo backend serves disaggregated pools, so it needs at least "
                f"one prefill worker (got {self.topology})"
            )
        if self.backend == "dynamo" and self.dynamo.model_name != self.model_name:
            raise ValueError(
                f"dynamo.model_name ({self.dynamo.model_name!r}) must equal model_name "
                f"({self.model_name!r}): the ingress serves the model the workers load"
            )
        return self

    def prefill_slots_per_worker(self) -> int:
        """Released requests each prefill worker may hold without a first token when the
        auction's ``max_in_prefill`` is derived (``auction.prefill_slots_per_worker``) from what
        one of its iterations takes: the profile's ``max_batch_requests``; Dynamo's
        ``max_num_seqs``, 256 by default in the mocker and vLLM."""
        if self.backend == "dynamo":
            per_iteration = self.dynamo.max_num_seqs or DYNAMO_DEFAULT_MAX_NUM_SEQS
        else:
            per_iteration = load_profile(self.profile).prefill.max_batch_requests
        return prefill_slots_per_worker(per_iteration)


DEFAULT_CONFIG = ServeConfig()


def load_config(path: str | Path | None) -> ServeConfig:
    """The file's configuration, or the embedded default when ``path`` is None."""
    if path is None:
        return DEFAULT_CONFIG
    return load_yaml_model(ServeConfig, path)
