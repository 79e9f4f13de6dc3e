"""Calibration: run a profile's published operating points and compare.

Each point is the study's setting: a closed loop at concurrency C (ramp, then hold) on a topology,
with the profile's template workload; figures come from the requests that finish during the hold.
The knee is where demand meets capacity, C* = X_max · E2E(C=1): below it the prefill queue is
mostly empty, above it every extra client waits in it (Little's law). A grid point "just above
the knee" is the first point past C*. A KV-capacity point is no run at all: the capacity is
derived from the model's shape and the GPU's memory (:func:`kv_capacity_tokens`) and compared
with the published figure (docs/design.md §6). The attention cost a profile states,
``prefill.e_s_per_token_pair``, is derived the same way from its architecture and its GPUs'
throughput (:func:`attention_s_per_token_pair`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from cluster.progress import progress_bar
from cluster.sim.cluster import SimCluster
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.profile import (
    MEASURED_METRICS,
    ArchitectureSpec,
    CalibrationPoint,
    HardwareProfile,
    MemorySpec,
    load_profile,
)
from cluster.sim.records import Summary, summarize
from cluster.sim.template_source import TemplateSource

GIB = 1 << 30

WARMUP_S = 10.0
HOLD_S = 40.0
# Tail latency near the knee swings ±20% between seeds (a few bursts decide a P99), so TTFT
# points take the median over these seeds; the other figures are stable on one.
TAIL_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class CheckResult:
    point: CalibrationPoint
    simulated: float
    ok: bool

    @property
    def published(self) -> str:
        v = self.point.value
        return f"[{v[0]:g}, {v[1]:g}]" if isinstance(v, tuple) else f"{v:g}"


def kv_capacity_tokens(arch: ArchitectureSpec, memory: MemorySpec, block_size: int = 1) -> int:
    """Tokens of KV cache one GPU holds once the weights and the reserves are placed:

        free   = gpu_memory · utilization − weight_params · weight_bytes_per_param
                 − activation − runtime                                   (bytes)
        per    = 2 · layers · kv_heads · head_dim · kv_dtype_bytes       (K and V, bytes/token)
        tokens = ⌊free / per / block_size⌋ · block_size                  (whole blocks; 0 if < 0)

    The engine sizes its cache this way (vLLM: gpu_memory_utilization × total − weights − the
    profiled activation peak − non-torch memory), so the result is independent of the profile's
    own ``kv_capacity_tokens``, which it is checked against (docs/design.md §6)."""
    free = (
        memory.gpu_memory_gib * memory.utilization * GIB
        - memory.weight_params * memory.weight_bytes_per_param
        - (memory.activation_gib + memory.runtime_gib) * GIB
    )
    if free <= 0:
        return 0
    return int(free // arch.kv_bytes_per_token // block_size) * block_size


def attention_s_per_token_pair(
    arch: ArchitectureSpec, gpus: int, peak_flops_per_gpu: float, mfu: float
) -> float:
    """Seconds of prefill attention per (query, key) token pair, a profile's
    ``prefill.e_s_per_token_pair``:

        e = 4 · layers · heads · head_dim / (gpus · peak_flops_per_gpu · mfu)

    (QKᵀ and AV per layer and query head, a multiply-add being 2 FLOPs), over the TP group's
    attention throughput. The profiles state e with this derivation (docs/design.md §6)."""
    if gpus < 1 or peak_flops_per_gpu <= 0 or not 0 < mfu <= 1:
        raise ValueError(
            f"need gpus >= 1, peak > 0, 0 < mfu <= 1 (got {gpus}, {peak_flops_per_gpu}, {mfu})"
        )
    return arch.attention_flops_per_pair / (gpus * peak_flops_per_gpu * mfu)


def closed_loop(
    profile: HardwareProfile,
    topology: str,
    concurrency: int,
    hold: float = HOLD_S,
    seed: int = 0,
) -> tuple[SimCluster, ClosedLoop]:
    """The study's setting, built and not yet run: a closed loop at ``concurrency`` on a fresh
    cluster with the profile's template workload, ramping over half the warm-up, then ``hold``."""
    cluster = SimCluster(profile, topology, seed=seed)
    w = profile.workload
    source = TemplateSource(
        w.templates, w.template_tokens, w.input_tokens, w.output_tokens, seed=seed + 1
    )
    load = ClosedLoop(
        cluster, source, [Phase(WARMUP_S, concurrency, ramp=WARMUP_S / 2), Phase(hold, concurrency)]
    )
    return cluster, load


def drive(
    cluster: SimCluster, until: float, *, progress: bool | None = None, quiet: bool = True
) -> None:
    """Run ``cluster`` to ``until``; a bar over simulated seconds is drawn only when asked
    (``progress``) or, with ``quiet`` false, on a terminal (cluster.progress)."""
    steps = math.ceil(until)
    bar = progress_bar(
        range(1, steps + 1), progress=progress, quiet=quiet, desc="simulated s", unit="s"
    )
    for second in bar:  # whole simulated seconds, so the bar moves; same events, same order
        cluster.loop.run(min(float(second), until))


def run_point(
    profile: HardwareProfile,
    topology: str,
    concurrency: int,
    hold: float = HOLD_S,
    seed: int = 0,
    *,
    progress: bool | None = None,
    quiet: bool = True,
) -> Summary:
    """Closed loop at ``concurrency`` (:func:`closed_loop`), measured over ``hold``."""
    cluster, load = closed_loop(profile, topology, concurrency, hold, seed)
    drive(cluster, load.end, progress=progress, quiet=quiet)
    return summarize(cluster.records, WARMUP_S, load.end)


@cache
def _cached_point(
    name: str, topology: str, concurrency: int, hold: float, seed: int = 0
) -> Summary:
    return run_point(load_profile(name), topology, concurrency, hold, seed)


def knee(profile: HardwareProfile, topology: str, hold: float = HOLD_S) -> float:
    """C* = X_max · E2E at C = 1, X_max measured deep in saturation (C = 512)."""
    calm = _cached_point(profile.name, topology, 1, hold)
    busy = _cached_point(profile.name, topology, 512, hold)
    e2e = calm.ttft_p50_s + (profile.workload.output_tokens - 1) * calm.itl_p50_s
    return busy.throughput_rps * e2e


def point_value(
    profile: HardwareProfile, topology: str, concurrency: int, metric: str, hold: float = HOLD_S
) -> float:
    """One figure of one operating point (the median over ``TAIL_SEEDS`` for TTFT)."""
    if metric not in MEASURED_METRICS:  # validated points never get here: a message, not a crash
        known = ", ".join(MEASURED_METRICS)
        raise ValueError(f"unknown calibration metric {metric!r}; measured ones: {known}")
    seeds = TAIL_SEEDS if metric.startswith("ttft") else (0,)
    values = [
        float(getattr(_cached_point(profile.name, topology, concurrency, hold, s), metric))
        for s in seeds
    ]
    return statistics.median(values)


def simulated_value(profile: HardwareProfile, point: CalibrationPoint, hold: float) -> float:
    if point.metric == "knee_concurrency":
        return knee(profile, point.topology, hold)
    if point.metric == "kv_capacity_tokens":
        if profile.architecture is None or profile.memory is None:
            raise ValueError(f"{profile.name}: kv_capacity_tokens needs architecture and memory")
        return float(kv_capacity_tokens(profile.architecture, profile.memory, profile.block_size))
    return point_value(profile, point.topology, point.concurrency, point.metric, hold)


def within(point: CalibrationPoint, simulated: float) -> bool:
    tol = point.tolerance
    if not math.isfinite(simulated):  # nothing measured is never a match
        return False
    if isinstance(point.value, tuple):
        low, high = point.value
        return low * (1 - tol) <= simulated <= high * (1 + tol)
    return abs(simulated - point.value) <= tol * abs(point.value)


def check(
    profile: HardwareProfile, points: Iterable[CalibrationPoint] | None = None, hold: float = HOLD_S
) -> list[CheckResult]:
    results = []
    for point in profile.calibration if points is None else points:
        value = simulated_value(profile, point, hold)
        results.append(CheckResult(point, value, within(point, value)))
    return results
