"""``auction``: the schedulers on a simulated queue, welfare on the realised order (§1, §8).

A queue of Q requests of one workload, all there at t = 0, cut into batches of n in arrival
order; each batch is ordered by a scheduler (and priced by VCG for ``dfs-bid``) and the batches
are served back to back by one ``h100-32b`` worker (23k tokens of KV cache) that prefills and
decodes (``cluster.sim.auction_queue.simulate_queue``). Schedulers: ``dfs-bid`` (children by
average bid), the bid-blind ``dfs-uniform`` (neutral, seeded sibling ties) and SGLang's
``dfs-weight`` (children by subtree size), ``bid-sort`` (by bid, ignoring the tree) and
``no-sort`` (arrival order). Workloads: stars ``mixshare-P`` (P% of queries share one of a few
~1k-token articles), agent ``chains``, tree-of-thought ``trees-short`` (fits the cache) and
``trees-long`` (does not). Welfare is reported on the realised order (all Q requests ranked by
simulated TTFT, ties sharing the average rank) as % above ½Σb, beside the planned order's figure;
with the cache hit rate, mean TTFT, and dfs-bid's share of bid-sort's welfare (its % above ½Σb
over bid-sort's, paired by seed). Three sweeps: batch size n with i.i.d. values; the correlation
ρ of values within a cluster (Gaussian copula) at n = Q; one bidding cluster (the largest) and
zeros elsewhere, at n = Q.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disaggctl.experiment import auction_plots
from disaggctl.experiment.auction_baselines import baselines, describe_baselines
from disaggctl.experiment.auction_rows import SCHEDULERS, one, pick
from disaggctl.experiment.base import Plan, Settings
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, fmt_mean_se, mean_se, summarise

NAME = "auction"
TITLE = "auction: schedulers on a simulated queue, welfare on the realised order"
# Per queue of 1024 star-shaped requests through all five schedulers (chains and long trees
# count COST units, a queue of Q requests Q/1024), measured on the reference machine.
SECONDS_PER_UNIT = 1.48

PROFILE = "h100-32b"
FULL: dict[str, Any] = {
    "Q": 1024,
    "workloads": (
        "mixshare-10",
        "mixshare-50",
        "mixshare-90",
        "chains",
        "trees-short",
        "trees-long",
    ),
    "n": (16, 64, 256, 1024),
    "rho": (0.0, 0.5, 0.9),
    "rho_workloads": ("mixshare-50", "chains", "trees-long"),
}
QUICK: dict[str, Any] = {
    "Q": 256,
    "workloads": ("mixshare-50", "mixshare-90", "chains", "trees-short", "trees-long"),
    "n": (16, 256),
    "rho": (0.0, 0.9),
    "rho_workloads": ("mixshare-50", "trees-short"),
}
KEYS = (
    "realised_welfare_pct",
    "planned_welfare_pct",
    "batch_planned_welfare_pct",
    "cache_hit_rate",
    "mean_ttft_s",
    "p99_ttft_s",
    "revenue",
    "makespan_s",
)
COST = {"chains": 3.0, "trees-long": 3.5}  # relative to the stars and short trees


def plan(settings: Settings) -> Plan:
    from cluster.sim.workloads import make_workload

    g = QUICK if settings.quick else FULL
    Q = g["Q"]
    knobs, facts = [], []
    for name in g["workloads"]:
        w = make_workload(name, Q, seed=0)
        shown = {k: v for k, v in w.knobs.items() if k not in ("n", "values")}
        knobs.append(f"{name}: " + ", ".join(f"{k} = {v}" for k, v in shown.items()))
        facts.append(
            f"{name}: {100 * w.shared_fraction:.0f}% of tokens shared, mean prompt "
            f"{w.mean_prompt_tokens:.0f} tokens, {w.distinct_tokens} distinct"
        )
    setup = {
        "queue Q": Q,
        "worker": f"one {PROFILE} (0P/1D: prefills and decodes), all requests at t = 0",
        "schedulers": list(SCHEDULERS),
        "batch sizes n (i.i.d. values)": list(g["n"]),
        "workloads": list(g["workloads"]),
        "workload knobs": knobs,
        "workload facts (seed 0)": facts,
        "values": "1 + Pareto(1.5); i.i.d. for the n sweep",
        "ρ sweep (correlated values, n = Q)": f"ρ ∈ {list(g['rho'])} on "
        f"{', '.join(g['rho_workloads'])}",
        "one bidding cluster (n = Q)": "the largest cluster bids 1 + Pareto(1.5), the rest 0; "
        "every workload",
        "admission": "the whole planned order handed to the worker at once "
        "(the service's admission queue, max_in_prefill = Q)",
        "trials (seeds: workload, ties, simulator)": list(settings.seeds),
    }
    jobs = []

    def add(workload: str, n: int, values: str, rho: float, sweep: str) -> None:
        for seed in settings.seeds:
            kw = {
                "workload": workload,
                "n": n,
                "Q": Q,
                "values": values,
                "rho": rho,
                "seed": seed,
                "sweep": sweep,
            }
            jobs.append(Job(f"{__name__}:run_queue", kw, units=COST.get(workload, 1.0) * Q / 1024))

    for w in g["workloads"]:
        for n in g["n"]:
            add(w, n, "iid", 0.0, "n")
    for w in g["rho_workloads"]:
        for rho in g["rho"]:
            add(w, Q, "correlated", rho, "rho")
    for w in g["workloads"]:
        add(w, Q, "one-cluster", 0.0, "one-cluster")
    return Plan(setup, jobs)


def run_queue(
    workload: str, n: int, Q: int, values: str, rho: float, seed: int, sweep: str = ""
) -> dict[str, Any]:
    """One queue through every scheduler: per scheduler the ``QueueResult`` figures."""
    from cluster.sim.auction_queue import simulate_queue
    from cluster.sim.workloads import make_workload
    from cluster.values import ValueModel

    w = make_workload(workload, Q, seed=seed, values=ValueModel(values, rho))
    out = {}
    for name in SCHEDULERS:
        r = simulate_queue(w, name, n, profile=PROFILE, seed=seed)
        out[name] = {k: getattr(r, k) for k in KEYS}
    return out


def _share(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den is not None and den > 0 else None


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    groups: dict[tuple[str, str, int, str, float], list[dict[str, Any]]] = {}
    raw = []
    for job, res in zip(plan.jobs, results, strict=True):
        kw = job.kwargs
        key = (kw["sweep"], kw["workload"], kw["n"], kw["values"], kw["rho"])
        groups.setdefault(key, []).append(res)
        for name, figures in res.items():
            raw.append(
                {
                    **{k: kw[k] for k in ("sweep", "workload", "n", "values", "rho", "seed")},
                    "scheduler": name,
                    **figures,
                }
            )
    rows, shares = [], []
    for (sweep, workload, n, values, rho), runs in groups.items():
        base = {"sweep": sweep, "workload": workload, "n": n, "values": values, "rho": rho}
        for name in SCHEDULERS:
            rows.append({**base, "scheduler": name, **summarise([r[name] for r in runs], KEYS)})
        share: dict[str, Any] = {**base}
        for figure in ("realised_welfare_pct", "planned_welfare_pct"):
            ratios = [_share(r["dfs-bid"][figure], r["bid-sort"][figure]) for r in runs]
            share[figure], share[f"{figure}_se"] = mean_se(ratios)
        shares.append(share)
    n_sweep = [job.kwargs for job in plan.jobs if job.kwargs["sweep"] == "n"]
    checked = baselines(
        list(dict.fromkeys(kw["workload"] for kw in n_sweep)),
        n_sweep[0]["Q"],
        sorted({kw["seed"] for kw in n_sweep}),
    )
    return {"rows": rows, "shares": shares, "trials": raw, "baselines": checked}


def _beats(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    """a's mean above b's by more than their combined standard errors."""
    ea, eb = a.get(f"{key}_se") or 0.0, b.get(f"{key}_se") or 0.0
    return bool(a[key] is not None and b[key] is not None and a[key] - b[key] > ea + eb)


def describe_n(data: dict[str, Any]) -> str:
    parts, against = [], []
    workloads = list(dict.fromkeys(r["workload"] for r in data["rows"] if r["sweep"] == "n"))
    ns = sorted({r["n"] for r in data["rows"] if r["sweep"] == "n"})
    gaps = []
    for w in workloads:
        at_q = pick(data, "n", workload=w, n=ns[-1])
        bid, uni, wei = one(at_q, "dfs-bid"), one(at_q, "dfs-uniform"), one(at_q, "dfs-weight")
        small = one(pick(data, "n", workload=w, n=ns[0]), "dfs-bid")
        if not (bid and uni and wei and small):
            continue
        best = max(at_q, key=lambda r: r["realised_welfare_pct"] or -1e9)
        parts.append(
            f"{w}: at n = {ns[-1]} dfs-bid {fmt(bid['realised_welfare_pct'])}% (n = "
            f"{ns[0]}: {fmt(small['realised_welfare_pct'])}%), dfs-uniform "
            f"{fmt(uni['realised_welfare_pct'])}%, dfs-weight "
            f"{fmt(wei['realised_welfare_pct'])}%, best {best['scheduler']} "
            f"{fmt(best['realised_welfare_pct'])}%"
        )
        gaps.append(
            (abs((bid["planned_welfare_pct"] or 0) - (bid["realised_welfare_pct"] or 0)), w)
        )
        for n in ns:
            rows = pick(data, "n", workload=w, n=n)
            b, u = one(rows, "dfs-bid"), one(rows, "dfs-uniform")
            if b and u and _beats(u, b, "realised_welfare_pct"):
                against.append(f"{w} at n = {n} (dfs-uniform above dfs-bid)")
    text = (
        "Realised welfare (% above ½Σb, mean ± 1 s.e.) against the batch size n, per workload "
        "and scheduler. " + "; ".join(parts) + "."
    )
    if gaps:
        gap, w = max(gaps)
        text += (
            f" The planned order overstates or understates dfs-bid's realised welfare by at "
            f"most {fmt(gap)} points (on {w})."
        )
    if against:
        text += (
            " Against what dfs-bid is meant to do (beat the bid-blind DFS orders): "
            + ", ".join(against)
            + "."
        )
    else:
        text += " dfs-bid is never below dfs-uniform beyond the noise."
    return text


def describe_cache(data: dict[str, Any]) -> str:
    parts, against = [], []
    Q = max(r["n"] for r in data["rows"] if r["sweep"] == "n")
    for w in dict.fromkeys(r["workload"] for r in data["rows"] if r["sweep"] == "n"):
        rows = pick(data, "n", workload=w, n=Q)
        bid, bs, ns = one(rows, "dfs-bid"), one(rows, "bid-sort"), one(rows, "no-sort")
        uni = one(rows, "dfs-uniform")
        if not (bid and bs and ns and uni):
            continue
        ratio = (bs["mean_ttft_s"] or 0) / (bid["mean_ttft_s"] or 1)
        parts.append(
            f"{w}: hit rate dfs-bid {fmt(bid['cache_hit_rate'])}, bid-sort "
            f"{fmt(bs['cache_hit_rate'])}, no-sort {fmt(ns['cache_hit_rate'])}; "
            f"bid-sort's mean TTFT is {fmt(ratio)}× dfs-bid's"
        )
        better = [r["scheduler"] for r in rows if r is not bid and _beats(r, bid, "cache_hit_rate")]
        if better:
            against.append(f"{w}: {', '.join(better)} reuse the cache more than dfs-bid")
        if (bid["mean_ttft_s"] or 0) > 1.1 * (uni["mean_ttft_s"] or 0):
            against.append(f"{w}: dfs-bid's mean TTFT is over 10% above dfs-uniform's")
    text = (
        f"Prefix-cache hit rate and mean TTFT per scheduler at n = {Q}. " + "; ".join(parts) + "."
    )
    if against:
        text += " Against what the DFS restriction is meant to keep: " + "; ".join(against) + "."
    else:
        text += " The DFS orders keep the cache's reuse: no order beats dfs-bid's hit rate."
    return text


def describe_rho(data: dict[str, Any]) -> str:
    parts, against = [], []
    for w in dict.fromkeys(s["workload"] for s in data["shares"] if s["sweep"] == "rho"):
        pts = sorted(
            (s for s in data["shares"] if s["sweep"] == "rho" and s["workload"] == w),
            key=lambda s: s["rho"],
        )
        if len(pts) < 2:
            continue
        lo, hi = pts[0], pts[-1]
        parts.append(
            f"{w}: dfs-bid's share of bid-sort's welfare "
            f"{fmt_mean_se(lo['realised_welfare_pct'], lo['realised_welfare_pct_se'])} "
            f"at ρ = {lo['rho']:g}, "
            f"{fmt_mean_se(hi['realised_welfare_pct'], hi['realised_welfare_pct_se'])} "
            f"at ρ = {hi['rho']:g}"
        )
        if (hi["realised_welfare_pct"] or 0) < (lo["realised_welfare_pct"] or 0):
            against.append(w)
    text = (
        "Realised welfare against the within-cluster correlation ρ of values at n = Q, and "
        "dfs-bid's share of bid-sort's. " + "; ".join(parts) + "."
    )
    if against:
        text += (
            " Against the expectation that correlated values (a cluster worth more as a "
            "whole) let a DFS order come closer to bid-sort, the share falls with ρ on "
            + ", ".join(against)
            + "."
        )
    else:
        text += " The share rises with ρ: when a cluster's requests are worth alike, serving it "
        text += "whole costs less welfare."
    return text


def describe_one_cluster(data: dict[str, Any]) -> str:
    parts = []
    weak = []
    for s in (s for s in data["shares"] if s["sweep"] == "one-cluster"):
        rows = pick(data, "one-cluster", workload=s["workload"])
        bid, uni = one(rows, "dfs-bid"), one(rows, "dfs-uniform")
        if not (bid and uni):
            continue
        parts.append(
            f"{s['workload']}: dfs-bid {fmt(bid['realised_welfare_pct'])}% "
            f"({fmt(s['realised_welfare_pct'])} of bid-sort's), dfs-uniform "
            f"{fmt(uni['realised_welfare_pct'])}%"
        )
        if s["realised_welfare_pct"] is not None and s["realised_welfare_pct"] < 0.5:
            weak.append(s["workload"])
    text = (
        "One bidding cluster, everyone else at zero, n = Q: realised welfare per scheduler. "
        + "; ".join(parts)
        + "."
    )
    if weak:
        text += (
            " dfs-bid keeps less than half of bid-sort's welfare on "
            + ", ".join(weak)
            + ", against the case it should handle best (one cluster to move first)."
        )
    else:
        text += " dfs-bid keeps at least half of bid-sort's welfare on every workload."
    return text


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    write_csv(folder / "auction_rows.csv", data["rows"])
    write_csv(folder / "auction_shares.csv", data["shares"])
    write_csv(folder / "auction_trials.csv", data["trials"])
    for sweep, title in (
        ("n", "Batch-size sweep (i.i.d. values)"),
        ("rho", "ρ sweep (n = Q)"),
        ("one-cluster", "One bidding cluster (n = Q)"),
    ):
        rows = [
            (
                r["workload"],
                r["n"],
                f"{r['rho']:g}" if sweep == "rho" else r["values"],
                r["scheduler"],
                stat_cell(r, "realised_welfare_pct"),
                stat_cell(r, "planned_welfare_pct"),
                stat_cell(r, "cache_hit_rate"),
                stat_cell(r, "mean_ttft_s"),
                stat_cell(r, "revenue"),
            )
            for r in data["rows"]
            if r["sweep"] == sweep
        ]
        header = (
            "workload",
            "n",
            "ρ" if sweep == "rho" else "values",
            "scheduler",
            "realised % above ½Σb",
            "planned %",
            "cache hit",
            "mean TTFT s",
            "revenue",
        )
        section.text(f"{title}, mean ± 1 s.e.:\n\n" + markdown_table(header, rows))
    share_rows = [
        (
            s["sweep"],
            s["workload"],
            s["n"],
            f"{s['rho']:g}",
            s["values"],
            stat_cell(s, "realised_welfare_pct"),
            stat_cell(s, "planned_welfare_pct"),
        )
        for s in data["shares"]
    ]
    section.text(
        "dfs-bid's share of bid-sort's welfare (ratio of % above ½Σb, paired by seed):\n\n"
        + markdown_table(
            ("sweep", "workload", "n", "ρ", "values", "realised", "planned"), share_rows
        )
    )
    section.text("Baselines: " + describe_baselines(data["baselines"]))
    auction_plots.plot_n(data, folder / "auction_welfare_vs_n.png")
    section.figure("auction_welfare_vs_n.png", "Realised welfare vs batch size", describe_n(data))
    auction_plots.plot_cache(data, folder / "auction_cache_ttft.png")
    section.figure(
        "auction_cache_ttft.png", "Cache hit rate and mean TTFT at n = Q", describe_cache(data)
    )
    auction_plots.plot_rho(data, folder / "auction_rho.png")
    section.figure("auction_rho.png", "Realised welfare vs ρ", describe_rho(data))
    auction_plots.plot_one(data, folder / "auction_one_cluster.png")
    section.figure("auction_one_cluster.png", "One bidding cluster", describe_one_cluster(data))
