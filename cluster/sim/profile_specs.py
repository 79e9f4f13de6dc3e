"""The edge models of a hardware profile (docs/design.md §6): one strict pydantic model per
shape, which a profile's YAML and the records of :mod:`cluster.sim.profile` are both checked by
(finite, closed, bounded; errors name the field's dotted path). Also the bounds on what one
simulated run may build and the topology syntax ``xP/yD``."""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cluster.models import StrictModel

# Bounds on what one simulated run may build (documented in ``disaggctl sim run --help``). The
# simulator keeps every finished request; at these bounds a 300 s hold stays near 2 GB.
MAX_PREFILL_WORKERS = 16
MAX_DECODE_WORKERS = 32
MAX_CONCURRENCY = 1024

MeasuredMetric = Literal[
    "throughput_rps", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p99_s",
    "cache_hit_rate",
]  # fmt: skip
DerivedMetric = Literal["knee_concurrency", "kv_capacity_tokens"]
Metric = Literal[MeasuredMetric, DerivedMetric]
MEASURED_METRICS: tuple[str, ...] = get_args(MeasuredMetric)
DERIVED_METRICS: tuple[str, ...] = get_args(DerivedMetric)

_TOPOLOGY = re.compile(r"\s*(\d{1,9})\s*P\s*/\s*(\d{1,9})\s*D\s*", re.IGNORECASE)


def normalise_topology(text: str) -> str:
    """``" 1p / 5d "`` → ``"1P/5D"``; at most ``MAX_PREFILL_WORKERS`` / ``MAX_DECODE_WORKERS``."""
    match = _TOPOLOGY.fullmatch(text)
    if not match:
        raise ValueError("must look like xP/yD, e.g. 1P/5D")
    prefill, decode = int(match[1]), int(match[2])
    if not 0 <= prefill <= MAX_PREFILL_WORKERS:
        raise ValueError(f"must have 0 to {MAX_PREFILL_WORKERS} prefill workers")
    if not 1 <= decode <= MAX_DECODE_WORKERS:
        raise ValueError(f"must have 1 to {MAX_DECODE_WORKERS} decode workers")
    return f"{prefill}P/{decode}D"


# ---- the edge models: one per shape ------------------------------------------------------------


class PrefillSpec(StrictModel):
    a_s: float = Field(ge=0, le=10)
    b_s_per_token: float = Field(ge=0, le=1)
    c_s_per_request: float = Field(ge=0, le=10)
    # Attention: seconds per (query, key) token pair (PrefillModel). No default in a profile:
    # each states its own, derived from its architecture and GPU in the YAML.
    e_s_per_token_pair: float = Field(ge=0, le=1e-3)
    # Seconds per (new token of the iteration)²: a quadratic fitted on the iteration's total
    # new tokens, as Dynamo's mocker times a pass (PrefillModel). 0 for a model whose quadratic
    # cost is each request's attention (e).
    f_s_per_iteration_token_sq: float = Field(default=0.0, ge=0, le=1e-3)
    jitter: float = Field(ge=0, le=1)  # coefficient of variation of the lognormal factor
    max_batch_tokens: int = Field(ge=1, le=1 << 20)
    max_batch_requests: int = Field(ge=1, le=1 << 16)
    kv_capacity_tokens: int = Field(ge=1, le=10**9)

    @model_validator(mode="after")
    def _costs_something(self) -> PrefillSpec:
        # A free iteration never advances simulated time: the event loop would spin forever.
        if self.a_s == self.b_s_per_token == self.c_s_per_request == 0:
            raise ValueError("a_s, b_s_per_token and c_s_per_request cannot all be 0")
        return self


class DecodeSpec(StrictModel):
    d0_s: float = Field(gt=0, le=10)  # > 0: every iteration reads the weights (and time moves)
    d1_s_per_seq: float = Field(ge=0, le=1)
    d2_s_per_kv_token: float = Field(ge=0, le=1)
    # Seconds per (KV token held)²: the curvature of a step's time in the KV it reads, as
    # Dynamo's mocker has it (negative there: its time flattens as the cache fills). 0 for the
    # linear model.
    d3_s_per_kv_token_sq: float = Field(default=0.0, ge=-1e-6, le=1e-6)
    jitter: float = Field(ge=0, le=1)
    max_batch: int = Field(ge=1, le=1 << 16)
    kv_capacity_tokens: int = Field(ge=1, le=10**9)
    local_prefill_max_tokens: int = Field(ge=0, le=10**7)
    local_prefill_s_per_token: float = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _steps_take_time(self) -> DecodeSpec:
        # A quadratic in the KV held takes its least value over [0, capacity] at an end (it is
        # concave when d3 < 0): positive there, positive throughout (and time moves).
        full = self.kv_capacity_tokens
        at_full = self.d0_s + self.d2_s_per_kv_token * full + self.d3_s_per_kv_token_sq * full**2
        if at_full <= 0:
            raise ValueError(
                f"d3_s_per_kv_token_sq: a step with the cache full would take {at_full:g} s"
            )
        return self


class LinkSpec(StrictModel):
    bandwidth_gbps: float = Field(gt=0, le=100_000)
    latency_s: float = Field(ge=0, le=10)


class WorkloadSpec(StrictModel):
    templates: int = Field(ge=1, le=10_000)
    template_tokens: int = Field(ge=0, le=10**6)
    input_tokens: int = Field(ge=1, le=10**6)
    output_tokens: int = Field(ge=1, le=10**6)

    @model_validator(mode="after")
    def _template_fits(self) -> WorkloadSpec:
        if self.template_tokens > self.input_tokens:
            raise ValueError("template_tokens exceeds input_tokens")
        return self


class ArchitectureSpec(StrictModel):
    """The attention shape: KV bytes per token = 2 (K and V) · layers · kv_heads · head_dim ·
    kv_dtype_bytes; attention FLOPs per (query, key) pair = 4 · layers · heads · head_dim (QKᵀ
    and AV, a multiply-add being 2 FLOPs), which the profile's ``e_s_per_token_pair`` is
    derived from (``cluster.sim.calibration.attention_s_per_token_pair``)."""

    layers: int = Field(ge=1, le=1000)
    heads: int = Field(ge=1, le=4096)  # query heads
    kv_heads: int = Field(ge=1, le=1024)
    head_dim: int = Field(ge=1, le=4096)
    kv_dtype_bytes: int = Field(ge=1, le=4)  # 1 FP8, 2 BF16, 4 FP32

    @model_validator(mode="after")
    def _grouped(self) -> ArchitectureSpec:
        if self.heads % self.kv_heads:  # GQA: each KV head serves a whole group of query heads
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        return self

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def attention_flops_per_pair(self) -> int:
        return 4 * self.layers * self.heads * self.head_dim


class MemorySpec(StrictModel):
    """One GPU's memory budget: what is left for KV after weights and reserves (GiB = 2**30 B)."""

    gpu_memory_gib: float = Field(gt=0, le=1024)
    utilization: float = Field(gt=0, le=1)
    weight_params: int = Field(ge=1, le=10**13)
    weight_bytes_per_param: float = Field(gt=0, le=4)
    activation_gib: float = Field(ge=0, le=1024)
    runtime_gib: float = Field(ge=0, le=1024)


def _value_kind(value: object) -> str:
    return "range" if isinstance(value, list | tuple) else "number"


PublishedValue = Annotated[
    Annotated[Annotated[float, Field(gt=0)], Tag("number")]
    | Annotated[tuple[Annotated[float, Field(ge=0)], Annotated[float, Field(gt=0)]], Tag("range")],
    Discriminator(_value_kind),
]


class CalibrationSpec(StrictModel):
    """One published figure; ``value`` a number or a [low, high] range (relative tolerance)."""

    topology: str
    metric: Metric
    concurrency: int = Field(ge=0, le=MAX_CONCURRENCY)
    value: PublishedValue
    tolerance: float = Field(default=0.15, ge=0, le=1)
    reproduced: bool = True
    note: str = ""

    @field_validator("topology")
    @classmethod
    def _topology(cls, text: str) -> str:
        return normalise_topology(text)

    @field_validator("value", mode="before")
    @classmethod
    def _list_is_range(cls, value: object) -> object:
        if isinstance(value, list | tuple):  # YAML has no tuples
            if len(value) != 2:
                raise ValueError(f"a range is [low, high], 2 numbers, not {len(value)}")
            return tuple(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CalibrationSpec:
        if isinstance(self.value, tuple) and self.value[0] > self.value[1]:
            raise ValueError(f"value: range [{self.value[0]}, {self.value[1]}] has low > high")
        if self.metric in DERIVED_METRICS and self.concurrency != 0:
            raise ValueError(f"concurrency: must be 0 for {self.metric} (not an operating point)")
        if self.metric in MEASURED_METRICS and self.concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1 for {self.metric}")
        return self


class ProfileSpec(StrictModel):
    name: str = Field(min_length=1, max_length=100)
    model: str
    gpu: str
    tp: int = Field(ge=1, le=64)
    gpus_per_node: int = Field(ge=1, le=64)
    block_size: int = Field(ge=1, le=1024)
    kv_bytes_per_token: int = Field(ge=1, le=1 << 24)
    prefill: PrefillSpec
    decode: DecodeSpec
    link: LinkSpec
    workload: WorkloadSpec
    # Seconds a worker needs to restart in the other role (weights loaded again, engine warmed
    # up): the warm-up of a run-time P/D re-split (docs/design.md §4).
    role_switch_s: float = Field(gt=0, le=3600)
    # Seconds a worker needs to change role *without* a restart, where its engine serves both
    # roles (vLLM's NIXL connector with ``kv_role: kv_both``): leaving one pool's routers and
    # joining the other's. None: the engine must restart. The profile says why next to it.
    kv_both_switch_s: float | None = Field(default=None, gt=0, le=3600)
    # The topology `disaggctl sim run` uses when none is given: the study's for this profile.
    default_topology: str
    # The model's context in tokens (its config's max_position_embeddings): the longest prompt
    # plus output the served model takes; `disaggctl serve` serves this context.
    context_tokens: int = Field(ge=256, le=1 << 20)
    source: str = ""
    architecture: ArchitectureSpec | None = None
    memory: MemorySpec | None = None
    # Lax only for the container: a YAML list and a dataclass's tuple are both fine here.
    calibration: list[CalibrationSpec] = Field(default_factory=list, strict=False)

    @field_validator("default_topology")
    @classmethod
    def _topology(cls, text: str) -> str:
        return normalise_topology(text)

    @field_validator("architecture")
    @classmethod
    def _matches_kv_bytes(
        cls, arch: ArchitectureSpec | None, info: ValidationInfo
    ) -> ArchitectureSpec | None:
        stated = info.data.get("kv_bytes_per_token")
        if arch is not None and stated is not None and arch.kv_bytes_per_token != stated:
            raise ValueError(
                f"2 x {arch.layers} layers x {arch.kv_heads} KV heads x {arch.head_dim} x "
                f"{arch.kv_dtype_bytes} bytes = {arch.kv_bytes_per_token} bytes per token, but "
                f"kv_bytes_per_token is {stated}"
            )
        return arch

    @field_validator("calibration")
    @classmethod
    def _derivable(
        cls, points: list[CalibrationSpec], info: ValidationInfo
    ) -> list[CalibrationSpec]:
        derived = any(p.metric == "kv_capacity_tokens" for p in points)
        if derived and (info.data.get("architecture") is None or info.data.get("memory") is None):
            raise ValueError("a kv_capacity_tokens point needs architecture and memory")
        return points
