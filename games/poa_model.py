"""The PoA estimator's latency model and counterfactual cost matrix (docs/design.md §3, Game 3).

``games.poa`` states the math; this module computes it. Symbols (n window requests r, workers w):

    U[r, w]  uncached tokens of r on w           (the route event's ``uncached_tokens``)
    Q[r, w]  prefill tokens active on w before r (``active_prefill_tokens``)
    D[r, w]  KV blocks active on w               (``decode_blocks``)
    Ū, Q̄, D̄  their means over r's candidates     (the cluster's load when r was routed)

The fitted latency of r on its worker a = a(r),

    ℓ_r ≈ θ₀ + θ_u·U[r, a] + θ_q·Q[r, a] + θ_d·D[r, a] + θ_Ū·Ū_r + θ_Q̄·Q̄_r + θ_D̄·D̄_r,   θ ≥ 0,

is one bounded least-squares problem (``scipy.optimize.lsq_linear``, every coefficient free in
[0, ∞) at once) made robust by Huber reweighting. The own terms (θ_u, θ_q, θ_d) are what changes
when r moves; the cluster terms are what r would have met anywhere (a shared prefill pool, the
cluster's total decode load) and cancel in every counterfactual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from scipy.optimize import lsq_linear

from games.assignment import FloatArray

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
    X: FloatArray, y: FloatArray, anchor: tuple[FloatArray, float] | None = None
) -> LatencyModel:
    """Bounded, Huber-reweighted least squares of y on X with θ ≥ 0, in relative error.

    Relative: each row is divided by its latency, because latency noise is multiplicative (an
    engine's iteration time jitters in proportion to itself; the simulator draws it so), and so
    that a 35 ms floor and a 9 s queue are each fitted to the same relative precision.
    ``anchor`` is one more observation (features, latency): the profile's unloaded latency at
    zero load. It weighs as much as all the window's rows together: the profile's figure is a
    mean over its calibration runs, no less certain than one window's mean, and a saturated
    window says nothing of its own about the latency at zero queue (its loads never go near 0).
    Columns are scaled to [0, 1], so the tie-break ridges are dimensionless."""
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
    R, t = rows / unit[:, None], target / mean / unit
    scale = np.abs(R).max(axis=0)
    live = scale > 0  # a column that is 0 on every row says nothing: its θ is 0
    R = R[:, live] / scale[live]
    ridge = np.diag(np.sqrt(n * np.where(CLUSTER[live], CLUSTER_TIE_BREAK, TIE_BREAK)))
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


def in_flight_ahead(arrays: WindowArrays) -> npt.NDArray[np.bool_]:
    """ahead[r, r'] = r' was routed before r and had no first token yet when r was routed.

    Requests routed at one instant (a burst) are taken in first-token order, then window order:
    FIFO engines serve a burst in the order it was routed."""
    order = np.lexsort((np.arange(arrays.n), arrays.first_token, arrays.routed))
    rank = np.empty(arrays.n, dtype=np.intp)
    rank[order] = np.arange(arrays.n)
    earlier = rank[None, :] < rank[:, None]
    return earlier & (arrays.first_token[None, :] > arrays.routed[:, None])


@dataclass(frozen=True)
class Counterfactual:
    """The assignment problem: C[r, (w, k)] = P[r, w] + k·svc[w] (``games.assignment``), and
    the zero-queue floor per request."""

    P: FloatArray
    svc: FloatArray
    floor: FloatArray
    slot: npt.NDArray[np.intp]  # k_r: r's slot on a(r) in the router's own assignment


def counterfactual(arrays: WindowArrays, theta: FloatArray) -> Counterfactual:
    """P, svc and the floor of the module docstring of ``games.poa``."""
    n, W = arrays.n, len(arrays.workers)
    rows = np.arange(n)
    a = arrays.chosen
    y = arrays.latency
    ahead = in_flight_ahead(arrays)
    pairs = n * (n - 1) / 2
    rho = float(ahead.sum()) / pairs if pairs else 0.0
    # Q_win[r, w]: prefill tokens of window requests the router put on w ahead of r, still in
    # flight then. Q_ext = Q − Q_win is the load the window did not cause; the slot term k·svc
    # replaces Q_win in every counterfactual assignment.
    mine = np.zeros((n, W))
    mine[rows, a] = np.nan_to_num(arrays.U[rows, a])
    Q_ext = np.maximum(0.0, arrays.Q - ahead.astype(np.float64) @ mine)
    _, th_u, th_q, th_d = theta[:4]
    own = th_u * arrays.U + th_q * Q_ext + th_d * arrays.D  # NaN off the candidates
    offered = (~np.isnan(arrays.U)).sum(axis=0)  # ū_w: what one more request brings to w
    mean_u = np.nansum(arrays.U, axis=0) / np.maximum(offered, 1)
    svc = th_q * rho * mean_u
    # Slots of the router's assignment, by latency on each worker (the slot costs sum to
    # svc·n_w(n_w − 1)/2 in any order; this one keeps every cell ≥ 0 with the least cap).
    slot = np.zeros(n, dtype=np.intp)
    for j in range(W):
        members = np.flatnonzero(a == j)
        if members.size == 0:
            continue
        ranked = members[np.argsort(y[members], kind="stable")]
        slot[ranked] = np.arange(members.size)
        if members.size > 1 and svc[j] > 0:
            k = np.arange(1, members.size)
            svc[j] = min(svc[j], float(np.min(y[ranked[1:]] / k)))  # P[r, a] = ℓ_r − k_r·svc ≥ 0
    held = own[rows, a] + slot * svc[a]  # m(r, a(r), k_r)
    P = y[:, None] - held[:, None] + own
    P = np.where(np.isnan(P), np.inf, np.maximum(P, 0.0))
    P[rows, a] = np.maximum(0.0, y - slot * svc[a])  # exactly ℓ_r − k_r·svc, ≥ 0 by the cap
    # m0[r, w]: the model's latency of r on w with every queue and load term at zero.
    m0 = theta[0] + theta[4] * np.nanmean(arrays.U, axis=1)[:, None] + th_u * arrays.U
    floor = np.minimum(np.nanmin(m0, axis=1), np.min(P, axis=1))
    return Counterfactual(P, svc, np.maximum(floor, 0.0), slot)
