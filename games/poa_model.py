"""The PoA estimator's latency models and counterfactual costs (docs/design.md §3, Game 3).

``games.poa`` states the math; this module computes it. Symbols (n window requests r, workers w):

    U[r, w]  uncached tokens of r on w           (the route event's ``uncached_tokens``)
    Q[r, w]  prefill tokens active on w before r (``active_prefill_tokens``)
    D[r, w]  KV blocks active on w               (``decode_blocks``)
    Ū, Q̄, D̄  their means over r's candidates     (the cluster's load when r was routed)

Two fits, each one bounded least-squares problem (``scipy.optimize.lsq_linear``, every
coefficient free in [0, ∞) at once) made robust by Huber reweighting, in relative error:

- the router's view, ``fit_model`` on ``WindowArrays.design``:

    ℓ_r ≈ θ₀ + θ_u·U[r, a] + θ_q·Q[r, a] + θ_d·D[r, a] + θ_Ū·Ū_r + θ_Q̄·Q̄_r + θ_D̄·D̄_r;

  it gives the work a prefill token costs, θ_u, and the zero-load intercept θ₀;
- the queue model, ``fit_queue_model``: the same latencies on the wait the window's own requests
  caused, replayed (``games.poa_replay``) rather than as the router reported it:

    ℓ_r ≈ φ₀ + σ_u·U[r, a] + λ·wait_R(r) + φ_Ū·Ū_r.

  The router's Q and D leave this model: they are the same queue seen through its load reports,
  late when the view is stale, and a stale view's herd is exactly what they miss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from scipy.optimize import lsq_linear

from games.assignment import FloatArray
from games.poa_replay import replay_waits

if TYPE_CHECKING:
    from games.poa import WindowRequest

FEATURES = (
    "intercept",
    "uncached",
    "queued_prefill",
    "decode_blocks",
    "mean_uncached",
    "mean_queued_prefill",
    "mean_decode_blocks",
)
CLUSTER = np.array([False, False, False, False, True, True, True])
HUBER_C = 1.345  # Huber's constant: 95% of least squares' efficiency when the noise is normal
IRLS_ROUNDS = 8  # reweighting rounds; the weights settle in 3-5 on every window we tried
# Ridge tie-breaks, as shares of the rows' total weight (fit_model): they decide between columns
# the window cannot tell apart and move an identified fit by about that share of its misfit
# (relative residuals of a few per cent: a misfit of ~1e-3 per row).
TIE_BREAK = 1e-8
CLUSTER_TIE_BREAK = 1e-6  # 100x: a tie between own and cluster load goes to the worker's own
SMALLEST_LATENCY = 1e-3  # latencies below this share of the window's mean count as this share


@dataclass(frozen=True)
class WindowArrays:
    """A window as arrays over (request, worker); NaN where w was not a candidate for r."""

    workers: tuple[int, ...]
    U: FloatArray
    Q: FloatArray
    D: FloatArray
    chosen: npt.NDArray[np.intp]
    latency: FloatArray
    routed: FloatArray
    first_token: FloatArray

    @property
    def n(self) -> int:
        return int(self.latency.shape[0])

    def design(self) -> FloatArray:
        """The fit's rows: [1, U, Q, D at a(r), Ū, Q̄, D̄] per request."""
        rows = np.arange(self.n)
        own = [M[rows, self.chosen] for M in (self.U, self.Q, self.D)]
        means = [np.nanmean(M, axis=1) for M in (self.U, self.Q, self.D)]
        return np.column_stack([np.ones(self.n), *own, *means])


def window_arrays(window: Sequence[WindowRequest], workers: Sequence[int]) -> WindowArrays:
    column = {w: j for j, w in enumerate(workers)}
    n, W = len(window), len(workers)
    U, Q, D = (np.full((n, W), np.nan) for _ in range(3))
    for i, request in enumerate(window):
        for w, c in request.candidates.items():
            j = column[w]
            U[i, j], Q[i, j], D[i, j] = c.uncached_tokens, c.active_prefill_tokens, c.decode_blocks
    return WindowArrays(
        tuple(workers),
        U,
        Q,
        D,
        np.array([column[r.worker] for r in window], dtype=np.intp),
        np.array([r.latency for r in window], dtype=np.float64),
        np.array([r.routed_at for r in window], dtype=np.float64),
        np.array([r.first_token_at for r in window], dtype=np.float64),
    )


@dataclass(frozen=True)
class LatencyModel:
    """θ in FEATURES order; ``rounds``: Huber rounds run; ``anchored``: an unloaded latency
    took part in the fit."""

    theta: FloatArray
    rounds: int
    anchored: bool

    def coefficients(self) -> dict[str, float]:
        return dict(zip(FEATURES, self.theta.tolist(), strict=True))


def fit_model(
    X: FloatArray,
    y: FloatArray,
    anchor: tuple[FloatArray, float] | None = None,
    cluster: npt.NDArray[np.bool_] = CLUSTER,
    known: FloatArray | None = None,
) -> LatencyModel:
    """Bounded, Huber-reweighted least squares of y on X with θ ≥ 0, in relative error.

    Relative: each row is divided by its latency, because latency noise is multiplicative (an
    engine's iteration time jitters in proportion to itself; the simulator draws it so), and so
    that a 35 ms floor and a 9 s queue are each fitted to the same relative precision.
    ``anchor`` is one more observation (features, latency): the profile's unloaded latency at
    zero load. It weighs as much as all the window's rows together: the profile's figure is a
    mean over its calibration runs, no less certain than one window's mean, and a saturated
    window says nothing of its own about the latency at zero queue (its loads never go near 0).
    Columns are scaled to [0, 1], so the tie-break ridges are dimensionless; ``cluster`` marks
    the columns that are the cluster's load rather than the worker's own (``CLUSTER`` for X's
    columns in ``FEATURES`` order). ``known`` is a part of each row's latency already accounted
    for: the fit explains y − known, weighted as y is (the anchor's latency comes net of it)."""
    n, k = X.shape
    theta = np.zeros(k)
    rows, target, fixed = X, y, np.zeros(0)
    if anchor is not None:
        rows, target = np.vstack([X, anchor[0]]), np.append(y, anchor[1])
        fixed = np.array([float(n)])
    mean = float(np.mean(target))
    if n == 0 or not mean > 0:
        return LatencyModel(theta, 0, anchor is not None)
    # In units of the mean latency (θ = mean·φ), so that no division over- or underflows.
    unit = np.maximum(target / mean, SMALLEST_LATENCY)
    net = target if known is None else target - np.append(known, np.zeros(len(target) - n))
    R, t = rows / unit[:, None], net / mean / unit
    scale = np.abs(R).max(axis=0)
    live = scale > 0  # a column that is 0 on every row says nothing: its θ is 0
    R = R[:, live] / scale[live]
    ridge = np.diag(np.sqrt(n * np.where(cluster[live], CLUSTER_TIE_BREAK, TIE_BREAK)))
    weights = np.ones(n)
    solution = np.zeros(int(live.sum()))
    rounds = 0
    while rounds < IRLS_ROUNDS:
        rounds += 1
        root = np.sqrt(np.concatenate([weights, fixed]))
        A = np.vstack([R * root[:, None], ridge])
        b = np.concatenate([t * root, np.zeros(ridge.shape[0])])
        solution = lsq_linear(A, b, bounds=(0.0, np.inf), method="bvls").x
        residual = (t - R @ solution)[:n]
        spread = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
        if spread <= 1e-12:  # the fit is exact on over half the rows: nothing to down-weight
            break
        updated = np.minimum(1.0, HUBER_C * spread / np.maximum(np.abs(residual), 1e-300))
        if np.max(np.abs(updated - weights)) < 1e-3:
            break
        weights = updated
    theta[live] = mean * np.maximum(solution, 0.0) / scale[live]
    return LatencyModel(theta, rounds, anchor is not None)


# -- the queue model and the counterfactual (games.poa, docs/design.md §3) --------------------

QUEUE_FEATURES = ("intercept", "replayed_wait", "mean_uncached")
QUEUE_CLUSTER = np.array([False, False, True])
# σ₀ is tried at 0 and at S·2^-k, k = 0 … WORK_HALVINGS − 1: three decades below S, the
# largest work a request can bring (fit_queue_model), in steps of 2.
WORK_HALVINGS = 8


@dataclass(frozen=True)
class QueueModel:
    """ℓ_r ≈ φ₀ + σ_u·U[r, a] + λ·wait_R(r) + φ_Ū·Ū_r, with wait_R the replayed wait under
    the router's assignment of work σ(r, w) = σ₀ + σ_u·U[r, w] (``games.poa``)."""

    phi: FloatArray  # in QUEUE_FEATURES order; phi[1] is λ
    per_request_s: float  # σ₀
    per_token_s: float  # σ_u

    @property
    def wait_scale(self) -> float:
        return float(self.phi[1])

    def coefficients(self) -> dict[str, float]:
        return {
            **dict(zip(QUEUE_FEATURES, self.phi.tolist(), strict=True)),
            "work_per_request_s": self.per_request_s,
            "work_per_token_s": self.per_token_s,
        }


@dataclass(frozen=True)
class Counterfactual:
    """Everything a counterfactual assignment A is costed with:

    ℓ̂_A(r) = max(0, base[r, A(r)] + λ·wait_A(r)),  base[r, w] = ℓ_r − m_R(r) + σ_u·U[r, w],

    m_R(r) = σ_u·U[r, a] + λ·wait_R(r): on the router's assignment ℓ̂ = ℓ_r exactly."""

    base: FloatArray  # +inf off the candidates
    own: FloatArray  # σ_u·U[r, w], +inf off the candidates
    work: FloatArray  # σ(r, w), 0 off the candidates
    free: FloatArray  # when each worker's backlog at the window's start clears
    order: npt.NDArray[np.intp]  # routing order
    wait_scale: float  # λ
    router_wait: FloatArray  # wait_R
    floor: FloatArray  # m₀: each request's model latency with nobody queued, on its best worker


def routing_order(arrays: WindowArrays) -> npt.NDArray[np.intp]:
    """By routing time; a burst routed at one instant by first token, then window order (FIFO
    engines serve a burst in the order it was routed)."""
    return np.lexsort((np.arange(arrays.n), arrays.first_token, arrays.routed))


def _work(arrays: WindowArrays, per_request_s: float, per_token_s: float) -> FloatArray:
    return np.nan_to_num(per_request_s + per_token_s * arrays.U)


def _start(
    arrays: WindowArrays, order: npt.NDArray[np.intp], per_request_s: float, per_token_s: float
) -> FloatArray:
    # The backlog before the window: the prefill tokens the router saw on each worker when it
    # routed the window's first request, each carrying its share of a request's work (σ_u, and
    # σ₀ spread over the mean request's uncached tokens).
    first = int(order[0])
    rows = np.arange(arrays.n)
    mean_uncached = max(1.0, float(np.nanmean(arrays.U[rows, arrays.chosen])))
    per_token = per_token_s + per_request_s / mean_uncached
    backlog: FloatArray = per_token * np.nan_to_num(arrays.Q[first])
    return float(arrays.routed[first]) + backlog


def _misfit(X: FloatArray, net: FloatArray, y: FloatArray, phi: FloatArray) -> float:
    # Relative squared error, a miss of 100% or more counting once: the rows a Huber fit
    # down-weights cannot choose σ₀ for the rest.
    relative = (net - X @ phi) / np.maximum(y, SMALLEST_LATENCY * max(float(np.mean(y)), 1e-300))
    return float(np.sum(np.minimum(relative**2, 1.0)))


def fit_queue_model(
    arrays: WindowArrays, theta: FloatArray, unloaded_latency_s: float | None
) -> tuple[QueueModel, FloatArray]:
    """The queue model and wait_R. σ_u is the first fit's θ_u, which also prices r's own
    tokens (a queued token costs the engine what one of r's own does, and the first fit, with
    every load the router saw beside it, is the one that can tell U's effect from load's);
    σ₀, the per-request part of an iteration, is the one of the WORK_HALVINGS + 1 tried whose
    replayed waits explain the latencies best. None exceeds S, a request's latency with nobody
    queued (below)."""
    y, order = arrays.latency, routing_order(arrays)
    rows = np.arange(arrays.n)
    per_token = float(theta[1])
    own = per_token * arrays.U[rows, arrays.chosen]
    X = np.column_stack([np.ones(arrays.n), np.zeros(arrays.n), np.nanmean(arrays.U, axis=1)])
    anchor = None
    if unloaded_latency_s is not None:
        at_zero_load = np.array([1.0, 0.0, X[:, 2].mean()])
        anchor = (at_zero_load, max(0.0, unloaded_latency_s - float(own.mean())))
    # S: a request's own work is at most its latency with nobody queued: the first fit's
    # zero-load latency at the window's mean uncached tokens, which the anchor pins; without
    # one, the window's quickest requests (5th percentile) may be all that shows it.
    largest = float(theta[0] + own.mean())
    if unloaded_latency_s is None:
        largest = max(largest, float(np.percentile(y, 5)))
    best: tuple[float, QueueModel, FloatArray] | None = None
    for per_request in [0.0, *(largest * 0.5**k for k in range(WORK_HALVINGS))]:
        work = _work(arrays, float(per_request), per_token)
        free = _start(arrays, order, float(per_request), per_token)
        waits = replay_waits(arrays.chosen, order, arrays.routed, work, free)
        X[:, 1] = waits
        phi = fit_model(X, y, anchor, QUEUE_CLUSTER, known=own).theta
        misfit = _misfit(X, y - own, y, phi)
        if best is None or misfit < best[0]:
            best = (misfit, QueueModel(phi, float(per_request), per_token), waits)
    assert best is not None
    return best[1], best[2]


def counterfactual(
    arrays: WindowArrays, queue: QueueModel, router_wait: FloatArray
) -> Counterfactual:
    """The costs of the module docstring of ``games.poa``, for any assignment."""
    rows, a, y = np.arange(arrays.n), arrays.chosen, arrays.latency
    phi0, lam, phi_mean = queue.phi.tolist()
    own = queue.per_token_s * arrays.U  # NaN off the candidates
    held = own[rows, a] + lam * router_wait  # m_R(r)
    base = y[:, None] - held[:, None] + own
    base = np.where(np.isnan(base), np.inf, base)
    base[rows, a] = y - lam * router_wait  # exactly ℓ_r − λ·wait_R(r): no rounding in own − own
    floor = phi0 + phi_mean * np.nanmean(arrays.U, axis=1) + np.nanmin(own, axis=1)
    order = routing_order(arrays)
    return Counterfactual(
        base=base,
        own=np.where(np.isnan(own), np.inf, own),
        work=_work(arrays, queue.per_request_s, queue.per_token_s),
        free=_start(arrays, order, queue.per_request_s, queue.per_token_s),
        order=order,
        wait_scale=lam,
        router_wait=router_wait,
        floor=floor,
    )


def assignment_cost(
    cf: Counterfactual, arrays: WindowArrays, assignment: npt.NDArray[np.intp]
) -> float:
    """Σ_r ℓ̂_A(r) for the assignment A."""
    rows = np.arange(arrays.n)
    waits = replay_waits(assignment, cf.order, arrays.routed, cf.work, cf.free)
    cells = np.maximum(0.0, cf.base[rows, assignment] + cf.wait_scale * waits)
    return math.fsum(cells.tolist())
