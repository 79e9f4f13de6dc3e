"""Dynamo's own offline replay as an independent simulator (docs/design.md §8, "The simulator
checked against Dynamo's").

``dynamo.replay.run_trace_replay`` (ai-dynamo 1.6.1) runs Dynamo's mocker engines and its real KV
router in one process, in virtual time. :func:`dynamo_replay` runs a Mooncake trace through it
on a disaggregated topology with one router arm, and returns the figures our own replay reports
(``cluster.sim.replay.ReplayRun.summary``), under the same names:

- ``kv_router`` at (τ, ω): ``KvRouterConfig(router_temperature=τ, prefill_load_scale=ω)``
  (1.6's name for the overlap weight; ``overlap_score_weight`` is its deprecated alias), on
  both pools; ``round_robin``: Dynamo's baseline router mode;
- the engines of one of our hardware profiles (:func:`engines_of`): its KV block, its caches'
  capacities and its batch limits, timed by the mocker's own default polynomial for the
  ``dynamo-mocker`` profile and by the profile's external tables (``cluster.sim.dynamo_profile``,
  written to a temporary ``.npz``) for any other;
- arrivals compressed by ``speedup`` (Dynamo's ``arrival_speedup_ratio``).

Dynamo is optional: nothing is imported from it until a replay runs (``require_dynamo``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cluster.backends.dynamo.install import require_dynamo
from cluster.sim.dynamo_profile import write_dynamo_profile
from cluster.sim.pools import Topology
from cluster.sim.profile import HardwareProfile

__all__ = ["NATIVE_PROFILE", "DynamoArm", "dynamo_replay", "engines_of"]

Mode = Literal["kv_router", "round_robin"]
NATIVE_PROFILE = "dynamo-mocker"  # our profile of the mocker's own default timing


@dataclass(frozen=True)
class DynamoArm:
    """One of Dynamo's routers: ``kv_router`` at (``tau``, ``omega``) or ``round_robin``."""

    mode: Mode
    tau: float = 0.0
    omega: float = 1.0

    @property
    def name(self) -> str:
        return "round-robin" if self.mode == "round_robin" else f"kv:{self.tau:g},{self.omega:g}"


# Any below: the JSON that Dynamo's replay takes and answers (its Python API is untyped).
def engines_of(profile: HardwareProfile, folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The prefill and decode engine settings of Dynamo's replay that run ``profile``'s engines:
    its block size, each pool's cache (blocks) and batch limits, and its timing (the mocker's
    default for ``NATIVE_PROFILE``, else the profile's tables written into ``folder``)."""
    p, d = profile.prefill, profile.decode
    common: dict[str, Any] = {"block_size": profile.block_size}
    if profile.name != NATIVE_PROFILE:
        npz = write_dynamo_profile(profile, folder / f"{profile.name}.npz")
        common["timing_model"] = {
            "type": "external", "provider": "dynamo_profile", "config": {"path": str(npz)},
        }  # fmt: skip
    prefill = {
        **common, "worker_type": "prefill",
        "num_gpu_blocks": p.kv_capacity_tokens // profile.block_size,
        "max_num_seqs": p.max_batch_requests, "max_num_batched_tokens": p.max_batch_tokens,
    }  # fmt: skip
    decode = {
        **common, "worker_type": "decode",
        "num_gpu_blocks": d.kv_capacity_tokens // profile.block_size, "max_num_seqs": d.max_batch,
    }  # fmt: skip
    return prefill, decode


def _percentile(summary: dict[str, Any], q: str, key: str) -> float:
    value = summary.get(f"{q}_{key}")
    return math.nan if value is None else float(value) / 1000.0


def dynamo_replay(
    trace: str | Path,
    topology: str,
    arm: DynamoArm,
    profile: HardwareProfile,
    *,
    speedup: float = 1.0,
    requests_out: str | Path | None = None,
) -> dict[str, Any]:
    """Replay the Mooncake trace ``trace`` (every line) through Dynamo (module docstring); the
    summary's times in seconds. ``requests_out``: where Dynamo writes one JSON line per request
    (arrival, first token, workers, reused tokens)."""
    require_dynamo()
    os.environ.setdefault("DYN_LOG", "warn")  # else one log line per routing decision
    from dynamo._core import KvRouterConfig
    from dynamo.replay import run_trace_replay

    pools = Topology.parse(topology)
    if pools.prefill < 1:
        raise ValueError(f"Dynamo's disaggregated replay needs a prefill worker, got {topology}")
    router = None
    if arm.mode == "kv_router":
        router = KvRouterConfig(router_temperature=arm.tau, prefill_load_scale=arm.omega)
    with tempfile.TemporaryDirectory(prefix="dynamo-replay-") as tmp:
        prefill, decode = engines_of(profile, Path(tmp))
        report = Path(requests_out) if requests_out else Path(tmp) / "requests.jsonl"
        result = run_trace_replay(
            str(trace),
            prefill_engine_args={"engine": prefill},
            decode_engine_args={"engine": decode},
            num_prefill_workers=pools.prefill,
            num_decode_workers=pools.decode,
            router_mode=arm.mode,
            router_config=router,
            trace_format="mooncake",
            trace_block_size=512,
            arrival_speedup_ratio=speedup,
            report_jsonl_path=str(report),
        )
        rows = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    s = dict(result.summary)
    done = [r for r in rows if r.get("terminal_status") == "completed"]
    end = max((float(r["terminal_time_ms"]) for r in done), default=0.0) / 1000.0
    return {
        "requests": len(rows),
        "completed": len(done),
        "ttft_p50_s": _percentile(s, "median", "ttft_ms"),
        "ttft_p99_s": _percentile(s, "p99", "ttft_ms"),
        "itl_p50_s": _percentile(s, "median", "itl_ms"),
        "throughput_rps": len(done) / end if end > 0 else math.nan,
        "prefix_reuse": float(s.get("prefix_cache_reused_ratio") or 0.0),
        "virtual_s": end,
        "wall_s": float(s.get("wall_time_ms") or 0.0) / 1000.0,
    }
