"""Routing by measured effect: what a regime applies, chosen from the window's evidence
(docs/design.md §4 "Evidence").

The study's table says: saturated → spread load (τ 0.8, ω 0.1). Where prompts share long
prefixes (Mooncake's conversations), cache hits are prefill capacity, and giving them up to
spread load makes TTFT P99 1.3× worse on 3P/3D (docs/results.md "traces"). Whether spreading can
help is something the PoA window measures: ``poa_routing`` is the realized routing cost over the
Hungarian optimum for the same requests and workers (games/poa.py). Near 1, the router's
assignment is already as good as any, and a slow TTFT is capacity, which no (τ, ω) buys back;
well above 1, the assignment itself costs, and the table's row for the regime is the move the
study found to recover it.

So the applied policy lies on the segment from cache affinity A (the table's ``below`` row) to
the regime's row B, at a position λ ∈ [0, 1]:

    (τ, ω) = (1 − λ)·A + λ·B

λ's target is 1 while ``poa_routing ≥ threshold`` has held for ``sustain`` ticks in a regime above
``below``, and 0 otherwise; λ moves toward it by at most ``step`` per tick (damped), and a new
policy is pushed when λ has moved by ``quantum`` since the last one (bounded: (τ, ω) never leaves
the segment between two rows of the table). Below saturation λ is 0, as the table's row is A.

``threshold`` 1.25: the estimator's spread on calm windows, where the router is not the problem,
reaches 1.13 at its 90th percentile (Mooncake on 3P/3D, cache affinity held; the replay's ticks),
so a reading must clear that noise by a margin before it counts as evidence. ``sustain`` 5 ticks
and ``step`` 0.25 mean a full move takes 5 + 4 ticks: the PoA window is refreshed every few
seconds, and one window's reading must not swing the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.detector import Regime
from controller.policy import PolicyTable, RegimePolicy

__all__ = ["EvidencePolicy", "EvidenceSettings"]


@dataclass(frozen=True)
class EvidenceSettings:
    """The rule's constants (module docstring gives each its reason)."""

    threshold: float = 1.25
    sustain: int = 5
    step: float = 0.25
    quantum: float = 0.05

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 1.0):
            raise ValueError(f"threshold must be a finite number >= 1, got {self.threshold!r}")
        if isinstance(self.sustain, bool) or not isinstance(self.sustain, int) or self.sustain < 1:
            raise ValueError(f"sustain must be an integer >= 1, got {self.sustain!r}")
        for name, value in (("step", self.step), ("quantum", self.quantum)):
            if not (math.isfinite(value) and 0.0 < value <= 1.0):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")


class EvidencePolicy:
    """λ, the applied policy's place between affinity and the regime's row (module docstring).

    ``update`` once per tick; ``policy`` the (τ, ω) to apply now; ``due`` whether λ has moved
    by a quantum since the policy last pushed (``pushed`` records a push)."""

    def __init__(self, table: PolicyTable, settings: EvidenceSettings | None = None) -> None:
        self.table = table
        self.settings = settings if settings is not None else EvidenceSettings()
        self.balance = 0.0  # λ
        self.pushed_balance = 0.0
        self._costly_ticks = 0

    def update(self, regime: Regime, poa_routing: float | None) -> float:
        """One tick's evidence; the new λ."""
        s = self.settings
        costly = (
            regime != Regime.BELOW
            and poa_routing is not None
            and math.isfinite(poa_routing)
            and poa_routing >= s.threshold
        )
        self._costly_ticks = self._costly_ticks + 1 if costly else 0
        target = 1.0 if self._costly_ticks >= s.sustain else 0.0
        if regime == Regime.BELOW:
            self.balance = 0.0  # affinity below saturation, as the table
        elif target > self.balance:
            self.balance = min(target, self.balance + s.step)
        else:
            self.balance = max(target, self.balance - s.step)
        return self.balance

    def policy(self, regime: Regime) -> RegimePolicy:
        a, b, lam = self.table.below, self.table[regime], self.balance
        return RegimePolicy((1 - lam) * a.tau + lam * b.tau, (1 - lam) * a.omega + lam * b.omega)

    def due(self) -> bool:
        return abs(self.balance - self.pushed_balance) >= self.settings.quantum - 1e-12

    def pushed(self) -> None:
        self.pushed_balance = self.balance
