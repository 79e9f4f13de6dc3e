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

Ranges (``check_tau_omega``, ``policy_value``): tau and omega are real numbers (a bool is not),
finite and ≥ 0, and omega ≤ ``MAX_OMEGA``; anything else is a ``ValueError`` naming the field.
tau needs no upper bound: the softmax divides costs already normalised to [0, 1] by tau, so a
huge tau only tends to uniform and a tiny one to the argmin, never to inf − inf.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

MAX_OMEGA: Final = 1e6
"""Largest overlap weight omega accepted.

Why 1e6: Dynamo's ``overlap_score_weight`` is of order 1 (the policy table uses 0.1 and 1.0). At
1e6 one prefill block already outweighs a million active decode blocks, so the decode term no
longer decides anything and larger weights cannot route differently; below it
omega·prefill_blocks stays finite for any prompt and load a worker can hold, where an omega
near 1e308 made costs inf and the softmax's min-max normalisation NaN (inf − inf).
"""


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


def policy_value(field: str, value: object, key: str | None = None) -> float:
    """``value`` of the policy field ``field`` ("tau" or "omega") as a float, or ``ValueError``.

    ``key`` is the name the caller used (an override's ``router_temperature``, say), so the
    message names what the caller wrote. Accepts any real number but a bool (``True`` is not
    1.0 here: a flag passed for a weight is a mistake, not a value)."""
    name = field if key is None or key == field else f"{key} ({field})"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        x = float(value)
    except OverflowError:  # an int past float64's range
        raise ValueError(f"{name} must be finite, got {value!r}") from None
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    if field == "omega" and x > MAX_OMEGA:
        raise ValueError(f"{name} must be <= MAX_OMEGA = {MAX_OMEGA:g}, got {value!r}")
    return x


def check_tau_omega(tau: float, omega: float) -> None:
    """ValueError unless tau and omega are real, finite and in range (module docstring)."""
    policy_value("tau", tau)
    policy_value("omega", omega)


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
    """Selection probabilities for tau > 0 (min-max normalised costs, as Dynamo).

    Each cost is normalised to z = (c − lo)/(hi − lo) ∈ [0, 1] before it is divided by tau, so
    z/tau is never NaN: it is 0 for the cheapest worker (weight 1) and at worst +inf (weight 0)
    for the others, however small tau is. (Dividing by (hi − lo)·tau first overflowed to inf for
    a tiny tau, and 0·inf made the cheapest worker's weight NaN.)"""
    # Fast path for the router's own (already validated) float; anything else is checked fully.
    t = tau if type(tau) is float and 0.0 < tau < math.inf else policy_value("tau", tau)
    if t == 0:
        raise ValueError(f"softmax needs tau > 0, got {tau!r}")
    if not costs:
        raise ValueError("softmax needs at least one cost")
    try:  # one C pass: a NaN or inf cost makes the sum non-finite
        finite = math.isfinite(sum(costs))
    except (OverflowError, TypeError):  # an int past float64, or not a number at all
        finite = False
    if not finite:
        raise ValueError(f"costs must be finite numbers, got {list(costs)!r}")
    lo, hi = min(costs), max(costs)
    if hi == lo:
        return [1.0 / len(costs)] * len(costs)
    span = hi - lo
    if not math.isfinite(span):
        raise ValueError(f"costs span more than float64 can hold: {lo!r} .. {hi!r}")
    weights = [math.exp(-((c - lo) / span) / t) for c in costs]
    total = sum(weights)  # ≥ 1: the cheapest worker's weight is exp(0)
    return [w / total for w in weights]


def sample_index(probabilities: Sequence[float], u: float) -> int:
    """The first index whose cumulative probability exceeds the uniform draw u in [0, 1).

    (Dynamo tests ``u <= cumulative``; the strict test differs only when u lands exactly on a
    cumulative sum, and never picks a candidate whose probability underflowed to 0.)
    """
    if not 0.0 <= u < 1.0:  # also refuses NaN, which no comparison would ever pick
        raise ValueError(f"u must be a uniform draw in [0, 1), got {u!r}")
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
