"""The window's queues replayed under any assignment (docs/design.md §3, Game 3).

A prefill engine runs iterations: an idle worker starts a request at once, and the requests that
reach it while an iteration runs go together into its next one, which lasts their summed work.
``IterationReplay`` plays a window's requests, in routing order, through W such workers:

    work σ(r, w)          seconds of w's time that r's prefill takes (``games.poa_model``)
    free_w                when w's current iteration ends; pending_w the requests that wait for
                          the next one
    wait_A(r)             when r's iteration ends − routed_r − σ(r, A(r)): the time r spends on
                          others' work (the iteration before its own, and its batch-mates')

Requests routed within one mean work σ̄ of each other reach a busy worker inside one iteration,
so they form one *epoch*: ``fresh_assignment`` places each epoch at once, by the minimum-cost
assignment of ``games.assignment`` (a request in slot k of w waits base_w + k·2σ̄_w: each of j
batch-mates waits for the other j − 1, so the slot costs of a worker sum to 2σ̄·j(j − 1)/2), with
base_w what a request joining w then would wait for. It is the router with the true load: every
request sees the queues the earlier ones left in the replay, not a stale report of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from games.assignment import FloatArray, optimal_assignment

__all__ = ["EpochProblem", "IterationReplay", "epochs", "fresh_assignment", "replay_waits"]

IntArray = npt.NDArray[np.intp]
Order = Sequence[int] | IntArray  # request indices in routing order


class IterationReplay:
    """W prefill workers fed in routing order (module docstring)."""

    def __init__(self, routed: FloatArray, work: FloatArray, free: FloatArray) -> None:
        self.routed = routed
        self.work = work  # σ(r, w); off the candidates its value is never read
        self.free = free.astype(np.float64).copy()
        self.pending: list[list[int]] = [[] for _ in range(free.shape[0])]
        self.pending_work = np.zeros(free.shape[0])
        self.wait = np.zeros(routed.shape[0])

    def _advance(self, w: int, t: float) -> None:
        """Start w's next iteration if it begins by ``t`` (it holds everything pending)."""
        if self.pending[w] and self.free[w] <= t:
            start, batch = self.free[w], self.pending[w]
            end = start + float(self.pending_work[w])
            for r in batch:
                self.wait[r] = end - self.routed[r] - self.work[r, w]
            self.free[w], self.pending[w], self.pending_work[w] = end, [], 0.0

    def waiting_at(self, w: int, t: float) -> float:
        """What a request joining w at ``t`` waits for before its own work: the iteration
        running, then the work already pending beside it."""
        self._advance(w, t)
        return max(0.0, float(self.free[w]) - t) + float(self.pending_work[w])

    def add(self, r: int, w: int) -> None:
        t = float(self.routed[r])
        self._advance(w, t)
        if not self.pending[w] and self.free[w] <= t:
            self.free[w] = t + self.work[r, w]  # an idle worker starts it at once
            self.wait[r] = 0.0
        else:
            self.pending[w].append(r)
            self.pending_work[w] += self.work[r, w]

    def finish(self) -> FloatArray:
        for w in range(len(self.pending)):
            self._advance(w, math.inf)
        return self.wait


def replay_waits(
    assignment: IntArray, order: Order, routed: FloatArray, work: FloatArray,
    free: FloatArray,
) -> FloatArray:  # fmt: skip
    """wait_A(r) for every request of the window under ``assignment``."""
    replay = IterationReplay(routed, work, free)
    for r in order:
        replay.add(int(r), int(assignment[r]))
    return replay.finish()


def epochs(order: Order, routed: FloatArray, gap: float) -> Iterator[list[int]]:
    """Runs of requests (in routing order) routed within ``gap`` of their run's first."""
    run: list[int] = []
    for r in order:
        if run and routed[r] - routed[run[0]] > gap:
            yield run
            run = []
        run.append(int(r))
    if run:
        yield run


EpochProblem = Callable[[FloatArray, FloatArray, FloatArray], None]


def fresh_assignment(
    own: FloatArray, wait_scale: float, order: Order, routed: FloatArray,
    work: FloatArray, free: FloatArray, on_epoch: EpochProblem | None = None,
) -> IntArray:  # fmt: skip
    """The assignment of a router that sees the replayed queues (module docstring).

    ``own[r, w]`` is r's own latency on w (+∞ off its candidates); a second of wait costs
    ``wait_scale``, the model's weight on the replayed wait. ``on_epoch`` is shown each
    epoch's assignment problem (P, base, svc) before it is solved (bench.poa checks the solver
    against the Hungarian method on them)."""
    n, W = own.shape
    assignment = np.zeros(n, dtype=np.intp)
    if n == 0:
        return assignment
    finite = np.isfinite(own)
    sigma = np.where(finite, work, 0.0).sum(axis=0) / np.maximum(finite.sum(axis=0), 1)
    # σ̄ over every (request, candidate) pair: a row mean would be NaN for any request that is
    # not every worker's candidate, and the epochs would collapse to single instants.
    gap = float(np.mean(work[finite])) if finite.any() else 0.0
    replay = IterationReplay(routed, work, free)
    for run in epochs(order, routed, gap):
        t = float(routed[run[0]])
        base = wait_scale * np.array([replay.waiting_at(w, t) for w in range(W)])
        problem = (own[run], base, 2.0 * wait_scale * sigma)
        if on_epoch is not None:
            on_epoch(*problem)
        _, where = optimal_assignment(*problem)
        for r, w in zip(run, where, strict=True):
            assignment[r] = w
            replay.add(r, int(w))
    return assignment
