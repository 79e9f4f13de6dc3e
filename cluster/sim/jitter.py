"""Multiplicative iteration-time noise: ε lognormal with E[ε] = 1 and a given coefficient of
variation, drawn from a seeded generator in batches (one numpy call per 4096 draws)."""

from __future__ import annotations

import math

import numpy as np


class Jitter:
    def __init__(self, cv: float, seed: int) -> None:
        if cv < 0:
            raise ValueError(f"jitter must be >= 0, got {cv}")
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._rng = np.random.default_rng(seed)
        self._pool: list[float] = []

    def __call__(self) -> float:
        if self._sigma == 0.0:
            return 1.0
        if not self._pool:
            s = self._sigma
            self._pool = np.exp(s * self._rng.standard_normal(4096) - 0.5 * s * s).tolist()
        return self._pool.pop()
