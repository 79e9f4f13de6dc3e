"""The routing cost and the τ-softmax selection (docs/design.md §2), as in Dynamo's KV router.

For request r (|r| prompt tokens, block size B) and worker w:

- uncached prompt tokens   ``u(r, w) = |r| - overlap(r, w)·B``
- prefill_blocks(r, w)     ``= (active prefill tokens on w + u(r, w)) / B``
- decode_blocks(w)         ``= active KV (decode) blocks on w``
- cost(w)                  ``= omega·prefill_blocks(r, w) + decode_blocks(w)``

omega is Dynamo's ``overlap_score_weight``. Selection with temperature tau:

- tau = 0: the lowest cost. Ties go to the worker caching fewest blocks (Dynamo's tree-size
  tie-break), then to the lowest worker id (where Dynamo draws at random).
- tau > 0: sample w with probability ∝ ``exp(-(cost(w) - c_min) / ((c_max - c_min)·tau))``,
  i.e. a softmax of the costs min-max normalised to [0, 1] and divided by tau, exactly as
  Dynamo's ``softmax_sample``; all costs equal → uniform. Dynamo then walks the cumulative sum
  with one uniform draw u and takes the first worker whose cumulative probability passes u.

Dynamo's own decode term is ``active blocks + the request's blocks not already active on w``;
the request's blocks add the same amount to every worker unless in-flight requests share
prefixes, and both the argmin and the min-max-normalised softmax ignore a common shift.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CandidateCost:
    """One worker's line of a decision's breakdown (what the PoA estimator reads)."""

    worker: int
    overlap_blocks: int
    uncached_tokens: int
    prefill_blocks: float
    decode_blocks: int
    cost: float
    probability: float


def check_tau_omega(tau: float, omega: float) -> None:
    """ValueError unless tau and omega are finite and non-negative."""
    for name, value in (("tau", tau), ("omega", omega)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def uncached_tokens(prompt_tokens: int, overlap_blocks: int, block_size: int) -> int:
    """u(r, w) = |r| - overlap(r, w)·B."""
    return prompt_tokens - overlap_blocks * block_size


def prefill_blocks(active_prefill_tokens: int, uncached: int, block_size: int) -> float:
    """prefill_blocks(r, w) = (active prefill tokens on w + u(r, w)) / B."""
    return (active_prefill_tokens + uncached) / block_size


def routing_costs(
    prompt_tokens: int,
    overlap_blocks: Sequence[int],
    active_prefill_tokens: Sequence[int],
    active_decode_blocks: Sequence[int],
    omega: float,
    block_size: int,
) -> list[float]:
    """cost(w) = omega·prefill_blocks(r, w) + decode_blocks(w) for every candidate w.

    The two functions above, fused into one pass because this runs once per decision.
    """
    n, b = prompt_tokens, block_size
    return [
        omega * ((a + (n - o * b)) / b) + d
        for o, a, d in zip(overlap_blocks, active_prefill_tokens, active_decode_blocks, strict=True)
    ]


def softmax_probabilities(costs: Sequence[float], tau: float) -> list[float]:
    """Selection probabilities for tau > 0 (min-max normalised costs, as Dynamo)."""
    if tau <= 0:
        raise ValueError(f"softmax needs tau > 0, got {tau!r}")
    lo, hi = min(costs), max(costs)
    if hi == lo:
        return [1.0 / len(costs)] * len(costs)
    scale = 1.0 / ((hi - lo) * tau)
    weights = [math.exp((lo - c) * scale) for c in costs]
    total = sum(weights)
    return [w / total for w in weights]


def sample_index(probabilities: Sequence[float], u: float) -> int:
    """The first index whose cumulative probability exceeds the uniform draw u in [0, 1).

    (Dynamo tests ``u <= cumulative``; the strict test differs only when u lands exactly on a
    cumulative sum, and never picks a candidate whose probability underflowed to 0.)
    """
    cumulative = 0.0
    for i, p in enumerate(probabilities):
        cumulative += p
        if u < cumulative:
            return i
    # Rounding left the total just below u: take the last candidate that has any mass.
    return max(i for i, p in enumerate(probabilities) if p > 0)


def lowest_cost_index(costs: Sequence[float], tie_key: Callable[[int], tuple[int, int]]) -> int:
    """argmin of ``costs``; among equal costs, the smallest ``tie_key(index)``."""
    lo = min(costs)
    if costs.count(lo) == 1:
        return costs.index(lo)
    return min((i for i, c in enumerate(costs) if c == lo), key=tie_key)
