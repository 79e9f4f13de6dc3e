"""Hardware profiles (docs/design.md §6): typed, validated, loaded from ``profiles/*.yaml``.

A profile holds the cost models of one model on one kind of GPU (prefill iteration a + b·tokens +
c·requests, decode iteration d0 + d1·batch + d2·KV tokens, KV memory and link), the workload the
published figures were measured on, and those figures with the tolerance the calibration test
holds the simulator to. Optionally it states the model's attention shape (``architecture``) and
the GPU memory budget (``memory``) its KV capacity is derived from.

Every shape is checked by one pydantic model (``*Spec``, strict, finite, closed: see
:mod:`cluster.models`); the simulator reads the frozen dataclasses built from them, which run the
same check when built by hand, so no path makes a profile with NaN, a negative cost or a range
the wrong way round. Errors name the file (or ``where``) and the field's dotted path.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cluster.models import ConfigError, StrictModel, load_yaml_model

PROFILE_DIR = Path(__file__).with_name("profiles")

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
    jitter: float = Field(ge=0, le=1)
    max_batch: int = Field(ge=1, le=1 << 16)
    kv_capacity_tokens: int = Field(ge=1, le=10**9)
    local_prefill_max_tokens: int = Field(ge=0, le=10**7)
    local_prefill_s_per_token: float = Field(ge=0, le=1)


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
    """The attention shape that sets the KV bytes per token: 2 (K and V) × the four fields."""

    layers: int = Field(ge=1, le=1000)
    kv_heads: int = Field(ge=1, le=1024)
    head_dim: int = Field(ge=1, le=4096)
    kv_dtype_bytes: int = Field(ge=1, le=4)  # 1 FP8, 2 BF16, 4 FP32

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes


class MemorySpec(StrictModel):
    """One GPU's memory budget: what is left for KV after weights and reserves (GiB = 2**30 B)."""

    gpu_memory_gib: float = Field(gt=0, le=1024)
    utilization: float = Field(gt=0, le=1)
    weight_params: int = Field(ge=1, le=10**13)
    weight_bytes_per_param: float = Field(gt=0, le=4)
    activation_gib: float = Field(ge=0, le=1024)
    runtime_gib: float = Field(ge=0, le=1024)


def _value_kind(value: Any) -> str:
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
    def _list_is_range(cls, value: Any) -> Any:
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
    source: str = ""
    architecture: ArchitectureSpec | None = None
    memory: MemorySpec | None = None
    # Lax only for the container: a YAML list and a dataclass's tuple are both fine here.
    calibration: list[CalibrationSpec] = Field(default_factory=list, strict=False)

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
    def _derivable(cls, points: list[CalibrationSpec], info: ValidationInfo) -> Any:
        derived = any(p.metric == "kv_capacity_tokens" for p in points)
        if derived and (info.data.get("architecture") is None or info.data.get("memory") is None):
            raise ValueError("a kv_capacity_tokens point needs architecture and memory")
        return points


# ---- the records the simulator reads -----------------------------------------------------------


class _Checked:
    """Frozen dataclasses that run their ``_spec`` over themselves when built (by hand or load)."""

    _spec: ClassVar[type[StrictModel]]

    def __post_init__(self) -> None:
        try:
            self._spec.model_validate(dataclasses.asdict(self))  # type: ignore[call-overload]
        except ValidationError as exc:
            raise ConfigError(_describe(exc, type(self).__name__)) from None


@dataclass(frozen=True)
class PrefillModel(_Checked):
    """Chunked prefill: an iteration over ``tokens`` new tokens of ``requests`` requests takes
    (a + b·tokens + c·requests)·ε seconds, ε lognormal with mean 1 and coefficient of variation
    ``jitter``; at most ``max_batch_tokens`` / ``max_batch_requests`` per iteration."""

    _spec = PrefillSpec
    a_s: float
    b_s_per_token: float
    c_s_per_request: float
    jitter: float
    max_batch_tokens: int
    max_batch_requests: int
    kv_capacity_tokens: int


@dataclass(frozen=True)
class DecodeModel(_Checked):
    """Continuous batching: an iteration over ``batch`` sequences holding ``kv`` tokens takes
    (d0 + d1·batch + d2·kv)·ε seconds, ε lognormal with mean 1 and coefficient of variation
    ``jitter``. A prompt with at most ``local_prefill_max_tokens`` uncached tokens is prefilled
    in the decode iteration (``local_prefill_s_per_token`` each) instead of remotely."""

    _spec = DecodeSpec
    d0_s: float
    d1_s_per_seq: float
    d2_s_per_kv_token: float
    jitter: float
    max_batch: int
    kv_capacity_tokens: int
    local_prefill_max_tokens: int
    local_prefill_s_per_token: float


@dataclass(frozen=True)
class LinkModel(_Checked):
    """KV transfer from prefill to decode: latency + bytes / bandwidth."""

    _spec = LinkSpec
    bandwidth_gbps: float
    latency_s: float


@dataclass(frozen=True)
class WorkloadShape(_Checked):
    """The workload the published figures were measured with."""

    _spec = WorkloadSpec
    templates: int
    template_tokens: int
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class CalibrationPoint(_Checked):
    """One published figure: ``metric`` of ``topology`` at concurrency C, ± ``tolerance``.

    ``value`` is a number or a (low, high) range the simulated figure must fall in (widened by
    the tolerance). The topology is normalised ("1p/2d" → "1P/2D")."""

    _spec = CalibrationSpec
    topology: str
    metric: str
    concurrency: int
    value: float | tuple[float, float]
    tolerance: float = 0.15
    reproduced: bool = True  # False: the figure is recorded but the model cannot meet it (note)
    note: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.value, list):  # callers may pass a YAML-style list
            object.__setattr__(self, "value", tuple(self.value))  # type: ignore[unreachable]
        super().__post_init__()
        object.__setattr__(self, "topology", normalise_topology(self.topology))


@dataclass(frozen=True)
class HardwareProfile(_Checked):
    _spec = ProfileSpec
    name: str
    model: str
    gpu: str
    tp: int
    gpus_per_node: int
    block_size: int
    kv_bytes_per_token: int
    prefill: PrefillModel
    decode: DecodeModel
    link: LinkModel
    workload: WorkloadShape
    role_switch_s: float  # warm-up of a worker restarting in its other role (re-split)
    source: str = ""
    calibration: tuple[CalibrationPoint, ...] = field(default_factory=tuple)
    architecture: ArchitectureSpec | None = None  # frozen models already: no dataclass twin
    memory: MemorySpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "calibration", tuple(self.calibration))
        super().__post_init__()

    @property
    def workers_per_node(self) -> int:
        return max(1, self.gpus_per_node // self.tp)

    @classmethod
    def from_spec(cls, spec: ProfileSpec) -> HardwareProfile:
        """The records of a validated spec (each checks itself again: cheap, once per load)."""
        values: dict[str, Any] = dict(spec)  # shallow: nested specs are still models here
        records = {"prefill": PrefillModel, "decode": DecodeModel, "link": LinkModel}
        for name, record in {**records, "workload": WorkloadShape}.items():
            values[name] = record(**dict(values[name]))
        values["calibration"] = tuple(CalibrationPoint(**dict(p)) for p in spec.calibration)
        return cls(**values)


# ---- loading -----------------------------------------------------------------------------------


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a profile by name (a file in ``profiles/``) or path; :class:`ConfigError` (a
    ``ValueError``) names the file and every bad field."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(available_profiles())
            raise ValueError(f"unknown hardware profile {name_or_path!r}; known: {known}")
    return HardwareProfile.from_spec(load_yaml_model(ProfileSpec, path))


def parse_profile(raw: Any, where: str = "profile") -> HardwareProfile:
    """A profile from already-parsed data; errors read ``where.field.path: message``."""
    try:
        spec = ProfileSpec.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, where)) from None
    return HardwareProfile.from_spec(spec)


_BRIEF = {
    "missing": "missing field",
    "extra_forbidden": "unknown field",
    "finite_number": "must be a finite number",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
}


def _describe(exc: ValidationError, where: str) -> str:
    """One line per failed field: ``where.path: brief message (got value)``."""
    lines = []
    for err in exc.errors(include_url=False):
        path = "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}"
            for p in err["loc"]
            if p not in ("number", "range")  # the tags of the published-value union
        )
        template = _BRIEF.get(err["type"])
        message = template.format(**err.get("ctx", {})) if template else err["msg"]
        message = message.removeprefix("Value error, ")
        got = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.60})"
        lines.append(f"{where}{path}: {message}{got}")
    return "\n".join(lines)
