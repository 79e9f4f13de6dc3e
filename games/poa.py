"""Game 3: the routing game's Price of Anarchy, estimated live from a window of requests
(docs/design.md §3).

A window request r carries what the router's route event carries for every candidate worker w at
decision time (U[r, w] uncached tokens, Q[r, w] active prefill tokens, D[r, w] active KV blocks),
the worker it chose, a(r), and its realised latency ℓ_r (TTFT, from the ``first_token`` event).

**Model.** m is a linear model of latency in those features, fitted on the window
(``games.poa_model.fit_model``: bounded least squares, all θ ≥ 0 at once, in relative error
since latency noise is multiplicative, Huber-reweighted):

    ℓ_r ≈ θ₀ + θ_u·U[r, a] + θ_q·Q[r, a] + θ_d·D[r, a] + θ_Ū·Ū_r + θ_Q̄·Q̄_r + θ_D̄·D̄_r

(Ū, Q̄, D̄: means over r's candidates, the load r would have met on any worker.) Only the own
terms differ between workers. Q[r, w] splits into the prefill tokens of window requests the router
put on w ahead of r and still without a first token when r was routed, Q_win, and the rest,
Q_ext = Q − Q_win. In a counterfactual assignment the window's own part is the slot term: the
k-th window request on w meets k·svc_w more latency, svc_w = θ_q·ρ·ū_w, ρ the share of ordered
window pairs (r' routed before r) with r' still in flight at r's routing, ū_w the window's mean
U[·, w]. So for r in slot k of w

    m(r, w, k) = θ_u·U[r, w] + θ_q·Q_ext[r, w] + θ_d·D[r, w] + k·svc_w

and its counterfactual latency is

    ℓ̂(r, w, k) = ℓ_r + m(r, w, k) − m(r, a(r), k_r),

k_r being r's slot in the router's own assignment (by latency on a(r): the slot costs of a worker
sum to svc·n(n − 1)/2 in any order, and this one keeps every cell ≥ 0 once svc_w is capped at
min_i ℓ_(i)/i over w's sorted latencies). ℓ̂ is floored at 0 off the router's choice, +∞ off the
candidates. On this one matrix the router's assignment costs exactly Σ_r ℓ_r.

**Estimate.**

    OPT   = min over assignments of Σ ℓ̂   (games.assignment: exact, slot structure; the set holds
                                           the router's assignment, so OPT ≤ Σ ℓ_r)
    F     = Σ_r min( min_w m₀(r, w), min_w ℓ̂(r, w, 0) ),  m₀ = θ₀ + θ_Ū·Ū_r + θ_u·U[r, w]:
            the zero-queue floor, the model's latency of r with every load and queue term at
            zero, capped by r's cheapest counterfactual (so F ≤ OPT)
    poa_routing  = Σ ℓ_r / OPT   ≥ 1   what better routing of this window could recover
    poa_capacity = OPT / F       ≥ 1   the queueing even the best routing leaves: compute
    poa_hat      = Σ ℓ_r / F     = poa_routing · poa_capacity ≥ 1

Each factor is ≥ 1 by construction, not by clamping: OPT and F are taken as min(OPT, Σℓ) and
min(F, OPT), which change them only by float rounding (the router's assignment costs Σℓ exactly).

**Anchor.** A saturated window never sees a load near zero, so it cannot place θ₀ by itself; the
profile's unloaded TTFT (``unloaded_latency_s``), when the caller has it, enters the fit as an
observation at zero load with the window's mean uncached tokens.

**Window** (``PoaEstimator``): a request enters when its first token arrives and is kept by its
routing time, the latest ``max_requests`` routed within ``max_age_s`` of now. When a backlog
drains (``controller.drain``) the caller cuts the window there (``forget_before``): requests
routed before it measured a queue that is gone, and a 30 s window would keep them for 30 s.

Edge cases: an empty window, or one whose latencies are all zero, reports 1 everywhere; 0/0 is 1
and x/0 is +inf (a floor of zero: the model puts all latency in queues); one worker makes
poa_routing 1.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from games.assignment import optimal_cost
from games.poa_model import (
    Counterfactual,
    LatencyModel,
    WindowArrays,
    counterfactual,
    fit_model,
    window_arrays,
)

__all__ = [
    "MAX_AGE_S",
    "CandidateLoad",
    "PoaEstimate",
    "PoaEstimator",
    "WindowRequest",
    "estimate_parts",
    "poa_hat",
    "ratio",
]


# A request can only be in a window once its first token is out, so the age limit (in routing
# time) must exceed the longest TTFT a loaded cluster shows: ~10 s for 70B on 1P/5D held
# saturated (docs/design.md §8), where a 10 s limit left the window empty. Three times that; the
# count limit (256 by default) keeps the window to the most recently routed requests.
MAX_AGE_S = 30.0


@dataclass(frozen=True)
class CandidateLoad:
    """One candidate's line of the route event: what the router saw of w for r."""

    uncached_tokens: int
    active_prefill_tokens: int
    decode_blocks: int

    def __post_init__(self) -> None:
        for name in ("uncached_tokens", "active_prefill_tokens", "decode_blocks"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class WindowRequest:
    """A request whose first token arrived, joined with its routing decision."""

    request_id: str
    worker: int
    routed_at: float
    first_token_at: float
    latency: float  # ℓ_r: time to first token, seconds
    candidates: Mapping[int, CandidateLoad]  # every candidate worker at decision time

    def __post_init__(self) -> None:
        if not math.isfinite(self.latency) or self.latency < 0:
            raise ValueError(f"request {self.request_id!r}: latency must be finite and >= 0")
        if not (math.isfinite(self.routed_at) and math.isfinite(self.first_token_at)):
            raise ValueError(f"request {self.request_id!r}: times must be finite")
        if self.worker not in self.candidates:
            raise ValueError(f"request {self.request_id!r}: chosen worker missing from breakdown")

    @property
    def uncached(self) -> dict[int, int]:
        """U[r, w] for every candidate."""
        return {w: c.uncached_tokens for w, c in self.candidates.items()}


@dataclass(frozen=True)
class PoaEstimate:
    n: int
    workers: tuple[int, ...]
    realised: float  # Σ_r ℓ_r (also the router's assignment's cost on the matrix)
    router_cost: float  # the router's assignment on the matrix, as computed (= realised)
    optimal_cost: float  # OPT
    poa_hat: float
    poa_routing: float
    poa_capacity: float
    floor_cost: float = 0.0  # F
    model: LatencyModel | None = None
    window_start: float = 0.0  # earliest routing time in the window
    window_end: float = 0.0  # latest first token in the window


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator with 0/0 = 1 and x/0 = +inf."""
    if denominator == 0.0:
        return 1.0 if numerator == 0.0 else float("inf")
    return numerator / denominator


def _check_unloaded(unloaded_latency_s: float | None) -> None:
    if unloaded_latency_s is not None and not (
        math.isfinite(unloaded_latency_s) and unloaded_latency_s >= 0
    ):
        raise ValueError(f"unloaded_latency_s must be finite and >= 0, got {unloaded_latency_s}")


def estimate_parts(
    window: Sequence[WindowRequest],
    workers: Iterable[int] | None = None,
    unloaded_latency_s: float | None = None,
) -> tuple[WindowArrays, LatencyModel, Counterfactual]:
    """The window's arrays, the fitted model and the counterfactual matrix (for tests and the
    benchmark's Hungarian cross-check). ``window`` must not be empty."""
    _check_unloaded(unloaded_latency_s)
    pool = set(workers or ())
    for request in window:
        pool.update(request.candidates)
    arrays = window_arrays(window, tuple(sorted(pool)))
    X = arrays.design()
    anchor = None
    if unloaded_latency_s is not None:
        # Zero load, the window's mean uncached tokens (own and cluster): module docstring.
        at_zero_load = np.array([1.0, X[:, 1].mean(), 0.0, 0.0, X[:, 4].mean(), 0.0, 0.0])
        anchor = (at_zero_load, float(unloaded_latency_s))
    model = fit_model(X, arrays.latency, anchor)
    return arrays, model, counterfactual(arrays, model.theta)


def poa_hat(
    window: Sequence[WindowRequest],
    workers: Iterable[int] | None = None,
    unloaded_latency_s: float | None = None,
) -> PoaEstimate:
    """poa_hat, poa_routing and poa_capacity over one window (module docstring).

    ``workers`` adds workers that may be nobody's candidate in the window (they are then
    nobody's option either); ``unloaded_latency_s`` is the profile's TTFT with nobody queued."""
    _check_unloaded(unloaded_latency_s)
    if not window:
        return PoaEstimate(0, (), 0.0, 0.0, 0.0, 1.0, 1.0, 1.0)
    realised = math.fsum(r.latency for r in window)
    span = (min(r.routed_at for r in window), max(r.first_token_at for r in window))
    if realised == 0.0:  # nothing to attribute, nothing to improve
        pool = set(workers or ()).union(*(r.candidates for r in window))
        return PoaEstimate(
            len(window), tuple(sorted(pool)), 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, None, *span
        )
    arrays, model, cf = estimate_parts(window, workers, unloaded_latency_s)
    counts = np.bincount(arrays.chosen, minlength=len(arrays.workers))
    rows = np.arange(arrays.n)
    router = math.fsum(cf.P[rows, arrays.chosen].tolist()) + float(
        np.dot(cf.svc, counts * (counts - 1) / 2)
    )
    # The router's assignment is in the set and costs Σℓ exactly; the min drops rounding only.
    opt = min(optimal_cost(cf.P, np.zeros(len(arrays.workers)), cf.svc), realised)
    floor = min(math.fsum(cf.floor.tolist()), opt)  # F ≤ OPT cell by cell; rounding only
    return PoaEstimate(
        n=arrays.n,
        workers=arrays.workers,
        realised=realised,
        router_cost=router,
        optimal_cost=opt,
        poa_hat=ratio(realised, floor),
        poa_routing=ratio(realised, opt),
        poa_capacity=ratio(opt, floor),
        floor_cost=floor,
        model=model,
        window_start=span[0],
        window_end=span[1],
    )


class PoaEstimator:
    """The window: requests enter when their first token arrives and are kept by routing time,
    the latest ``max_requests`` routed no earlier than ``max_age_s`` before ``now``."""

    def __init__(
        self,
        max_requests: int = 256,
        max_age_s: float | None = MAX_AGE_S,
        workers: Iterable[int] | None = None,
        unloaded_latency_s: float | None = None,
    ) -> None:
        if isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1:
            raise ValueError(f"max_requests must be an int >= 1, got {max_requests!r}")
        if max_age_s is not None and not (math.isfinite(max_age_s) and max_age_s > 0):
            raise ValueError(f"max_age_s must be finite and > 0, got {max_age_s}")
        _check_unloaded(unloaded_latency_s)
        self.max_requests = max_requests
        self.max_age_s = max_age_s
        self.workers = set(workers or ())
        self.unloaded_latency_s = unloaded_latency_s
        self._window: list[WindowRequest] = []  # sorted by _key
        self._keys: list[tuple[float, float, str]] = []
        self.since = -math.inf  # requests routed before this are forgotten (forget_before)

    @staticmethod
    def _key(request: WindowRequest) -> tuple[float, float, str]:
        # Routing time; a burst routed at one instant by first token (FIFO: routing order),
        # then id: the order never depends on the order events arrived in.
        return (request.routed_at, request.first_token_at, request.request_id)

    def add(self, request: WindowRequest) -> None:
        """A request's first token arrived: it joins the window at its routing time (unless it
        was routed before ``since``)."""
        if request.routed_at < self.since:
            return
        key = self._key(request)
        at = bisect.bisect_right(self._keys, key)
        self._keys.insert(at, key)
        self._window.insert(at, request)
        # A request with max_requests later-routed ones after it can never be in a window again.
        if len(self._window) > self.max_requests:
            del self._window[: -self.max_requests], self._keys[: -self.max_requests]

    def forget_before(self, since: float) -> None:
        """A backlog drained at ``since`` (``controller.drain``): the requests routed before it
        met a queue that is gone, so they leave the window, and those still without a first
        token never join it. The window then holds what routing does now."""
        if not math.isfinite(since):
            raise ValueError(f"since must be finite, got {since!r}")
        self.since = max(self.since, float(since))
        start = bisect.bisect_left(self._keys, (self.since,))
        del self._window[:start], self._keys[:start]

    def window(self, now: float | None = None) -> list[WindowRequest]:
        if now is None or self.max_age_s is None:
            return list(self._window)
        start = bisect.bisect_left(self._keys, (now - self.max_age_s,))
        return self._window[start:]

    def estimate(self, now: float | None = None) -> PoaEstimate:
        return poa_hat(self.window(now), self.workers, self.unloaded_latency_s)
