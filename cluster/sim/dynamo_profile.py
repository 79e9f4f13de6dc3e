"""A hardware profile as the external timing model Dynamo's mocker reads (docs/design.md §8).

Dynamo's replay takes ``timing_model: {type: external, provider: dynamo_profile, config: {path:
FILE.npz}}``: lookup tables it interpolates (linearly in ISL, bilinearly in KV and context):

- ``prefill_isl`` (T) and ``prefill_ttft_ms``: the time of a prefill pass of T new tokens;
- ``decode_active_kv_tokens`` (kv), ``decode_context_length`` (ctx = kv / batch) and
  ``decode_itl[kv, ctx]``: the time of a decode step.

From one of our profiles: a pass of T new tokens is one request's chunk with nothing before it,
``PrefillModel.iteration_s([(T, 0)])`` (a + b·T + e·T²/2 + c_r + f·T²), and a step is
``DecodeModel.step_s(kv / ctx, kv)``. What the tables cannot carry, Dynamo's model lacks, and
the cross-check names it where the two disagree: our prefill charges each request of a batched
pass its own per-request cost and its attention to its context (cached prefix and earlier
chunks), Dynamo's charges the pass's total tokens once; our iterations jitter, Dynamo's do not;
and our KV crosses a link.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from cluster.sim.profile import HardwareProfile

__all__ = ["GRID", "dynamo_profile_arrays", "write_dynamo_profile"]

# Points per axis. Context is spaced geometrically: a step's batch is kv / context, which linear
# interpolation on an even grid misreads at small contexts (a lone 1,000-token sequence read as
# half a batch of 1,000); in steps of 1.1× the error stays under 0.3% (tested).
GRID = 129


def dynamo_profile_arrays(
    profile: HardwareProfile, grid: int = GRID
) -> dict[str, npt.NDArray[np.float64]]:
    """The five arrays of the external profile (module docstring), times in milliseconds."""
    if grid < 2:
        raise ValueError(f"grid must be >= 2 points, got {grid}")
    p, d = profile.prefill, profile.decode
    isl = np.linspace(1.0, float(p.max_batch_tokens), grid)
    ttft = np.array([1000.0 * p.iteration_s([(round(t), 0)]) for t in isl])
    kv = np.linspace(0.0, float(d.kv_capacity_tokens), grid)
    context = np.geomspace(1.0, float(profile.context_tokens), grid)
    itl = np.array(
        [[1000.0 * d.step_s(max(1, round(k / c)), round(k)) for c in context] for k in kv]
    )
    return {
        "prefill_isl": isl,
        "prefill_ttft_ms": ttft,
        "decode_active_kv_tokens": kv,
        "decode_context_length": context,
        "decode_itl": itl,
    }


def write_dynamo_profile(profile: HardwareProfile, path: str | Path, grid: int = GRID) -> Path:
    """Write the external profile of ``profile`` to ``path`` (``.npz``); returns the path."""
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"the profile goes to an .npz file, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **dynamo_profile_arrays(profile, grid))  # type: ignore[arg-type]
    return path
