"""The split the re-split lever moves, what drives it, and what one move returns
(``controller.resplit`` states the rules; docs/design.md §4 "Two levers, not one").

:func:`resplit_payoff` is the payoff rule: with κ Game 1's SLO capacity at the window's shape
and λ the demand, a move of k workers up serves min(λ, κ(P, D)) now, min(λ, κ(P, D − k)) while
they switch (W seconds: they switch side by side, each TP group loading its own weights) and
min(λ, κ(P + k, D − k)) after, so it is worth gain·max(0, R − W) against loss·W, R the
overload's likely remaining time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from controller.traffic import TrafficShape

__all__ = ["Payoff", "PoolTarget", "Pools", "Role", "SplitPlanner", "resplit_payoff"]

Role = Literal["prefill", "decode"]


@dataclass(frozen=True)
class Pools:
    """Workers (TP groups) serving in each role."""

    prefill: int
    decode: int

    def __str__(self) -> str:
        return f"{self.prefill}P/{self.decode}D"

    @property
    def prefilling(self) -> int:
        """Workers that run prefills: the prefill pool, or the decode workers when there is
        none (0P/nD: each prefills its own requests)."""
        return self.prefill if self.prefill > 0 else self.decode


class PoolTarget(Protocol):
    """What the resplitter drives: the cluster's pools."""

    def pools(self) -> Pools:
        """Workers serving in each role now (a worker in transition counts in neither)."""
        ...

    def resplitting(self) -> bool:
        """A re-split is in progress (draining or warming up)."""
        ...

    def resplit(self, to_role: Role, reason: str, workers: int = 1) -> None:
        """Start moving ``workers`` TP groups from the other role to ``to_role``, at once."""
        ...

    def max_step(self) -> int:
        """The most workers one move may take at once (1: one at a time)."""
        ...

    def switch_s(self) -> float:
        """Seconds (on the controller's clock) a moving worker serves in neither pool."""
        ...

    def cancel(self, reason: str) -> bool:
        """Stop the re-split under way if its worker still drains (it serves its old role
        again at once); False when there is none or its old engine has stopped."""
        ...


class SplitPlanner(Protocol):
    """Game 1 for the resplitter (e.g. ``cluster.sim.planning.GameOnePlanner``), each answer at
    the window's traffic shape (None: the profile's workload)."""

    def best_split(self, arrival_rate: float, shape: TrafficShape | None = None) -> Pools:
        """The split that serves ``arrival_rate`` best (Game 1's social optimum), in workers."""
        ...

    def capacity(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        """Requests per second ``pools`` carries within the SLOs: min(P·κ_P, D·κ_D)."""
        ...

    def prefill_rate(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        """μ: prompt tokens per second the prefill pool computes at full batches."""
        ...


@dataclass(frozen=True)
class Payoff:
    """What one move up would return (module docstring): request-seconds within the SLOs."""

    gain_rps: float
    loss_rps: float
    remaining_s: float
    switch_s: float
    workers: int = 1

    @property
    def benefit(self) -> float:
        return self.gain_rps * max(0.0, self.remaining_s - self.switch_s)

    @property
    def cost(self) -> float:
        return self.loss_rps * self.switch_s

    @property
    def pays(self) -> bool:
        return self.benefit > self.cost

    @property
    def net(self) -> float:
        return self.benefit - self.cost


def resplit_payoff(
    planner: SplitPlanner,
    pools: Pools,
    arrival_rate: float,
    lasted_s: float,
    switch_s: float,
    shape: TrafficShape | None = None,
    workers: int = 1,
) -> Payoff:
    """The payoff of moving ``workers`` (k) from decode to prefill at once (module docstring):
    gain and loss from Game 1's SLO capacities at the demand λ and the window's shape,
    R = ``lasted_s``."""
    k = workers
    if not 1 <= k < pools.decode:
        raise ValueError(f"a move takes 1 to {pools.decode - 1} decode workers, got {k}")
    served = min(arrival_rate, planner.capacity(pools, shape))
    moving = min(arrival_rate, planner.capacity(Pools(pools.prefill, pools.decode - k), shape))
    after = min(arrival_rate, planner.capacity(Pools(pools.prefill + k, pools.decode - k), shape))
    return Payoff(after - served, max(0.0, served - moving), lasted_s, switch_s, k)
