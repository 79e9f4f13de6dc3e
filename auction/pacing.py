"""The pacing autobidder of a budgeted user (docs/design.md §1, "Autobidder (pacing)").

A user with budget B = T·γ over T batches bids b_r = α·v_r on each of its requests, with
α = 1/(1+μ). After each batch it pays p_t and moves its dual variable by one step of dual
(sub)gradient descent (Balseiro–Lu–Mirrokni 2020):

    μ ← clip(μ + η·(p_t − γ), 0, μ_max),   η = eta_scale/(γ·√T) by default (eta_scale = 2).

Spending above the per-batch target γ raises μ (lower α), spending below lowers it. Dividing η by γ
makes the step unit-free (μ is a pure number, p_t − γ is money), so the default needs no retuning
when prices are rescaled; the 1/√T is what gives regret O(√T). The constant 2 had the lowest regret
at every T of a sweep over {0.5, 1, 2, 4} (``bench/autobidder.py --eta-scale``, its own seeds):
smaller steps leave α ≈ 1 for too long at the start, overspend and run dry before T.

Budget cap. A VCG payment never exceeds the user's reported value of the chosen schedule,
p_i ≤ V_i(σ*) = Σ_{r∈R_i} b_r·x_r ≤ Σ_{r∈R_i} b_r (σ* maximises the total, so V_i(σ*) + W_{−i}(σ*) ≥
max_σ W_{−i}(σ)). So the bidder scales its bids down until Σ_{r∈R_i} b_r ≤ remaining budget:
the effective multiplier in a batch is ``capped_alpha(α, Σ_r v_r, remaining)``, and no payment can
exceed what is left. Total spend ≤ B follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

DEFAULT_ETA_SCALE = 2.0
"""η = DEFAULT_ETA_SCALE/(γ·√T) unless the caller sets η or the scale."""

DEFAULT_MU_MAX = 100.0
"""Upper clip of μ: the lowest multiplier is α = 1/(1+μ_max) ≈ 0.01."""

ROUNDING = 1e-9
"""Relative slack for a payment over the remaining budget: VCG prices are differences of sums,
so a payment equal to the cap may come back a few ulps above it. Anything larger is an error."""


def alpha_of(mu: float) -> float:
    """α = 1/(1+μ), the bid multiplier for the dual variable μ ≥ 0."""
    return 1.0 / (1.0 + mu)


def capped_alpha(alpha: float, value_sum: float, remaining: float) -> float:
    """The largest multiplier ≤ α whose bids α·Σ_r v_r fit in the remaining budget.

    >>> capped_alpha(0.5, 10.0, 100.0), capped_alpha(0.5, 10.0, 2.0), capped_alpha(0.5, 0.0, 0.0)
    (0.5, 0.2, 0.5)
    """
    if alpha * value_sum <= remaining:
        return alpha
    return max(remaining, 0.0) / value_sum


def settle(payment: float, remaining: float, scale: float) -> float:
    """The amount actually taken for ``payment``: at most ``remaining``.

    A payment above the remaining budget by more than rounding (``ROUNDING·scale``) means the cap
    was not applied, and is an error rather than an overdraft.
    """
    if payment < 0 or math.isnan(payment):
        raise ValueError(f"payment must be >= 0, got {payment!r}")
    if payment > remaining + ROUNDING * max(scale, 1.0):
        raise ValueError(f"payment {payment!r} exceeds the remaining budget {remaining!r}")
    return min(payment, max(remaining, 0.0))


def default_eta(gamma: float, T: int, eta_scale: float = DEFAULT_ETA_SCALE) -> float:
    """η = eta_scale/(γ·√T): the step size ∝ 1/√T, in units of 1/money."""
    return eta_scale / (gamma * math.sqrt(T))


@dataclass(frozen=True)
class PacingStep:
    """What one batch did to a pacing bidder: the multiplier it bid with (after the budget cap),
    its payment, and μ before and after the update."""

    t: int
    alpha: float
    alpha_capped: float
    payment: float
    mu_before: float
    mu_after: float
    remaining: float


class PacingBidder:
    """Budget-paced bidding for one user: bids α·v, α = 1/(1+μ), μ updated after every batch.

    Deterministic: the state after t batches depends only on the payments it was told about.

    >>> bidder = PacingBidder(gamma=1.0, T=16)  # η = 2/(1·√16) = ½
    >>> bidder.budget, bidder.alpha
    (16.0, 1.0)
    >>> bidder.bids([2.0, 1.0]).tolist()
    [2.0, 1.0]
    >>> step = bidder.pay(3.0)  # overspent by 2: μ = 0 + ½·2 = 1
    >>> bidder.mu, bidder.alpha, bidder.remaining
    (1.0, 0.5, 13.0)
    >>> bidder.bids([20.0, 20.0]).tolist()  # ½·40 = 20 > 13 left: scaled to Σ b = 13
    [6.5, 6.5]
    """

    def __init__(
        self,
        gamma: float,
        T: int,
        *,
        eta: float | None = None,
        eta_scale: float = DEFAULT_ETA_SCALE,
        mu_max: float = DEFAULT_MU_MAX,
        mu0: float = 0.0,
    ) -> None:
        if isinstance(T, bool) or not isinstance(T, int | np.integer) or T < 1:
            raise ValueError(f"T must be an integer >= 1, got {T!r}")
        if not _finite(gamma) or gamma <= 0:
            raise ValueError(f"gamma (budget per batch) must be > 0, got {gamma!r}")
        if not _finite(mu_max) or mu_max < 0:
            raise ValueError(f"mu_max must be >= 0, got {mu_max!r}")
        if not _finite(mu0) or not 0 <= mu0 <= mu_max:
            raise ValueError(f"mu0 must lie in [0, mu_max={mu_max}], got {mu0!r}")
        if not _finite(eta_scale) or eta_scale < 0:
            raise ValueError(f"eta_scale must be >= 0, got {eta_scale!r}")
        if eta is not None and (not _finite(eta) or eta < 0):
            raise ValueError(f"eta must be >= 0, got {eta!r}")
        self.gamma = float(gamma)
        self.T = int(T)
        self.budget = self.T * self.gamma
        self.eta = default_eta(self.gamma, self.T, eta_scale) if eta is None else float(eta)
        self.mu_max = float(mu_max)
        self.mu = float(mu0)
        self.spent = 0.0
        self.t = 0
        self.alpha_bid = self.alpha  # α' of the latest ``bids`` call (after the budget cap)

    @classmethod
    def fixed(cls, alpha: float, gamma: float, T: int) -> PacingBidder:
        """A bidder that keeps α fixed (η = 0) and stops when the budget runs out: the comparator
        of the regret."""
        if not _finite(alpha) or not 0 < alpha <= 1:
            raise ValueError(f"alpha must lie in (0, 1], got {alpha!r}")
        mu = 1.0 / alpha - 1.0
        return cls(gamma, T, eta=0.0, mu_max=max(mu, 0.0), mu0=max(mu, 0.0))

    @property
    def alpha(self) -> float:
        """α = 1/(1+μ) before the budget cap."""
        return alpha_of(self.mu)

    @property
    def remaining(self) -> float:
        """B minus what has been paid (never negative)."""
        return max(self.budget - self.spent, 0.0)

    def bids(self, values: npt.ArrayLike) -> FloatArray:
        """b_r = α'·v_r on the user's requests in this batch; α' = ``capped_alpha``, so Σ b ≤ what
        is left of the budget."""
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 1:
            raise ValueError(f"values must be a flat array, got shape {v.shape}")
        if v.size and (not np.all(np.isfinite(v)) or float(v.min()) < 0):
            raise ValueError("values must be finite and >= 0")
        self.alpha_bid = capped_alpha(self.alpha, float(v.sum()), self.remaining)
        return self.alpha_bid * v

    def pay(self, payment: float) -> PacingStep:
        """Record the batch's payment p_t and take the step μ ← clip(μ + η(p_t − γ), 0, μ_max)."""
        taken = settle(float(payment), self.remaining, self.budget)
        mu_before = self.mu
        self.spent += taken
        self.mu = min(max(self.mu + self.eta * (taken - self.gamma), 0.0), self.mu_max)
        self.t += 1
        step = PacingStep(
            t=self.t - 1,
            alpha=alpha_of(mu_before),
            alpha_capped=self.alpha_bid,
            payment=taken,
            mu_before=mu_before,
            mu_after=self.mu,
            remaining=self.remaining,
        )
        self.alpha_bid = self.alpha
        return step

    def __repr__(self) -> str:
        return (
            f"PacingBidder(gamma={self.gamma!r}, T={self.T}, eta={self.eta:.4g}, "
            f"mu={self.mu:.4g}, spent={self.spent:.4g}/{self.budget:.4g}, t={self.t})"
        )


def _finite(x: object) -> bool:
    return (
        not isinstance(x, bool)
        and isinstance(x, int | float | np.integer | np.floating)
        and math.isfinite(float(x))
    )
