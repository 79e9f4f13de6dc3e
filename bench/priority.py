"""Priced priority at saturation: does a bid buy latency, and what does it cost per request?

Llama-3.1-70B FP8 on simulated B200s, 1P/5D and 2P/4D, each held at saturation: a closed loop of
``saturation_concurrency`` clients, twice the population the deployment serves with full prefill
batches and no queue (C = 391 on 1P/5D, 783 on 2P/4D; see that function for why). A bid can only
buy latency where requests wait longer than one prefill iteration: below that every waiting
request joins the next batch whatever it bid (2P/4D at C = 384, 0.98x its no-queue population,
gave the top bidder 0.97x anonymous's TTFT). Three users bid on a scale two orders of magnitude
wide (``USERS``: each request's bid is the user's scale times a 1 + Pareto(1.5) draw, the
calibration workload's value model) and the rest of the traffic is anonymous (bid 0). Two arms
on the same requests (same seed):

- ``fcfs``: the engines' first-come queues, everything released at once, bids ignored;
- ``priority``: the service's admission, the very queue its auction runs
  (``auction.AdmissionQueue`` with the service's default settings: ``dfs-bid``, batches of 32
  formed within 50 ms, VCG prices split over a user's requests by bid). It cuts its batches
  paying requests first (``auction.priority.batch_members``) and releases while fewer than
  ``max_in_prefill`` released requests lack a first token, derived as the service derives it
  (``auction.prefill_slots_per_worker``: two prefill iterations' requests per prefill worker),
  so the queue beyond what the engines can start soon stays in front of the auction; the
  engines' queues are ordered by ``auction.engine_priority`` (docs/design.md §1, "Priority
  reaches the engine").

Per user, over the requests that arrived in the measured window (after the ramp): TTFT P50/P99,
mean queue wait (arrival → release), payment per request, and how many never got a first token
(their TTFT is missing from the percentiles, which flatters the class they belong to). Targets per
deployment, on the mean over seeds: the top bidder's TTFT P50 and P99 each ≤ 0.5× anonymous's
(``ttft_p50_over_anonymous``, ``ttft_p99_over_anonymous``), throughput with priority ≥ 0.95×
FCFS, and payment per request non-decreasing in the users' bid scale (a VCG price on the DFS
order may break it; the report then shows the users and numbers) with some bidder paying.

What it shows (3 seeds, 60 s). Anonymous traffic waits in front of the auction (4.8 s on average
before its release) while bidders wait about half a second: the top bidder's TTFT is 0.44×
anonymous's at P50 and 0.42× at P99 on 1P/5D (C = 391, 3.35 vs 7.54 s at P50), 0.42× and 0.44×
on 2P/4D (C = 783, 3.18 vs 7.49 s), at 1.00× and 0.99× FCFS's throughput; what the bidders gain,
anonymous traffic loses (its P50 rises from 6.2 s under FCFS to 7.5 s). Payment per request
rises with the bid (gold / silver / bronze 0.70 / 0.081 / 0.003 on 1P/5D, 0.69 / 0.12 / 0.002 on
2P/4D). Bidders all gain about alike: paying requests form batches only with each other, and
among them the oldest go first. Releasing everything at once and leaving the queue to the
engines buys the top bidder more (0.24× at P50 on 1P/5D: a late bidder joins the very next
prefill iteration instead of waiting for a slot), but the engines then hold every waiting
request, and among bidders only the engines' arrival order counts; cutting batches in plain
arrival order under the same release bound buys nothing (1.00×: a bidder waits behind every
non-paying request that arrived before it).

    .venv/bin/python -m bench.priority [--seeds 3] [--seconds 60] [--reduced] [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np

from auction import prefill_slots_per_worker
from bench.common import add_output_flags, at_least, at_most, emit, holds, ratio, verdict
from cluster.progress import progress_bar
from cluster.sim.admission import Admission, AuctionAdmission, FcfsAdmission
from cluster.sim.cluster import SimCluster, SimRequest
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.pools import Topology
from cluster.sim.profile import load_profile
from cluster.sim.records import RequestRecord, percentile
from cluster.sim.scenario import template_source

PROFILE = "b200-llama70b-fp8-tp4"
DEPLOYMENTS = ("1P/5D", "2P/4D")
OVERLOAD = 2.0  # clients per client the deployment serves with no queue (saturation_concurrency)
RAMP_S = 10.0
# user: (share of requests, bid scale). The scales span two orders of magnitude; the shares
# leave most of the load anonymous, the traffic the paying users must not wait behind.
USERS: Mapping[str, tuple[float, float]] = {
    "gold": (0.1, 10.0),
    "silver": (0.1, 1.0),
    "bronze": (0.1, 0.1),
}
TOP = "gold"
ARMS = ("fcfs", "priority")
OVER_ANONYMOUS_MAX = 0.5
THROUGHPUT_MIN = 0.95


def saturation_concurrency(deployment: str) -> int:
    """C = OVERLOAD · X · E, twice the closed-loop population the deployment serves with full
    prefill batches and no queue (Little's law), from the profile's models:

        X = n_P · B / T,    E = 1.5 · T + (L_out − 1) · d0,

    with B requests per full prefill batch (``max_batch_requests``, or fewer where
    ``max_batch_tokens`` binds first), T that batch's iteration (each request computing its
    ``input_tokens − template_tokens`` new tokens after the cached template), n_P prefill workers,
    L_out output tokens and d0 the decode iteration's fixed cost (its per-sequence and KV terms add
    under 3% at these batches). E is a request's latency when every prefill batch is full: it
    arrives mid-iteration, waits half of one, then rides a whole one. Below X · E every waiting
    request joins the next batch, so there is no order to sell; at twice it, about half the
    clients wait for a later batch, the same overload on both deployments."""
    profile = load_profile(PROFILE)
    batch, iteration = full_prefill_batch()
    population = (Topology.parse(deployment).prefill * batch / iteration) * (
        1.5 * iteration + (profile.workload.output_tokens - 1) * profile.decode.d0_s
    )
    return round(OVERLOAD * population)


def full_prefill_batch() -> tuple[int, float]:
    """(B, T): the requests of one full prefill batch of the workload (``max_batch_requests``,
    or fewer where ``max_batch_tokens`` binds first) and that iteration's seconds, each request
    computing its ``input_tokens − template_tokens`` new tokens after the cached template."""
    profile = load_profile(PROFILE)
    w, pm = profile.workload, profile.prefill
    new = w.input_tokens - w.template_tokens
    batch = min(pm.max_batch_requests, pm.max_batch_tokens // new)
    return batch, pm.iteration_s([(new, w.template_tokens)] * batch)


class ScaledBids:
    """The calibration workload's requests with each bidder's bid scaled by its ``USERS`` scale."""

    def __init__(self, seed: int) -> None:
        profile = load_profile(PROFILE)
        self._source = template_source(profile, seed, {u: s for u, (s, _) in USERS.items()})

    def __call__(self) -> SimRequest:
        request = self._source()
        scale = USERS[request.user][1] if request.user in USERS else 0.0
        return dataclasses.replace(request, bid=request.bid * scale)


def one_run(deployment: str, arm: str, seed: int, seconds: float) -> list[RequestRecord]:
    """The records of one closed-loop run of ``arm`` (``fcfs`` or ``priority``)."""
    admission: Admission
    if arm == "priority":
        per_worker = prefill_slots_per_worker(load_profile(PROFILE).prefill.max_batch_requests)
        admission = AuctionAdmission(seed=seed, slots_per_prefill_worker=per_worker)
        cluster = SimCluster(load_profile(PROFILE), deployment, seed=seed, admission=admission)
    else:
        admission = FcfsAdmission()
        cluster = SimCluster(
            load_profile(PROFILE), deployment, seed=seed, admission=admission,
            priority=lambda bid: 0,
        )  # fmt: skip
    load = ClosedLoop(
        cluster, ScaledBids(seed), [Phase(seconds, saturation_concurrency(deployment), ramp=RAMP_S)]
    )
    cluster.loop.run(load.end)
    return cluster.records


def user_rows(records: Sequence[RequestRecord], start: float, end: float) -> dict[str, Any]:
    """Per user, over the requests that arrived in [start, end)."""
    rows: dict[str, Any] = {}
    for user in ("anonymous", *USERS):
        mine = [r for r in records if r.user == user and start <= r.arrival < end]
        ttft = [r.ttft for r in mine if r.ttft is not None]
        waits = [r.queue_wait for r in mine if r.queue_wait is not None]
        rows[user] = {
            "requests": len(mine),
            "never_started": len(mine) - len(ttft),
            "mean_bid": round(float(np.mean([r.bid for r in mine])), 4) if mine else None,
            "ttft_p50_s": round(percentile(ttft, 50), 4),
            "ttft_p99_s": round(percentile(ttft, 99), 4),
            "queue_wait_mean_s": round(float(np.mean(waits)), 4) if waits else None,
            "payment_per_request": round(sum(r.payment for r in mine) / len(mine), 6)
            if mine
            else None,
        }
    return rows


def throughput(records: Sequence[RequestRecord], start: float, end: float) -> float:
    return sum(r.finished is not None and start <= r.finished < end for r in records) / (
        end - start
    )


def measured_window(seconds: float) -> tuple[float, float]:
    """[start, end): the hold after the ramp and as long again for the queue to form."""
    return 1.5 * RAMP_S, seconds


def arm_figures(deployment: str, arm: str, seed: int, seconds: float) -> dict[str, Any]:
    """One run's throughput and per-user figures (``disaggctl experiment priority``'s job)."""
    start, end = measured_window(seconds)
    records = one_run(deployment, arm, seed, seconds)
    return {
        "throughput_rps": round(throughput(records, start, end), 3),
        "users": user_rows(records, start, end),
    }


def deployment_report(
    deployment: str, seeds: Sequence[int], seconds: float, bar: Any = None
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        arms = {}
        for arm in ARMS:
            arms[arm] = arm_figures(deployment, arm, seed, seconds)
            if bar is not None:
                bar.update(1)
        runs.append({"seed": seed, **arms})
    return {"deployment": deployment, "concurrency": saturation_concurrency(deployment),
            "window_s": list(measured_window(seconds)), "runs": runs,
            "mean": mean_figures(runs)}  # fmt: skip


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and np.isfinite(v)]
    return round(statistics.fmean(present), 4) if present else None


def mean_figures(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means over seeds of the judged figures, per arm and user."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        users = {
            user: {
                key: _mean([run[arm]["users"][user][key] for run in runs])
                for key in ("ttft_p50_s", "ttft_p99_s", "queue_wait_mean_s", "payment_per_request")
            }
            for user in ("anonymous", *USERS)
        }
        out[arm] = {
            "throughput_rps": _mean([r[arm]["throughput_rps"] for r in runs]),
            "users": users,
        }
    prio = out["priority"]["users"]
    out["ttft_p50_over_anonymous"] = ratio(prio[TOP]["ttft_p50_s"], prio["anonymous"]["ttft_p50_s"])
    out["ttft_p99_over_anonymous"] = ratio(prio[TOP]["ttft_p99_s"], prio["anonymous"]["ttft_p99_s"])
    out["throughput_over_fcfs"] = ratio(
        out["priority"]["throughput_rps"], out["fcfs"]["throughput_rps"]
    )
    return out


def payment_exceptions(users: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pairs of bidders, by bid scale, where the higher bidder paid less per request."""
    ranked = sorted(USERS, key=lambda u: USERS[u][1])
    out = []
    for low, high in itertools.pairwise(ranked):
        lo, hi = users[low]["payment_per_request"], users[high]["payment_per_request"]
        if lo is not None and hi is not None and hi < lo:
            out.append({"lower_bidder": low, "pays": lo, "higher_bidder": high, "pays_only": hi})
    return out


def judge(report: Mapping[str, Any]) -> dict[str, Any]:
    targets = {}
    for dep in report["deployments"]:
        name, mean = dep["deployment"], dep["mean"]
        targets[f"{name} ttft_p50_over_anonymous"] = at_most(
            mean["ttft_p50_over_anonymous"], OVER_ANONYMOUS_MAX, user=TOP
        )
        targets[f"{name} ttft_p99_over_anonymous"] = at_most(
            mean["ttft_p99_over_anonymous"], OVER_ANONYMOUS_MAX, user=TOP
        )
        targets[f"{name} throughput_over_fcfs"] = at_least(
            mean["throughput_over_fcfs"], THROUGHPUT_MIN
        )
        users = mean["priority"]["users"]
        exceptions = payment_exceptions(users)
        # All-zero payments are non-decreasing too, and say only that nothing was priced.
        priced = any((users[u]["payment_per_request"] or 0.0) > 0 for u in USERS)
        targets[f"{name} payment_per_request_non_decreasing_in_bid"] = holds(
            priced and not exceptions,
            "some bidder pays, and payment per request rises with the bid scale",
            exceptions=exceptions, priced=priced,
        )  # fmt: skip
    return verdict(targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--reduced", action="store_true", help="what make test runs: 1P/5D, one seed, 30 s"
    )
    add_output_flags(parser)
    args = parser.parse_args(argv)
    deployments = DEPLOYMENTS[:1] if args.reduced else DEPLOYMENTS
    seeds = range(1 if args.reduced else args.seeds)
    seconds = 30.0 if args.reduced else args.seconds
    if seconds <= 2 * RAMP_S:
        parser.error(f"--seconds must exceed {2 * RAMP_S:g} (the ramp and the warm-up)")
    bar = progress_bar(
        None, total=len(deployments) * len(seeds) * 2, progress=args.progress, quiet=args.quiet,
        desc="priority bench",
    )  # fmt: skip
    reports = [deployment_report(d, seeds, seconds, bar) for d in deployments]
    bar.close()
    report = {
        "profile": PROFILE, "overload": OVERLOAD, "seconds": seconds,
        "reduced": args.reduced, "users": {u: {"share": s, "bid_scale": b}
                                           for u, (s, b) in USERS.items()},
        "deployments": reports,
    }  # fmt: skip
    return emit("priority", judge(report), report, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
