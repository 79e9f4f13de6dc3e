"""Request values for the auction's workloads (docs/design.md §8): 1 + Pareto(1.5), i.i.d.,
correlated within clusters (Gaussian copula, ρ), or one bidding cluster and zeros."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

PARETO_SHAPE = 1.5
VALUE_KINDS = ("iid", "correlated", "one-cluster")

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ValueModel:
    """How request values are drawn.

    - ``iid``: every value 1 + Pareto(1.5), independently.
    - ``correlated``: the same marginal law, with Gaussian-copula correlation ``rho`` between
      the values of one cluster (ρ = 0 is i.i.d., ρ = 1 one value per cluster).
    - ``one-cluster``: the largest cluster (the first on a tie) bids 1 + Pareto(1.5) i.i.d.,
      everyone else values priority at zero.

    ``rho`` belongs to ``correlated`` only; any other kind refuses a non-zero ρ, so a sweep over
    ρ cannot silently run i.i.d. values.
    """

    kind: str = "iid"
    rho: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in VALUE_KINDS:
            raise ValueError(f"value model must be iid, correlated or one-cluster: {self.kind!r}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must lie in [0, 1], got {self.rho}")
        if self.kind != "correlated" and self.rho != 0.0:
            raise ValueError(f"rho applies to the correlated value model, not {self.kind!r}")

    @property
    def label(self) -> str:
        """``iid``, ``correlated(rho=0.5)`` or ``one-cluster``: for reports."""
        return f"correlated(rho={self.rho:g})" if self.kind == "correlated" else self.kind

    def draw(self, rng: np.random.Generator, clusters: npt.NDArray[np.int64]) -> FloatArray:
        n = clusters.shape[0]
        if self.kind == "iid" or n == 0:
            return pareto_values(rng, n)
        if self.kind == "one-cluster":
            largest = int(np.argmax(np.bincount(clusters)))
            return np.where(clusters == largest, pareto_values(rng, n), 0.0)
        # Gaussian copula: z = √ρ·z_cluster + √(1−ρ)·ε keeps each marginal Pareto(1.5) exactly.
        shared = rng.standard_normal(int(clusters.max()) + 1)[clusters]
        z = np.sqrt(self.rho) * shared + np.sqrt(1.0 - self.rho) * rng.standard_normal(n)
        # P(V > v) = v^-1.5, so v = S^(-1/1.5) with S = 1 − Φ(z) = Φ(−z): computing Φ(−z)
        # directly keeps S > 0 where 1 − Φ(z) would round to 0 and give v = inf.
        survival = ndtr(-z)
        return np.asarray(survival ** (-1.0 / PARETO_SHAPE), dtype=np.float64)


def pareto_values(rng: np.random.Generator, size: int) -> npt.NDArray[np.float64]:
    """i.i.d. values 1 + Pareto(1.5) (numpy's ``pareto`` is the Lomax law, hence the 1 +)."""
    return 1.0 + rng.pareto(PARETO_SHAPE, size=size)
