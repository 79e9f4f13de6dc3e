"""``disaggctl demo``: the auction on generated workloads, every scheduler, one table and a plot.

For each workload shape (stars, chains, short and long trees) a batch of n requests from ``users``
bidders is ordered by each scheduler, then served on the simulator (one h100-32b worker, all n
requests there at t = 0: ``cluster.sim.auction_queue``). The table shows what each order buys:
the planned welfare (the formula on the auction's order) beside the realised welfare (the same
formula on the order of the simulated TTFTs), both as % above a random order, the simulator's
cache hit rate (prompt tokens served from its KV cache, whose size the profile sets), mean TTFT,
VCG revenue and the time to decide (docs/design.md §1, §8).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from auction import SCHEDULERS
from cluster.models import validate_model
from cluster.progress import progress_bar
from cluster.sim.auction_queue import plan_queue, simulate_queue
from cluster.sim.workloads import Workload, make_workload
from disaggctl.jsonout import strict_dumps
from disaggctl.options import MAX_N, DemoOptions

DEMO_WORKLOADS = ("mixshare-50", "mixshare-90", "chains", "trees-short", "trees-long")


@dataclass(frozen=True)
class DemoRow:
    workload: str
    scheduler: str
    n: int
    shared_fraction: float
    welfare_pct_above_half: float  # planned: the auction's order
    realised_welfare_pct_above_half: float  # the simulated TTFTs' order
    cache_hit_rate: float
    mean_ttft_s: float
    revenue: float
    decide_ms: float


def run_demo(
    workloads: Sequence[str] = DEMO_WORKLOADS,
    n: int = 1024,
    users: int = 128,
    seed: int = 0,
    *,
    progress: bool | None = None,
    quiet: bool = False,
) -> list[DemoRow]:
    if not 1 <= n <= MAX_N:  # 0: no tokens to share, the fractions below would be 0/0
        raise ValueError(f"n must be between 1 and {MAX_N}, got {n}")
    rows = []
    steps = [(w, s) for w in workloads for s in SCHEDULERS]
    batches: dict[str, Workload] = {}
    for workload, scheduler in progress_bar(
        steps, desc="auction demo", progress=progress, quiet=quiet
    ):
        if workload not in batches:  # one batch alive at a time, not all five at once
            batches = {workload: make_workload(workload, n, users=users, seed=seed)}
        batch = batches[workload]
        start = time.perf_counter()
        plan = plan_queue(batch, scheduler, n, seed=seed)
        elapsed = time.perf_counter() - start
        served = simulate_queue(batch, scheduler, n, seed=seed)
        rows.append(
            DemoRow(
                workload=workload,
                scheduler=scheduler,
                n=len(batch.requests),
                shared_fraction=batch.shared_fraction,
                welfare_pct_above_half=plan.welfare_pct_above_half,
                realised_welfare_pct_above_half=served.realised_welfare_pct,
                cache_hit_rate=served.cache_hit_rate,
                mean_ttft_s=served.mean_ttft_s,
                revenue=plan.revenue,
                decide_ms=1e3 * elapsed,
            )
        )
    return rows


def format_table(rows: Sequence[DemoRow]) -> str:
    header = (
        f"{'workload':<13} {'scheduler':<12} {'shared':>7} {'planned':>8} {'realised':>9} "
        f"{'hit':>7} {'ttft_s':>8} {'revenue':>9} {'ms':>8}"
    )
    lines = [header, "-" * len(header)]
    previous = None
    for r in rows:
        if previous is not None and r.workload != previous:
            lines.append("")
        previous = r.workload
        lines.append(
            f"{r.workload:<13} {r.scheduler:<12} {r.shared_fraction:>7.1%} "
            f"{r.welfare_pct_above_half:>8.2f} {r.realised_welfare_pct_above_half:>9.2f} "
            f"{r.cache_hit_rate:>7.1%} {r.mean_ttft_s:>8.2f} {r.revenue:>9.2f} {r.decide_ms:>8.1f}"
        )
    return "\n".join(lines)


def plot(rows: Sequence[DemoRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    schedulers = list(dict.fromkeys(r.scheduler for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    width = 0.8 / len(schedulers)
    panels: tuple[tuple[str, Callable[[DemoRow], float]], ...] = (
        ("planned welfare above a random order (%)", lambda r: r.welfare_pct_above_half),
        ("realised welfare (TTFT order) above random (%)",
         lambda r: r.realised_welfare_pct_above_half),
        ("cache hit rate on the simulator (%)", lambda r: 100 * r.cache_hit_rate),
    )  # fmt: skip
    for k, scheduler in enumerate(schedulers):
        mine = {r.workload: r for r in rows if r.scheduler == scheduler}
        xs = [i + (k - (len(schedulers) - 1) / 2) * width for i in range(len(workloads))]
        for ax, (_, value) in zip(axes, panels, strict=True):
            ax.bar(xs, [value(mine[w]) for w in workloads], width, label=scheduler)
    for ax, (title, _) in zip(axes, panels, strict=True):
        ax.set_xticks(range(len(workloads)), workloads, rotation=15)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(schedulers), frameon=False)
    fig.suptitle(f"Inference auction on n = {rows[0].n} queued requests")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(
    out: Path,
    n: int,
    users: int,
    seed: int,
    *,
    progress: bool | None = None,
    quiet: bool = False,
) -> int:
    """Both parts; every argument is checked (and ``out`` created and probed) before any work,
    so a bad value fails in milliseconds, not after the run (:class:`ConfigError` names it)."""
    from disaggctl.system_demo import run as run_system

    values = dict(out=out, n=n, users=users, seed=seed, progress=progress, quiet=quiet)
    o = validate_model(DemoOptions, values, "disaggctl demo")
    out = o.out
    print("== The whole system: simulated 70B 1P/5D, adaptive routing, live PoA, auction ==\n")
    run_system(out, seed=o.seed, progress=o.progress, quiet=o.quiet)
    print(f"\nwrote {out / 'system.json'} and {out / 'timeline.png'}\n")
    print("== The auction on queued batches: every scheduler, every workload shape ==\n")
    rows = run_demo(n=o.n, users=o.users, seed=o.seed, progress=o.progress, quiet=o.quiet)
    print(format_table(rows))
    out.mkdir(parents=True, exist_ok=True)
    (out / "auction.json").write_text(strict_dumps([asdict(r) for r in rows], indent=2))
    plot(rows, out / "auction.png")
    print(
        "\nplanned / realised: welfare % above a random order (½Σb) on the auction's order / on "
        "the order of the simulated TTFTs (one h100-32b worker); hit: prompt tokens served from "
        f"its KV cache.\nwrote {out / 'auction.json'} and {out / 'auction.png'}"
    )
    return 0
