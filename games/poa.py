"""Game 3: the routing game's Price of Anarchy, estimated live from a window of requests
(docs/design.md §3).

A window request r carries the routing decision that placed its prefill, with what the router's
route event carries for every candidate worker w at decision time (U[r, w] uncached tokens,
Q[r, w] active prefill tokens, D[r, w] active KV blocks): the prefill router's decision when a
prefill worker ran it, the decode router's when the decode worker prefilled locally. With it come
the worker chosen, a(r), its routing time t_r, and its realised latency ℓ_r (TTFT, from the
``first_token`` event).

**Queues, replayed.** What routing changes is who waits behind whom. A prefill engine runs
iterations: an idle worker starts a request at once, and those that reach it while an iteration
runs go together into the next one, which lasts their summed work (``games.poa_replay``). Each
request brings work σ(r, w) = σ₀ + σ_u·U[r, w]; replaying the window under an assignment A gives
each request's wait for others' work, wait_A(r). The router's own assignment gives wait_R.

**Model** (``games.poa_model``). A fit on the router's own view gives the seconds a prefill
token costs, σ_u = θ_u, and the zero-load latency; then, σ₀ being the one of a geometric grid
below that latency whose replay explains the window best,

    ℓ_r ≈ φ₀ + σ_u·U[r, a] + λ·wait_R(r) + φ_Ū·Ū_r                          (φ, λ ≥ 0)

and a request's counterfactual latency under A is

    ℓ̂_A(r) = max(0, ℓ_r + σ_u·(U[r, A(r)] − U[r, a]) + λ·(wait_A(r) − wait_R(r))),

+∞ off its candidates. The router's assignment costs exactly Σ_r ℓ_r. The view's Q and D
measure the same queues, late under a stale view: they do not enter ℓ̂, so a herd the router did
not see is costed as the queue it made.

**Estimate.**

    OPT   = min(Σ ℓ_r, Σ ℓ̂_F)    F: the assignment of a router that sees the replayed queues,
                                 each epoch of requests routed within one mean work of each
                                 other placed at once by the minimum-cost slot assignment
                                 (games.assignment: a batch-mate waits for the others)
    Fl    = min( Σ_r min_w m₀(r, w), OPT ),  m₀ = φ₀ + φ_Ū·Ū_r + σ_u·U[r, w]: the model's
            latency with nobody queued, the floor no routing goes below
    poa_routing  = Σ ℓ_r / OPT   ≥ 1   what better routing of these requests, at these times,
                                       on these workers, would have saved
    poa_capacity = OPT / Fl      ≥ 1   the queueing even that routing leaves: compute
    poa_hat      = Σ ℓ_r / Fl    = poa_routing · poa_capacity ≥ 1

OPT is the better of two assignments, not a minimum over all (the pairwise costs of a queue make
that a quadratic assignment problem): poa_routing is a lower bound on what routing could
recover. Each factor is ≥ 1: OPT ≤ Σℓ because the router's assignment is one of the two (it
costs Σℓ up to rounding, which the min removes), and Fl ≤ OPT by its min. The floor is capped as
a sum, not request by request: a request the model over-predicts would otherwise lend its misfit
to the floor, and a saturated window's noise (±100 ms on 9 s) would swamp a 35 ms floor.

**Anchor.** A saturated window never sees a load near zero, so it cannot place φ₀ by itself; the
profile's unloaded TTFT (``unloaded_latency_s``), when the caller has it, enters both fits as an
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
import numpy.typing as npt

from games.poa_model import (
    Counterfactual,
    LatencyModel,
    QueueModel,
    WindowArrays,
    assignment_cost,
    counterfactual,
    fit_model,
    fit_queue_model,
    window_arrays,
)
from games.poa_replay import EpochProblem, fresh_assignment

__all__ = [
    "MAX_AGE_S",
    "CandidateLoad",
    "PoaEstimate",
    "PoaEstimator",
    "WindowRequest",
    "estimate_parts",
    "fresh_routing",
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
    optimal_cost: float  # OPT: the better of the router's and the fresh router's assignment
    poa_hat: float
    poa_routing: float
    poa_capacity: float
    floor_cost: float = 0.0  # F
    model: LatencyModel | None = None
    window_start: float = 0.0  # earliest routing time in the window
    window_end: float = 0.0  # latest first token in the window
    queue: QueueModel | None = None


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
) -> tuple[WindowArrays, LatencyModel, QueueModel, Counterfactual]:
    """The window's arrays, both fitted models and the counterfactual costs (for tests and the
    benchmark). ``window`` must not be empty."""
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
    queue, router_wait = fit_queue_model(arrays, model.theta, unloaded_latency_s)
    return arrays, model, queue, counterfactual(arrays, queue, router_wait)


def fresh_routing(
    arrays: WindowArrays, cf: Counterfactual, on_epoch: EpochProblem | None = None
) -> npt.NDArray[np.intp]:
    """F of the module docstring: the window routed by a router that sees the replayed queues."""
    return fresh_assignment(
        cf.own, cf.wait_scale, cf.order, arrays.routed, cf.work, cf.free, on_epoch
    )


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
    arrays, model, queue, cf = estimate_parts(window, workers, unloaded_latency_s)
    # wait_R is the replay of the router's own assignment: its cost needs no second replay.
    rows = np.arange(arrays.n)
    router_cells = np.maximum(0.0, cf.base[rows, arrays.chosen] + cf.wait_scale * cf.router_wait)
    router = math.fsum(router_cells.tolist())
    fresh = fresh_routing(arrays, cf)
    opt = realised
    if not np.array_equal(fresh, arrays.chosen):
        # The router's assignment costs Σℓ (up to rounding): the min keeps OPT ≤ Σℓ exactly.
        opt = min(assignment_cost(cf, arrays, fresh), realised)
    floor = min(math.fsum(cf.floor.tolist()), opt)
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
        queue=queue,
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
