"""Hardware profiles: typed, validated, loaded from the data files in ``profiles/``.

A profile holds the cost models of one model on one kind of GPU (prefill iteration a + b·tokens +
c·requests, decode iteration d0 + d1·batch + d2·KV tokens, KV memory and link), the workload the
published figures were measured on, and those figures with the tolerance the calibration test
holds the simulator to. Bad values fail at load time with the field's dotted name.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

PROFILE_DIR = Path(__file__).with_name("profiles")


@dataclass(frozen=True)
class PrefillModel:
    """Chunked prefill: an iteration over ``tokens`` new tokens of ``requests`` requests takes
    (a + b·tokens + c·requests)·ε seconds, ε lognormal with mean 1 and coefficient of variation
    ``jitter``; at most ``max_batch_tokens`` / ``max_batch_requests`` per iteration."""

    a_s: float
    b_s_per_token: float
    c_s_per_request: float
    jitter: float
    max_batch_tokens: int
    max_batch_requests: int
    kv_capacity_tokens: int


@dataclass(frozen=True)
class DecodeModel:
    """Continuous batching: an iteration over ``batch`` sequences holding ``kv`` tokens takes
    (d0 + d1·batch + d2·kv)·ε seconds, ε lognormal with mean 1 and coefficient of variation
    ``jitter``. A prompt with at most ``local_prefill_max_tokens`` uncached tokens is prefilled
    in the decode iteration (``local_prefill_s_per_token`` each) instead of remotely."""

    d0_s: float
    d1_s_per_seq: float
    d2_s_per_kv_token: float
    jitter: float
    max_batch: int
    kv_capacity_tokens: int
    local_prefill_max_tokens: int
    local_prefill_s_per_token: float


@dataclass(frozen=True)
class LinkModel:
    """KV transfer from prefill to decode: latency + bytes / bandwidth."""

    bandwidth_gbps: float
    latency_s: float


@dataclass(frozen=True)
class WorkloadShape:
    """The workload the published figures were measured with."""

    templates: int
    template_tokens: int
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class CalibrationPoint:
    """One published figure: ``metric`` of ``topology`` at concurrency C, ± ``tolerance``.

    ``value`` is a number or a [low, high] range the simulated figure must fall in (widened by
    the tolerance)."""

    topology: str
    metric: str
    concurrency: int
    value: float | list[float]
    tolerance: float = 0.15
    reproduced: bool = True  # False: the figure is recorded but the model cannot meet it (note)
    note: str = ""


@dataclass(frozen=True)
class HardwareProfile:
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
    source: str = ""
    calibration: list[CalibrationPoint] = field(default_factory=list)

    @property
    def workers_per_node(self) -> int:
        return max(1, self.gpus_per_node // self.tp)


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a profile by name (a file in ``profiles/``) or path; ``ValueError`` names bad fields."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(available_profiles())
            raise ValueError(f"unknown hardware profile {name_or_path!r}; known: {known}")
    raw = yaml.safe_load(path.read_text())
    return parse_profile(raw, where=path.stem)


def parse_profile(raw: Any, where: str = "profile") -> HardwareProfile:
    profile = _build(HardwareProfile, raw, where)
    _check_ranges(profile, where)
    return profile


def _build(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    hints = get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for name, spec in names.items():
        dotted = f"{where}.{name}"
        if name not in raw:
            no_default = (
                spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
            )
            if no_default:
                raise ValueError(f"{dotted}: missing field")
            continue
        values[name] = _convert(hints[name], raw[name], dotted)
    return cls(**values)


def _convert(kind: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(kind):
        return _build(kind, value, where)  # type: ignore[arg-type]
    origin = get_origin(kind)
    if origin is list:
        (item,) = get_args(kind)
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (Union, types.UnionType):
        errors = []
        for option in get_args(kind):
            try:
                return _convert(option, value, where)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[-1])
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported field type {kind!r}")


def _check_ranges(profile: HardwareProfile, where: str) -> None:
    positive = {
        "tp": profile.tp,
        "gpus_per_node": profile.gpus_per_node,
        "block_size": profile.block_size,
        "kv_bytes_per_token": profile.kv_bytes_per_token,
        "prefill.max_batch_tokens": profile.prefill.max_batch_tokens,
        "prefill.max_batch_requests": profile.prefill.max_batch_requests,
        "prefill.kv_capacity_tokens": profile.prefill.kv_capacity_tokens,
        "decode.max_batch": profile.decode.max_batch,
        "decode.kv_capacity_tokens": profile.decode.kv_capacity_tokens,
        "link.bandwidth_gbps": profile.link.bandwidth_gbps,
        "workload.templates": profile.workload.templates,
        "workload.input_tokens": profile.workload.input_tokens,
        "workload.output_tokens": profile.workload.output_tokens,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ValueError(f"{where}.{name}: must be > 0, got {value}")
    non_negative = {
        "prefill.a_s": profile.prefill.a_s,
        "prefill.b_s_per_token": profile.prefill.b_s_per_token,
        "prefill.c_s_per_request": profile.prefill.c_s_per_request,
        "prefill.jitter": profile.prefill.jitter,
        "decode.d0_s": profile.decode.d0_s,
        "decode.d1_s_per_seq": profile.decode.d1_s_per_seq,
        "decode.d2_s_per_kv_token": profile.decode.d2_s_per_kv_token,
        "decode.jitter": profile.decode.jitter,
        "decode.local_prefill_max_tokens": profile.decode.local_prefill_max_tokens,
        "decode.local_prefill_s_per_token": profile.decode.local_prefill_s_per_token,
        "link.latency_s": profile.link.latency_s,
        "workload.template_tokens": profile.workload.template_tokens,
    }
    for name, value in non_negative.items():
        if value < 0:
            raise ValueError(f"{where}.{name}: must be >= 0, got {value}")
    if profile.workload.template_tokens > profile.workload.input_tokens:
        raise ValueError(f"{where}.workload.template_tokens: exceeds input_tokens")
