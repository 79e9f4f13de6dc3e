"""Minimum-cost assignment of requests to worker slots whose cost grows linearly with the slot.

Request r placed in slot k of worker w costs

    C[r, (w, k)] = base_w + k·svc_w + P[r, w],

so a worker's k-th request pays its k predecessors' service times. The optimum over all
assignments is the Hungarian solution of the slot-expanded n × (W·n) matrix (``scipy``'s
``linear_sum_assignment``: ``optimal_cost_hungarian``, the reference). Because the slot costs are
convex in the slot, the same optimum is a min-cost flow from requests to workers in which worker w
charges base_w + k·svc_w for its (k+1)-th unit; ``optimal_cost`` solves that flow by successive
shortest paths over the W workers:

- a new request r reaches worker w at cost d_w = P[r, w], or via a chain that moves a request r'
  already on w to w' at cost δ(w, w') = min_{r' on w} (P[r', w'] − P[r', w]);
- Bellman–Ford over the W workers gives every d_w (δ can be negative; the flow stays optimal after
  each augmentation, so there is no negative cycle), and the chain ends where d_w + base_w +
  n_w·svc_w (the worker's next slot) is least.

Each augmentation costs O(W² + W·log n), so a window of n requests costs O(n·W²) instead of the
O(n³·W) Hungarian method.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

FloatArray = npt.NDArray[np.float64]
INF = float("inf")


def _check(P: FloatArray, base: FloatArray, svc: FloatArray) -> tuple[int, int]:
    if P.ndim != 2:
        raise ValueError(f"P must be an n x W matrix, got shape {P.shape}")
    n, W = P.shape
    if base.shape != (W,) or svc.shape != (W,):
        raise ValueError(f"base and svc need one entry per worker ({W})")
    if np.any(svc < 0) or np.any(~np.isfinite(base)) or np.any(~np.isfinite(svc)):
        raise ValueError("slot costs need finite base and svc >= 0")
    if n and W == 0:
        raise ValueError("requests but no workers")
    if n and np.any(np.all(~np.isfinite(P), axis=1)):
        raise ValueError("a request has no worker it may go to (all its costs are infinite)")
    return n, W


def optimal_cost_hungarian(P: FloatArray, base: FloatArray, svc: FloatArray) -> float:
    """The reference: Hungarian method on the slot-expanded matrix (O(n³·W); small windows)."""
    n, W = _check(P, base, svc)
    if n == 0:
        return 0.0
    slots = base[None, :, None] + np.arange(n)[None, None, :] * svc[None, :, None]
    cost = (P[:, :, None] + slots).reshape(n, W * n)
    big = 1e18  # forbidden pairs: linear_sum_assignment needs finite entries
    cost = np.where(np.isfinite(cost), cost, big)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].sum())


def optimal_cost(P: FloatArray, base: FloatArray, svc: FloatArray) -> float:
    """Minimum of Σ_r C[r, (a(r), k_r)] over assignments, by successive shortest paths."""
    return optimal_assignment(P, base, svc)[0]


def optimal_assignment(P: FloatArray, base: FloatArray, svc: FloatArray) -> tuple[float, list[int]]:
    """``optimal_cost`` and the worker of each request in an assignment that attains it."""
    n, W = _check(P, base, svc)
    if n == 0:
        return 0.0, []
    where = [-1] * n
    count = [0] * W
    # moves[w][v]: heap of (P[r', v] − P[r', w], r') over requests r' placed on w (lazy), and
    # delta[w][v] its top: the cheapest way to pass one of w's requests on to v. Plain lists:
    # W is small, and numpy's per-call cost would dominate these W x W loops.
    moves: list[list[list[tuple[float, int]]]] = [[[] for _ in range(W)] for _ in range(W)]
    delta = [[INF] * W for _ in range(W)]
    rows = P.tolist()
    base_l, svc_l = base.tolist(), svc.tolist()
    total = 0.0
    for r in range(n):
        dist = rows[r][:]
        via = [-1] * W  # predecessor worker on the chain
        for _ in range(W - 1):  # Bellman–Ford; usually settles in one pass
            changed = False
            for w in range(W):
                dw = dist[w]
                if dw == INF:
                    continue
                for v, step in enumerate(delta[w]):
                    if dw + step < dist[v] - 1e-12:
                        dist[v], via[v], changed = dw + step, w, True
            if not changed:
                break
        end = min(range(W), key=lambda w: dist[w] + base_l[w] + count[w] * svc_l[w])
        total += dist[end] + base_l[end] + count[end] * svc_l[end]
        chain = [end]  # walk back from the worker that takes the extra slot
        while via[chain[-1]] >= 0 and len(chain) <= W:
            chain.append(via[chain[-1]])
        chain.reverse()  # chain[0] receives r; chain[i] passes one request on to chain[i + 1]
        movers = [moves[chain[i]][chain[i + 1]][0][1] for i in range(len(chain) - 1)]
        _place(r, chain[0], where, rows, moves)
        for i, mover in enumerate(movers):
            _place(mover, chain[i + 1], where, rows, moves)
        count[end] += 1
        for w in chain:  # only these workers gained or lost requests
            _refresh(w, where, moves, delta)
    return total, where


def _refresh(
    w: int, where: list[int], moves: list[list[list[tuple[float, int]]]], delta: list[list[float]]
) -> None:
    row = delta[w]
    for v, heap in enumerate(moves[w]):
        while heap and where[heap[0][1]] != w:
            heapq.heappop(heap)
        row[v] = heap[0][0] if heap else INF


def _place(
    r: int,
    w: int,
    where: list[int],
    rows: list[list[float]],
    moves: list[list[list[tuple[float, int]]]],
) -> None:
    where[r] = w
    row = rows[r]
    here = row[w]
    for v, heap in enumerate(moves[w]):
        if v != w:
            heapq.heappush(heap, (row[v] - here, r))
