"""Game 3: the routing game's Price of Anarchy, estimated live from a request window
(docs/design.md §3).

For every completed request r in the window we know the worker the router chose, a(r), the
router's view of every candidate at decision time (uncached tokens u(r, w)) and the realised
latency ℓ_r (TTFT). Each worker gets a frozen latency curve fitted from the window,

    ℓ_w(k) = base_w + k·svc_w,

k being how many window requests w took before r. base_w is w's unloaded latency: the profile's
when the caller knows it, else the lowest ℓ_r − prefill_time(u(r, w)) among w's requests. svc_w is
the latency each earlier window request added to later ones on w: the least-squares slope of
ℓ_r − prefill_time(u(r, w)) over k, floored at 0. Request r in slot k of w costs
C[r, (w, k)] = ℓ_w(k) + prefill_time(u(r, w)), and

    OPT          = min over assignments of Σ C      (games.assignment: exact, slot structure)
    poa_hat      = Σ_r ℓ_r / OPT                    realised over optimal
    poa_routing  = C(router's assignment) / OPT     what better routing could recover (≥ 1)
    poa_capacity = Σ_r ℓ_r / C(router's assignment) latency the model cannot place in the window:
                                                    a standing queue, i.e. compute exhaustion

so poa_hat = poa_routing · poa_capacity. A worker with no request in the window gets the best
base seen and the median slope (an idle worker is no slower than the busy ones), so routing that
ignored it shows up in poa_routing.

Why a fitted slope and not 1 / measured throughput: window requests do not arrive together, so
charging the k-th one k service times charges the spread of arrivals as latency (a calm window
then reports poa_hat far below 1). The slope measures the queueing the window actually shows.

Edge cases: an empty window, or one whose latencies are all zero, reports 1 everywhere (nothing to
attribute, nothing to improve); 0/0 is 1; one worker makes poa_routing 1 (its only assignment is
optimal).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from games.assignment import FloatArray, optimal_cost


@dataclass(frozen=True)
class WindowRequest:
    """A completed request joined with its routing decision."""

    request_id: str
    worker: int
    routed_at: float
    completed_at: float
    latency: float  # ℓ_r: time to first token, seconds
    uncached: Mapping[int, int]  # u(r, w) for every candidate worker at decision time

    def __post_init__(self) -> None:
        if not np.isfinite(self.latency) or self.latency < 0:
            raise ValueError(f"request {self.request_id!r}: latency must be finite and >= 0")
        if self.worker not in self.uncached:
            raise ValueError(f"request {self.request_id!r}: chosen worker missing from breakdown")


@dataclass(frozen=True)
class LatencyCurve:
    """ℓ_w(k) = base + k·svc."""

    base: float
    svc: float


@dataclass(frozen=True)
class PoaEstimate:
    n: int
    workers: tuple[int, ...]
    realised: float  # Σ_r ℓ_r
    router_cost: float  # the router's assignment under C
    optimal_cost: float  # OPT
    poa_hat: float
    poa_routing: float
    poa_capacity: float
    curves: Mapping[int, LatencyCurve] = field(default_factory=dict)
    window_start: float = 0.0
    window_end: float = 0.0


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator with 0/0 = 1 and x/0 = +inf."""
    if denominator == 0.0:
        return 1.0 if numerator == 0.0 else float("inf")
    return numerator / denominator


def prefill_matrix(
    window: Sequence[WindowRequest], workers: Sequence[int], prefill_s_per_token: float
) -> FloatArray:
    """P[r, w] = prefill_time(u(r, w)); +inf where w was not a candidate for r."""
    P = np.full((len(window), len(workers)), np.inf)
    column = {w: j for j, w in enumerate(workers)}
    for i, request in enumerate(window):
        for w, tokens in request.uncached.items():
            if w in column:
                P[i, column[w]] = prefill_s_per_token * tokens
    return P


def fit_latency_curves(
    window: Sequence[WindowRequest],
    workers: Sequence[int],
    P: FloatArray,
    unloaded_latency_s: float | None = None,
) -> dict[int, LatencyCurve]:
    """Per-worker base_w and svc_w from the window (module docstring)."""
    column = {w: j for j, w in enumerate(workers)}
    net: dict[int, list[float]] = {}
    for i in sorted(range(len(window)), key=lambda i: window[i].routed_at):
        request = window[i]
        w = request.worker
        net.setdefault(w, []).append(max(0.0, request.latency - P[i, column[w]]))
    base = {
        w: min(ys) if unloaded_latency_s is None else unloaded_latency_s for w, ys in net.items()
    }
    svc = {w: _slope(ys) for w, ys in net.items() if len(ys) >= 2}
    idle_base = min(base.values())
    idle_svc = float(np.median(list(svc.values()))) if svc else 0.0
    return {w: LatencyCurve(base.get(w, idle_base), svc.get(w, idle_svc)) for w in workers}


def _slope(ys: Sequence[float]) -> float:
    """Least-squares slope of ys over 0, 1, 2, ..., floored at 0."""
    y = np.asarray(ys, dtype=np.float64)
    k = np.arange(y.shape[0], dtype=np.float64)
    k -= k.mean()
    return max(0.0, float(np.dot(k, y - y.mean()) / np.dot(k, k)))


def router_assignment_cost(
    window: Sequence[WindowRequest],
    workers: Sequence[int],
    P: FloatArray,
    curves: Mapping[int, LatencyCurve],
) -> float:
    """C of the router's own assignment: Σ_r P[r, a(r)] + Σ_w n_w·base_w + svc_w·n_w(n_w−1)/2
    (slots are filled in some order; the sum does not depend on which)."""
    column = {w: j for j, w in enumerate(workers)}
    served: dict[int, int] = {}
    total = 0.0
    for i, request in enumerate(window):
        total += P[i, column[request.worker]]
        served[request.worker] = served.get(request.worker, 0) + 1
    for w, k in served.items():
        curve = curves[w]
        total += k * curve.base + curve.svc * k * (k - 1) / 2
    return float(total)


def poa_hat(
    window: Sequence[WindowRequest],
    prefill_s_per_token: float,
    workers: Iterable[int] | None = None,
    unloaded_latency_s: float | None = None,
) -> PoaEstimate:
    """Estimate poa_hat, poa_routing and poa_capacity over one window of requests.

    ``workers`` adds workers that may have taken no request in the window; ``unloaded_latency_s``
    is the profile's latency with nobody ahead (else the window's lowest is used)."""
    if prefill_s_per_token < 0:
        raise ValueError(f"prefill_s_per_token must be >= 0, got {prefill_s_per_token}")
    if not window:
        return PoaEstimate(0, (), 0.0, 0.0, 0.0, 1.0, 1.0, 1.0)
    pool = set(workers or ())
    for request in window:
        pool.update(request.uncached)
    ordered = tuple(sorted(pool))
    P = prefill_matrix(window, ordered, prefill_s_per_token)
    curves = fit_latency_curves(window, ordered, P, unloaded_latency_s)
    base = np.array([curves[w].base for w in ordered])
    svc = np.array([curves[w].svc for w in ordered])
    opt = optimal_cost(P, base, svc)
    routed = router_assignment_cost(window, ordered, P, curves)
    realised = float(sum(r.latency for r in window))
    if realised == 0.0:
        routed = opt = 0.0
    return PoaEstimate(
        n=len(window),
        workers=ordered,
        realised=realised,
        router_cost=routed,
        optimal_cost=opt,
        poa_hat=ratio(realised, opt),
        poa_routing=max(1.0, ratio(routed, opt)),  # OPT ≤ router's cost; rounding only
        poa_capacity=ratio(realised, routed),
        curves=curves,
        window_start=min(r.routed_at for r in window),
        window_end=max(r.completed_at for r in window),
    )


class PoaEstimator:
    """Keeps the window (the last ``max_requests`` completions, none older than ``max_age_s``)
    and estimates on demand."""

    def __init__(
        self,
        prefill_s_per_token: float,
        max_requests: int = 256,
        max_age_s: float | None = 10.0,
        workers: Iterable[int] | None = None,
        unloaded_latency_s: float | None = None,
    ) -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        if max_age_s is not None and max_age_s <= 0:
            raise ValueError(f"max_age_s must be > 0, got {max_age_s}")
        if prefill_s_per_token < 0:
            raise ValueError(f"prefill_s_per_token must be >= 0, got {prefill_s_per_token}")
        self.prefill_s_per_token = prefill_s_per_token
        self.max_requests = max_requests
        self.max_age_s = max_age_s
        self.workers = set(workers or ())
        self.unloaded_latency_s = unloaded_latency_s
        self._window: deque[WindowRequest] = deque(maxlen=max_requests)

    def add(self, request: WindowRequest) -> None:
        self._window.append(request)

    def window(self, now: float | None = None) -> list[WindowRequest]:
        if now is None or self.max_age_s is None:
            return list(self._window)
        horizon = now - self.max_age_s
        return [r for r in self._window if r.completed_at >= horizon]

    def estimate(self, now: float | None = None) -> PoaEstimate:
        return poa_hat(
            self.window(now), self.prefill_s_per_token, self.workers, self.unloaded_latency_s
        )
