"""The whole system on the simulator: Llama-3.1-70B on 1P/5D through a ramp across the knee and
a spike, the routers under the adaptive controller with both levers (τ/ω, and a P/D re-split when
saturation is capacity), the live PoA estimate, and the auction ordering queued requests when
they queue (a few bidding users, the rest anonymous). Each re-split step is printed as it
happens and marked on the timeline.

A status line follows the run (regime, τ, ω, poa_hat, TTFT P99, queue depth: on the progress bar
on a terminal, every 10 simulated seconds otherwise, never with ``quiet``); it ends with a table
per phase, priced priority per user class, and a PNG timeline.

A Price of Anarchy below 1 is impossible (poa_hat and its two factors are each a realised or
modelled cost over an optimum, as telemetry.metrics counts them), so one is an estimator defect
(docs/design.md §3, property 1). It is printed as measured, unclamped, followed by ``†`` and a
footnote; each phase in ``system.json`` counts the windows (ticks) that read below 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from auction import prefill_slots_per_worker
from cluster.progress import progress_bar
from cluster.sim.admission import AuctionAdmission
from cluster.sim.control import TickSample
from cluster.sim.loadgen import Phase
from cluster.sim.profile import load_profile
from cluster.sim.records import percentile
from cluster.sim.scenario import (
    NamedPhase,
    ScenarioResult,
    calm_baseline_p99,
    run_scenario,
    template_source,
)
from controller.detector import Regime, Thresholds
from controller.resplit import ResplitSettings
from disaggctl.jsonout import strict_dumps
from disaggctl.options import writable_dir

PROFILE, TOPOLOGY = "b200-llama70b-fp8-tp4", "1P/5D"
PHASES = (
    NamedPhase("calm", Phase(20.0, 48, ramp=5.0)),
    NamedPhase("ramp", Phase(40.0, 192, ramp=40.0)),
    # Long enough for a re-split to finish (dwell + drain + the profile's 30 s role switch).
    NamedPhase("saturated", Phase(50.0, 192)),
    NamedPhase("recovery", Phase(45.0, 48, ramp=2.0)),
    NamedPhase("spike", Phase(8.0, 288, ramp=1.0)),
    NamedPhase("after", Phase(45.0, 48, ramp=1.0)),
)
BIDDERS = {"gold": 0.05, "silver": 0.05, "bronze": 0.05}
# Answers end at their end-of-sequence token, so their lengths vary: each output is drawn
# uniformly from ±50% of the profile's mean (cluster/sim/template_source.py). With every output
# the same length, clients that a spike released together would finish and resend in step for
# ever: a convoy that real traffic does not keep (docs/design.md §4).
OUTPUT_RANGE_RATIO = 0.5
STATUS_EVERY_S = 10  # without a bar, one status line per this many simulated seconds

POA_MARK = "†"
POA_FACTORS = ("poa_hat", "poa_routing", "poa_capacity")  # each >= 1 by definition


def below_one(value: float) -> bool:
    """A PoA that reads below 1 (beyond float rounding); NaN, an empty window, is not flagged."""
    return value < 1.0 - 1e-9


def fmt_poa(value: float, spec: str) -> str:
    """``value`` formatted, then ``†`` when it is below 1, else a space (columns stay aligned)."""
    return f"{value:{spec}}{POA_MARK if below_one(value) else ' '}"


def windows_below_one(ticks: Sequence[TickSample]) -> dict[str, int]:
    """How many estimator windows read a PoA below 1: any factor, then each factor."""
    counts = {f: sum(below_one(getattr(s, f)) for s in ticks) for f in POA_FACTORS}
    either = sum(any(below_one(getattr(s, f)) for f in POA_FACTORS) for s in ticks)
    return {"windows": either, "of_windows": len(ticks), **counts}


def phase_ticks(result: ScenarioResult, row: dict[str, Any]) -> list[TickSample]:
    return [s for s in result.timeline if row["start_s"] < s.t <= row["end_s"]]


def poa_footnote(counts: dict[str, int]) -> str:
    factors = ", ".join(f"{f} {counts[f]}" for f in POA_FACTORS)
    return (
        f"{POA_MARK} below 1: realised over optimal cannot be < 1, an estimator defect "
        f"(docs/design.md §3),\n  shown unclamped; {counts['windows']} of {counts['of_windows']} "
        f"windows read below 1 ({factors})."
    )


def status_line(sample: TickSample) -> str:
    p99 = sample.ttft_p99_window_s
    return (
        f"{Regime(sample.regime).label:<10} τ={sample.tau:.1f} ω={sample.omega:.1f} "
        f"poa_hat={fmt_poa(sample.poa_hat, '6.2f')} "
        f"ttft_p99={'-' if p99 is None else f'{p99:.2f}s'} queue={sample.queue_depth}"
    )


def run(
    out: Path, seed: int = 0, *, progress: bool | None = None, quiet: bool = False
) -> ScenarioResult:
    """Run the scenario, print its tables, write ``system.json`` and ``timeline.png`` to ``out``
    (created and probed first, so an unwritable folder fails before the simulation)."""
    out = writable_dir(Path(out))
    profile = load_profile(PROFILE)
    calm = template_source(profile, seed, output_range_ratio=OUTPUT_RANGE_RATIO)
    thresholds = Thresholds.calibrated(calm_baseline_p99(profile, TOPOLOGY, seed=seed, source=calm))
    total = sum(p.phase.duration for p in PHASES)
    bar = progress_bar(
        total=int(total), desc="1P/5D simulated s", unit="s", progress=progress, quiet=quiet
    )

    def status(sample: TickSample) -> None:
        bar.update(1)
        if not bar.disable:
            bar.set_postfix_str(status_line(sample))
        elif not quiet and round(sample.t) % STATUS_EVERY_S == 0:
            print(f"t={sample.t:5.0f}s {status_line(sample)}", file=sys.stderr)

    # The service's admission with its defaults, its bound derived as the service derives it.
    per_worker = prefill_slots_per_worker(profile.prefill.max_batch_requests)
    admission = AuctionAdmission(seed=seed, slots_per_prefill_worker=per_worker)
    source = template_source(profile, seed, bidders=BIDDERS, output_range_ratio=OUTPUT_RANGE_RATIO)
    result = run_scenario(
        profile,
        TOPOLOGY,
        PHASES,
        adaptive=True,
        thresholds=thresholds,
        seed=seed,
        admission=admission,
        source=source,
        on_tick=status,
        resplit=ResplitSettings(),
    )
    bar.close()
    out.mkdir(parents=True, exist_ok=True)
    plot_timeline(result, thresholds, out / "timeline.png")
    below = windows_below_one(result.timeline)
    # The counts go with each phase: system.json's top-level keys are a contract.
    phases = [
        dict(row, poa_below_one=windows_below_one(phase_ticks(result, row)))
        for row in result.phases
    ]
    (out / "system.json").write_text(
        strict_dumps(
            {
                "profile": PROFILE,
                "topology": TOPOLOGY,
                "thresholds_s": [thresholds.theta1, thresholds.theta2],
                "phases": phases,
                "regime_changes": [
                    {
                        "t": c.t,
                        "regime": c.regime.label,
                        "tau": c.tau,
                        "omega": c.omega,
                        "version": c.version,
                    }
                    for c in result.changes
                ],
                "priority": priority_by_class(result),
                "auction": {"batches": admission.batches, "revenue": admission.revenue},
                "capacity_advice": [
                    {
                        "t": a.t,
                        "poa_routing": a.poa_routing,
                        "poa_capacity": a.poa_capacity,
                        "gpus_prefill": a.recommendation.optimum.gpus_p,
                        "gpus_decode": a.recommendation.optimum.gpus_d,
                    }
                    for a in result.advice
                ],
                "resplits": [asdict(d) for d in result.resplits],
                "pool_changes": [asdict(c) for c in result.pool_changes],
                "timeline": [asdict(s) for s in result.timeline],
            },
            indent=1,
        )
    )
    print(format_phases(result))
    if below["windows"] or any(below_one(row[f]) for row in result.phases for f in POA_FACTORS):
        print(poa_footnote(below))
    print()
    print(format_resplits(result))
    print()
    print(format_priority(priority_by_class(result), admission.batches, admission.revenue))
    return result


def format_resplits(result: ScenarioResult) -> str:
    """The re-split lever's decisions and each step of each move, or a line saying none came."""
    if not result.resplits:
        return (
            "re-split: none (saturation never stayed capacity-bound long enough, or no "
            "overload outlasted the role switch a move would cost)"
        )
    lines = ["re-splits (the controller's second lever):"]
    for d in result.resplits:
        moved = "one worker" if d.workers == 1 else f"{d.workers} workers"
        lines.append(f"  t={d.t:5.0f}s {d.before} → {moved} to {d.to_role}: {d.reason}")
    for c in result.pool_changes:
        lines.append(
            f"  t={c.t:5.0f}s {c.action:<13} worker {c.worker} ({c.from_role} → {c.to_role}) "
            f"pools {c.prefill}P/{c.decode}D"
        )
    return "\n".join(lines)


def priority_by_class(result: ScenarioResult) -> list[dict[str, Any]]:
    """TTFT and admission wait per user class, for requests that waited in the auction."""
    rows = []
    for user in ("anonymous", *BIDDERS):
        mine = [r for r in result.records if r.user == user and r.ttft is not None]
        auctioned = [r for r in mine if r.batch_id is not None and (r.queue_wait or 0) > 0]
        ttfts = [r.ttft for r in auctioned if r.ttft is not None]  # all of them: see `mine`
        rows.append(
            {
                "user": user,
                "requests": len(mine),
                "auctioned": len(auctioned),
                "ttft_p50_s": round(percentile(ttfts, 50), 3),
                "ttft_p99_s": round(percentile(ttfts, 99), 3),
                "queue_wait_mean_s": round(
                    float(np.mean([r.queue_wait for r in auctioned]))
                    if auctioned
                    else float("nan"),
                    3,
                ),
                "paid": round(sum(r.payment for r in mine), 3),
                # Per auctioned request: the price of a position, which only they were sold.
                "paid_per_auctioned": round(sum(r.payment for r in auctioned) / len(auctioned), 4)
                if auctioned
                else None,
            }
        )
    return rows


def format_phases(result: ScenarioResult) -> str:
    header = (
        f"{'phase':<10} {'C':>4} {'req/s':>7} {'TTFT P99':>9} {'ITL P99':>8} {'ends in':<10} "
        f"{'poa_hat':>8}  {'routing':>8}  {'capacity':>9}"
    )
    lines = [header, "-" * len(header)]
    for named, row in zip(PHASES, result.phases, strict=True):
        ticks = phase_ticks(result, row)
        regime = Regime(ticks[-1].regime).label if ticks else "-"  # where the phase ends
        lines.append(
            f"{row['phase']:<10} {named.phase.concurrency:>4} {row['throughput_rps']:>7.1f} "
            f"{row['ttft_p99_s']:>8.2f}s {1e3 * row['itl_p99_s']:>6.1f}ms {regime:<10} "
            f"{fmt_poa(row['poa_hat'], '>8.2f')} {fmt_poa(row['poa_routing'], '>8.3f')} "
            f"{fmt_poa(row['poa_capacity'], '>9.2f')}".rstrip()  # no trailing mark slot
        )
    return "\n".join(lines)


def format_priority(rows: Sequence[dict[str, Any]], batches: int, revenue: float) -> str:
    header = (
        f"{'user':<10} {'requests':>8} {'auctioned':>9} {'TTFT P50':>9} {'TTFT P99':>9} "
        f"{'wait':>7} {'paid':>8} {'per req':>8}"
    )
    lines = [
        f"priced priority at saturation: {batches} auctioned batches, revenue {revenue:.2f}",
        header,
        "-" * len(header),
    ]
    for r in rows:
        per = r["paid_per_auctioned"]
        lines.append(
            f"{r['user']:<10} {r['requests']:>8} {r['auctioned']:>9} "
            f"{r['ttft_p50_s']:>8.2f}s {r['ttft_p99_s']:>8.2f}s "
            f"{r['queue_wait_mean_s']:>6.2f}s {r['paid']:>8.2f} "
            + ("       -" if per is None else f"{per:>8.3f}")
        )
    return "\n".join(lines)


def plot_timeline(result: ScenarioResult, thresholds: Thresholds, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result.timeline
    t = [s.t for s in tl]
    fig, axes = plt.subplots(5, 1, figsize=(11, 12), sharex=True)
    axes[0].plot(t, [s.in_flight for s in tl], label="requests in flight")
    axes[0].plot(t, [s.queue_depth for s in tl], label="queued (admission + workers)")
    axes[0].set_ylabel("requests")
    window = [np.nan if s.ttft_p99_window_s is None else s.ttft_p99_window_s for s in tl]
    smooth = [np.nan if s.ttft_p99_smoothed_s is None else s.ttft_p99_smoothed_s for s in tl]
    axes[1].semilogy(t, window, label="TTFT P99 (10 s window)", alpha=0.6)
    axes[1].semilogy(t, smooth, label="smoothed (EMA)")
    for theta, name in ((thresholds.theta1, "θ1"), (thresholds.theta2, "θ2")):
        axes[1].axhline(theta, ls="--", lw=0.8, color="grey")
        axes[1].text(t[0], theta, f" {name}", va="bottom", fontsize=8)
    axes[1].set_ylabel("seconds")
    axes[2].step(t, [s.regime for s in tl], where="post", label="regime (0 below, 2 saturated)")
    axes[2].step(t, [s.tau for s in tl], where="post", label="τ")
    axes[2].step(t, [s.omega for s in tl], where="post", label="ω")
    axes[3].semilogy(t, [s.poa_hat for s in tl], label="poa_hat")
    axes[3].semilogy(t, [s.poa_routing for s in tl], label="poa_routing")
    axes[3].semilogy(t, [s.poa_capacity for s in tl], label="poa_capacity")
    axes[4].step(t, [s.prefill_workers for s in tl], where="post", label="prefill workers")
    axes[4].step(t, [s.decode_workers for s in tl], where="post", label="decode workers")
    axes[4].set_ylabel("workers")
    for c in result.pool_changes:
        axes[4].axvline(c.t, color="red", lw=0.6, alpha=0.5)
        axes[4].text(c.t, 0.2, f" {c.action}", rotation=90, fontsize=7, color="red")
    axes[4].set_xlabel("simulated seconds")
    start = 0.0
    for named in PHASES:
        for ax in axes:
            ax.axvline(start, color="black", lw=0.4, alpha=0.4)
        axes[0].text(start + 1, axes[0].get_ylim()[1] * 0.9, named.name, fontsize=8)
        start += named.phase.duration
    for ax in axes:
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle("disaggctl on a simulated 70B 1P/5D cluster: adaptive routing, re-split, live PoA")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
