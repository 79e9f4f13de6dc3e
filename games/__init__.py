"""The three games of DESIGN §3: the live Price-of-Anarchy estimator (Game 3), P/D allocation
(Game 1) and KV placement (Game 2)."""

from games.assignment import optimal_cost, optimal_cost_hungarian
from games.join import CompletionRecord, EventJoiner, RouteRecord
from games.poa import LatencyCurve, PoaEstimate, PoaEstimator, WindowRequest, poa_hat

__all__ = [
    "CompletionRecord",
    "EventJoiner",
    "LatencyCurve",
    "PoaEstimate",
    "PoaEstimator",
    "RouteRecord",
    "WindowRequest",
    "optimal_cost",
    "optimal_cost_hungarian",
    "poa_hat",
]
