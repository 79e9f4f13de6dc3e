"""``priority``: what a bid buys at saturation, on the simulator (docs/design.md §1, "Priority
reaches the engine"; the runs are ``bench.priority``'s).

Llama-3.1-70B FP8, 1P/5D and 2P/4D, each held at saturation: a closed loop of twice the clients
it serves with full prefill batches and no queue (``bench.priority.saturation_concurrency``).
Three users bid on scales two orders of magnitude apart (gold 10, silver 1, bronze 0.1, each
request's bid the scale times a 1 + Pareto(1.5) draw) and the rest of the traffic is anonymous.
Two arms on the same requests: ``fcfs`` (first-come engines, bids ignored) and ``priority`` (the
service's admission: batches cut paying requests first, VCG prices, released while fewer than one
prefill iteration's requests wait at the engines, whose queues put bidders before non-payers).
Per user: TTFT P50 and P99 and payment per request, over the requests that arrived in the hold.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

from disaggctl.experiment import plots
from disaggctl.experiment.base import Plan, Settings
from disaggctl.experiment.fanout import Job, bench_module
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, summarise

NAME = "priority"
TITLE = "priority: what a bid buys at saturation"
# Per simulated second and 100 clients (a run's events grow with its clients): 0.009 s per
# simulated second measured at C = 384 (runner.estimate).
SECONDS_PER_UNIT = 0.0040

DEPLOYMENTS = ("1P/5D", "2P/4D")
USERS = ("gold", "silver", "bronze", "anonymous")  # by bid scale, highest first
KEYS = ("ttft_p50_s", "ttft_p99_s", "queue_wait_mean_s", "payment_per_request")


def plan(settings: Settings) -> Plan:
    B = bench_module("priority")
    seconds = 30.0 if settings.quick else 60.0
    setup = {
        "profile": B.PROFILE,
        "deployments": list(DEPLOYMENTS),
        "concurrency C": {d: B.saturation_concurrency(d) for d in DEPLOYMENTS},
        "run (s, the first 15 s unmeasured)": seconds,
        "bid scales": [
            f"{u} {scale:g} ({share:.0%} of requests)" for u, (share, scale) in B.USERS.items()
        ],
        "arms": list(B.ARMS),
        "trials (seeds)": list(settings.seeds),
    }
    jobs = [
        Job(
            "bench.priority:arm_figures",
            {"deployment": d, "arm": arm, "seed": seed, "seconds": seconds},
            units=seconds * B.saturation_concurrency(d) / 100,
        )
        for d in DEPLOYMENTS
        for arm in B.ARMS
        for seed in settings.seeds
    ]
    return Plan(setup, jobs)


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for job, res in zip(plan.jobs, results, strict=True):
        groups.setdefault((job.kwargs["deployment"], job.kwargs["arm"]), []).append(res)
    rows: list[dict[str, Any]] = []
    for (deployment, arm), runs in groups.items():
        through = summarise(runs, ("throughput_rps",))
        for user in USERS:
            per_user = [run["users"][user] for run in runs]
            rows.append({"deployment": deployment, "arm": arm, "user": user,
                         **summarise(per_user, KEYS),
                         "throughput_rps": through["throughput_rps"]})  # fmt: skip
    return {"rows": rows}


def _row(data: dict[str, Any], deployment: str, arm: str, user: str) -> dict[str, Any]:
    return next(
        r for r in data["rows"]
        if (r["deployment"], r["arm"], r["user"]) == (deployment, arm, user)
    )  # fmt: skip


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def describe(data: dict[str, Any]) -> str:
    """What the top bidder bought on each deployment, computed from the rows."""
    parts = []
    for d in DEPLOYMENTS:
        gold, anon = _row(data, d, "priority", "gold"), _row(data, d, "priority", "anonymous")
        p50 = _over(gold["ttft_p50_s"], anon["ttft_p50_s"])
        p99 = _over(gold["ttft_p99_s"], anon["ttft_p99_s"])
        fcfs = _row(data, d, "fcfs", "anonymous")["throughput_rps"]
        cost = _over(gold["throughput_rps"], fcfs)
        met = p50 is not None and p99 is not None and max(p50, p99) <= 0.5
        parts.append(
            f"on {d} the top bidder's TTFT is {fmt(p50)}× anonymous's at P50 and {fmt(p99)}× at "
            f"P99 ({'within' if met else 'short of'} the 0.5× target), at {fmt(cost)}× FCFS's "
            f"throughput, paying {fmt(gold['payment_per_request'])} per request"
        )
    return (
        "With priority, " + "; ".join(parts) + ". A bid buys latency only where requests queue "
        "(in front of the auction or in an engine): where every waiting request joins the next "
        "batch there is no order to buy (docs/design.md §1)."
    )


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    write_csv(folder / "priority_rows.csv", data["rows"])
    table = [
        (r["deployment"], r["arm"], r["user"], stat_cell(r, "ttft_p50_s"),
         stat_cell(r, "ttft_p99_s"), stat_cell(r, "queue_wait_mean_s"),
         stat_cell(r, "payment_per_request"), stat_cell(r, "throughput_rps"))
        for r in data["rows"]
    ]  # fmt: skip
    header = ("deployment", "arm", "user", "TTFT P50 s", "TTFT P99 s", "queue wait s",
              "paid per request", "req/s (arm)")  # fmt: skip
    section.text("Per user, mean ± 1 s.e. over the trials:\n\n" + markdown_table(header, table))
    plot_ttft(data, folder / "priority_ttft.png")
    section.figure("priority_ttft.png", "TTFT per user and arm", describe(data))
    plot_payments(data, folder / "priority_payments.png")
    section.figure(
        "priority_payments.png",
        "Payment per request against the bid scale",
        "The VCG price per request, by user, in the priority arm (FCFS charges nothing). "
        + describe_payments(data),
    )


def describe_payments(data: dict[str, Any]) -> str:
    out = []
    for d in DEPLOYMENTS:
        paid = [_row(data, d, "priority", u)["payment_per_request"] for u in USERS[:3]]
        rising = all(a is not None and b is not None and a >= b for a, b in pairwise(paid))
        shown = " / ".join(fmt(p) for p in paid)
        out.append(f"{d}: {shown} (gold / silver / bronze; "
                   f"{'rising' if rising else 'not rising'} with the bid)")  # fmt: skip
    return "; ".join(out) + "."


def plot_ttft(data: dict[str, Any], path: Path) -> None:
    fig, axes = plots.plt.subplots(1, len(DEPLOYMENTS), figsize=(10, 3.6), sharey=False)
    width = 0.2
    for ax, d in zip(axes, DEPLOYMENTS, strict=True):
        for k, (arm, q) in enumerate(
            [("fcfs", "p50"), ("priority", "p50"), ("fcfs", "p99"), ("priority", "p99")]
        ):
            rows = [_row(data, d, arm, u) for u in USERS]
            xs = [i + (k - 1.5) * width for i in range(len(USERS))]
            ax.bar(xs, plots.values(rows, f"ttft_{q}_s"), width, label=f"{arm} {q.upper()}",
                   hatch="//" if q == "p99" else None, alpha=0.85)  # fmt: skip
        ax.set_xticks(range(len(USERS)), USERS)
        ax.set_title(f"70B {d}, C = {bench_module('priority').saturation_concurrency(d)}")
        ax.set_ylabel("TTFT (s)")
    axes[0].legend(fontsize=7)
    plots.save(fig, path)


def plot_payments(data: dict[str, Any], path: Path) -> None:
    bidders = bench_module("priority").USERS
    fig, ax = plots.plt.subplots(figsize=(5, 3.6))
    scales = [bidders[u][1] for u in USERS[:3]]
    for d in DEPLOYMENTS:
        rows = [_row(data, d, "priority", u) for u in USERS[:3]]
        plots.errorbar(ax, scales, rows, "payment_per_request", label=d)
    ax.set_xscale("log")
    ax.set_xlabel("bid scale (gold 10, silver 1, bronze 0.1)")
    ax.set_ylabel("payment per request")
    ax.legend(fontsize=8)
    plots.save(fig, path)
