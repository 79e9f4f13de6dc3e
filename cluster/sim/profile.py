"""Hardware profiles (docs/design.md §6): typed, validated, loaded from ``profiles/*.yaml``.

A profile holds the cost models of one model on one kind of GPU (prefill iteration a + b·tokens +
e·attention pairs + c·requests, decode iteration d0 + d1·batch + d2·KV tokens, KV memory and
link), the topology `disaggctl sim run` defaults to, the workload the published figures were
measured on, and those figures with the tolerance the calibration test holds the simulator to.
Optionally it states the model's attention shape (``architecture``) and the GPU memory budget
(``memory``) its KV capacity is derived from.

Every shape is checked by one pydantic model (``*Spec``, in :mod:`cluster.sim.profile_specs`;
strict, finite, closed: see :mod:`cluster.models`); the simulator reads the frozen dataclasses
built from them, which run the same check when built by hand, so no path makes a profile with
NaN, a negative cost or a range the wrong way round. Errors name the file (or ``where``) and the
field's dotted path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from cluster.models import ConfigError, StrictModel, load_yaml_model
from cluster.sim.profile_specs import (
    DERIVED_METRICS,
    MAX_CONCURRENCY,
    MAX_DECODE_WORKERS,
    MAX_PREFILL_WORKERS,
    MEASURED_METRICS,
    ArchitectureSpec,
    CalibrationSpec,
    DecodeSpec,
    LinkSpec,
    MemorySpec,
    PrefillSpec,
    ProfileSpec,
    WorkloadSpec,
    normalise_topology,
)

__all__ = [
    "DERIVED_METRICS",
    "MAX_CONCURRENCY",
    "MAX_DECODE_WORKERS",
    "MAX_PREFILL_WORKERS",
    "MEASURED_METRICS",
    "PROFILE_DIR",
    "ArchitectureSpec",
    "CalibrationPoint",
    "CalibrationSpec",
    "DecodeModel",
    "DecodeSpec",
    "HardwareProfile",
    "LinkModel",
    "LinkSpec",
    "MemorySpec",
    "PrefillModel",
    "PrefillSpec",
    "ProfileSpec",
    "WorkloadShape",
    "WorkloadSpec",
    "attention_pairs",
    "available_profiles",
    "load_profile",
    "normalise_topology",
    "parse_profile",
]

PROFILE_DIR = Path(__file__).with_name("profiles")


# ---- the records the simulator reads -----------------------------------------------------------


class _Checked:
    """Frozen dataclasses that run their ``_spec`` over themselves when built (by hand or load)."""

    _spec: ClassVar[type[StrictModel]]

    def __post_init__(self) -> None:
        try:
            self._spec.model_validate(dataclasses.asdict(self))  # type: ignore[call-overload]
        except ValidationError as exc:
            raise ConfigError(_describe(exc, type(self).__name__)) from None


def attention_pairs(new: int, before: int) -> float:
    """k·(c + k/2): the (query, key) pairs of a chunk of k new tokens after c already computed
    (cached or from earlier chunks); causal, so the chunk's own tokens see half of it on average."""
    return new * (before + new / 2)


@dataclass(frozen=True)
class PrefillModel(_Checked):
    """Chunked prefill. An iteration over chunks (kᵢ new tokens after cᵢ computed ones, one per
    request, K = Σᵢ kᵢ) takes ``iteration_s`` · ε seconds,

        a + Σᵢ (b·kᵢ + e·kᵢ·(cᵢ + kᵢ/2) + c_r) + f·K²,

    (a, b, e, c_r, f: ``a_s``, ``b_s_per_token``, ``e_s_per_token_pair``, ``c_s_per_request``,
    ``f_s_per_iteration_token_sq``), ε lognormal with mean 1 and coefficient of variation
    ``jitter``; at most ``max_batch_tokens`` / ``max_batch_requests`` per iteration. The e term
    is attention (superlinear in context); b covers the weights' matmuls, linear in tokens; f is
    a quadratic fitted on the iteration's total, Dynamo's mocker's form (0 in the B200
    profiles, which state attention instead)."""

    _spec = PrefillSpec
    a_s: float
    b_s_per_token: float
    c_s_per_request: float
    jitter: float
    max_batch_tokens: int
    max_batch_requests: int
    kv_capacity_tokens: int
    e_s_per_token_pair: float = 0.0  # hand-built records: no attention term unless given
    f_s_per_iteration_token_sq: float = 0.0

    def iteration_s(self, chunks: Iterable[tuple[int, int]]) -> float:
        """The iteration's cost before jitter; ``chunks``: (kᵢ new, cᵢ before) per request."""
        tokens = pairs = requests = 0.0
        for new, before in chunks:
            tokens += new
            pairs += attention_pairs(new, before)
            requests += 1
        return (
            self.a_s
            + self.b_s_per_token * tokens
            + self.e_s_per_token_pair * pairs
            + self.c_s_per_request * requests
            + self.f_s_per_iteration_token_sq * tokens * tokens
        )


@dataclass(frozen=True)
class DecodeModel(_Checked):
    """Continuous batching: an iteration over ``batch`` sequences holding ``kv`` tokens takes
    (d0 + d1·batch + d2·kv + d3·kv²)·ε seconds, ε lognormal with mean 1 and coefficient of
    variation ``jitter`` (d3, ``d3_s_per_kv_token_sq``: 0 in the B200 profiles; Dynamo's
    mocker's step is a quadratic in the KV held). A prompt with at most
    ``local_prefill_max_tokens`` uncached tokens is prefilled in the decode iteration
    (``local_prefill_s_per_token`` each) instead of remotely."""

    _spec = DecodeSpec
    d0_s: float
    d1_s_per_seq: float
    d2_s_per_kv_token: float
    jitter: float
    max_batch: int
    kv_capacity_tokens: int
    local_prefill_max_tokens: int
    local_prefill_s_per_token: float
    d3_s_per_kv_token_sq: float = 0.0

    def step_s(self, batch: int, kv_tokens: int) -> float:
        """An iteration's cost before jitter and local prefill."""
        return (
            self.d0_s
            + self.d1_s_per_seq * batch
            + self.d2_s_per_kv_token * kv_tokens
            + self.d3_s_per_kv_token_sq * kv_tokens * kv_tokens
        )


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
    default_topology: str  # `disaggctl sim run` without --topology
    context_tokens: int  # the model's context: the longest prompt + output it serves
    source: str = ""
    kv_both_switch_s: float | None = None  # a role change with no restart (``with_kv_both``)
    calibration: tuple[CalibrationPoint, ...] = field(default_factory=tuple)
    architecture: ArchitectureSpec | None = None  # frozen models already: no dataclass twin
    memory: MemorySpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "calibration", tuple(self.calibration))
        super().__post_init__()

    def with_kv_both(self) -> HardwareProfile:
        """This profile served by engines that take both roles without a restart (vLLM's NIXL
        connector, ``kv_role: kv_both``): a re-split's switch is ``kv_both_switch_s``, not the
        restart's ``role_switch_s``; named ``<name>+kv_both``. The simulated engine still starts
        its new role with an empty cache (a kv_both engine keeps its blocks: conservative).
        ``ValueError`` when the profile declares no such switch."""
        if self.kv_both_switch_s is None:
            raise ValueError(f"profile {self.name!r} declares no kv_both_switch_s")
        return dataclasses.replace(
            self, name=f"{self.name}+kv_both", role_switch_s=self.kv_both_switch_s
        )

    @property
    def workers_per_node(self) -> int:
        return max(1, self.gpus_per_node // self.tp)

    def kv_index_bound(self, block_size: int) -> int:
        """The most blocks a router's index keeps for one worker: twice its engine's KV cache
        (no engine holds more; a block may be re-stored under a second hash), so a publisher
        inventing blocks cannot grow the index past it (``router.KvIndex``)."""
        capacity = max(self.prefill.kv_capacity_tokens, self.decode.kv_capacity_tokens)
        return 2 * max(1, capacity // block_size)

    @classmethod
    def from_spec(cls, spec: ProfileSpec) -> HardwareProfile:
        """The records of a validated spec (each checks itself again: cheap, once per load)."""
        # Any: the spec's fields, each its own type; shallow: nested specs are still models here
        values: dict[str, Any] = dict(spec)
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


def parse_profile(raw: object, where: str = "profile") -> HardwareProfile:
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
