"""A queue of Q requests through the auction on the simulator (docs/design.md §8, "auction").

All Q requests of a workload arrive at t = 0 in their arrival order. ``AuctionAdmission`` cuts
the queue into batches of n (arrival order, paying requests first), orders each with the
scheduler, and hands the batches, back to back, to one worker: the order the auctions planned.
The simulator then says when each request's first token came out, and from that:

- realised welfare: W = Σ_r b_r·x_r with x_r = (Q − pos_r)/(Q − 1), pos_r the rank of r's
  TTFT among all Q (equal TTFTs share the average rank: requests started in one iteration
  tie), as a percentage above ½Σb (``auction.realised_welfare_pct_above_half``);
- planned welfare: the same formula on the planned order of all Q (batch after batch), and the
  mean over batches of each batch's own figure (what ``run_auction`` reports for one batch);
- the cache hit rate (prompt tokens served from the KV cache / prompt tokens), mean and P99
  TTFT, and the VCG revenue (``dfs-bid`` only).

The planned order is a proxy: the engine starts several requests in one iteration, the KV cache
decides how much of each prompt is recomputed, so a request planned early may be answered late.

``max_in_prefill`` is admission's release bound (the service's queue, ``cluster.sim.admission``):
the default ``None`` (all Q) gives the worker the whole planned order at once, as an engine's
waiting queue holds it, and the worker starts requests in that order as its batch and KV memory
allow. ``1`` lets one request at a time through prefill, the next released at the previous
one's first token (the order is then kept exactly, and TTFTs never tie). The worker serves its
queue first-come (no engine priority), so what is compared is the schedulers' orders alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from auction import (
    AuctionResult,
    AuctionSettings,
    Request,
    batch_seed,
    get_scheduler,
    realised_welfare_pct_above_half,
    run_auction,
    welfare,
    welfare_pct_above_half,
)
from auction.priority import take_batch
from cluster.sim.admission import AuctionAdmission
from cluster.sim.cluster import SimCluster
from cluster.sim.profile import HardwareProfile, load_profile
from cluster.sim.records import percentile, summarize
from cluster.sim.workloads import Workload

# One GPU (one TP group) that prefills and decodes: the auction study's single worker. Every
# profile's decode model can prefill locally, so this is a valid topology for each of them.
SINGLE_WORKER = "0P/1D"


@dataclass(frozen=True)
class QueueResult:
    """One (workload, scheduler, n, seed) run of a queue of ``queue_size`` requests.

    Welfare figures are % above ½Σb (a uniformly random order). ``realised_welfare_pct`` ranks
    the requests by simulated TTFT; ``planned_welfare_pct`` takes the planned order of the whole
    queue; ``batch_planned_welfare_pct`` averages each batch's planned figure over the batches.
    """

    workload: str
    scheduler: str
    batch_size: int
    queue_size: int
    profile: str
    topology: str
    seed: int
    max_in_prefill: int | None
    realised_welfare_pct: float
    planned_welfare_pct: float
    batch_planned_welfare_pct: float
    cache_hit_rate: float
    mean_ttft_s: float
    p99_ttft_s: float
    revenue: float
    batches: int
    makespan_s: float  # simulated seconds until the last request finished

    def as_dict(self) -> dict[str, float | int | str | None]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class QueuePlan:
    """The auctions of a queue without the simulator: what ``AuctionAdmission`` plans for it.

    ``order`` lists every request id, batch after batch; ``welfare`` and
    ``welfare_pct_above_half`` are the planned figures of that whole order (as
    ``QueueResult.planned_welfare_pct``), ``batch_welfare_pct_above_half`` the mean of the
    batches' own. ``payments`` sums each user's VCG payments over the batches.
    """

    batches: tuple[AuctionResult, ...]
    order: tuple[str, ...]
    welfare: float
    welfare_pct_above_half: float
    batch_welfare_pct_above_half: float
    payments: Mapping[str, float]

    @property
    def revenue(self) -> float:
        return float(sum(self.payments.values()))


def plan_queue(
    workload: Workload, scheduler_name: str, batch_size: int, *, seed: int = 0
) -> QueuePlan:
    """Batches of ``batch_size`` cut as ``AuctionAdmission`` cuts them (paying requests first,
    then arrival order: ``batch_members``), each auctioned as it does (batch k's neutral ties
    from ``batch_seed(seed, k)``)."""
    get_scheduler(scheduler_name)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    queue = sorted(workload.requests, key=lambda r: r.arrival)
    waiting, start = list(queue), 0
    results: list[AuctionResult] = []
    while waiting:
        taken, waiting = take_batch(waiting, lambda r: r.bid, batch_size)
        batch = [
            Request(r.id, r.user, r.token_array, r.bid, arrival=start + j)
            for j, r in enumerate(taken)
        ]
        results.append(run_auction(batch, scheduler_name, seed=batch_seed(seed, len(results))))
        start += len(batch)
    order = tuple(rid for result in results for rid in result.order)
    bid_of = {r.id: r.bid for r in queue}
    bids = np.array([bid_of[rid] for rid in order], dtype=np.float64)
    planned = welfare(np.arange(bids.size), bids)
    payments: dict[str, float] = {}
    for result in results:
        for user, paid in result.payments.items():
            payments[user] = payments.get(user, 0.0) + paid
    return QueuePlan(
        batches=tuple(results),
        order=order,
        welfare=planned,
        welfare_pct_above_half=welfare_pct_above_half(planned, bids),
        batch_welfare_pct_above_half=float(np.mean([r.welfare_pct_above_half for r in results]))
        if results
        else 0.0,
        payments=payments,
    )


def simulate_queue(
    workload: Workload,
    scheduler_name: str,
    batch_size: int,
    *,
    profile: str | HardwareProfile = "h100-32b",
    topology: str = SINGLE_WORKER,
    seed: int = 0,
    max_in_prefill: int | None = None,
) -> QueueResult:
    """Put ``workload`` (Q requests, all there at t = 0) through ``scheduler_name`` in batches of
    ``batch_size`` on the simulator; see the module docstring for what is measured.

    ``seed`` seeds the simulator's jitter and the neutral ties of ``dfs-uniform`` and
    ``dfs-weight`` (batch k draws from (seed, k)): the same arguments give the same result.
    """
    get_scheduler(scheduler_name)  # an unknown name fails before the simulator starts
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not workload.requests:
        raise ValueError("the workload has no requests")
    hardware = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    queued = len(workload.requests)
    settings = AuctionSettings(
        batch_size=batch_size,
        scheduler=scheduler_name,
        batch_window_ms=0.0,  # the whole queue is there at t = 0: nothing to wait for
        queue_threshold=0,  # every request is auctioned, the first batch too
        max_in_prefill=queued if max_in_prefill is None else max_in_prefill,
        max_queue=max(queued, AuctionSettings.max_queue),
    )
    admission = AuctionAdmission(settings, seed=seed)
    # A first-come worker: the experiment compares the schedulers' orders, which the engines'
    # priority (bidders before non-payers, docs/design.md §1) would partly redo for them.
    cluster = SimCluster(hardware, topology, seed=seed, admission=admission, priority=lambda bid: 0)
    cluster.submit_many(workload.sim_requests())
    cluster.loop.run()
    records = cluster.records
    unfinished = [r.request_id for r in records if r.first_token is None]
    if unfinished:  # a prompt longer than the KV memory never starts: say so, do not hide it
        raise ValueError(
            f"{len(unfinished)} requests never started on {hardware.name} {topology} "
            f"(e.g. {unfinished[0]!r}): a prompt and its output must fit the KV memory"
        )

    index = {r.request_id: k for k, r in enumerate(records)}
    bids = np.array([r.bid for r in records], dtype=np.float64)
    ttft = np.array([r.ttft for r in records], dtype=np.float64)
    planned = np.array([index[rid] for rid in admission.planned], dtype=np.int64)
    batch_of = np.array([records[k].batch_id for k in planned], dtype=np.int64)
    batch_pcts = []
    for b in range(admission.batches):
        members = planned[batch_of == b]  # this batch's requests in its planned order
        mine = bids[members]
        batch_pcts.append(welfare_pct_above_half(welfare(np.arange(mine.size), mine), mine))
    summary = summarize(records, 0.0, float("inf"), by="arrival")
    return QueueResult(
        workload=workload.name,
        scheduler=scheduler_name,
        batch_size=batch_size,
        queue_size=len(records),
        profile=hardware.name,
        topology=str(topology),
        seed=seed,
        max_in_prefill=max_in_prefill,
        realised_welfare_pct=realised_welfare_pct_above_half(bids, ttft),
        planned_welfare_pct=welfare_pct_above_half(welfare(planned, bids), bids),
        batch_planned_welfare_pct=float(np.mean(batch_pcts)),
        cache_hit_rate=summary.cache_hit_rate,
        mean_ttft_s=float(ttft.mean()),
        p99_ttft_s=percentile(ttft, 99),
        revenue=admission.revenue,
        batches=admission.batches,
        makespan_s=max(r.finished or 0.0 for r in records),
    )
