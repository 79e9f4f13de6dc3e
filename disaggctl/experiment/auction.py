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
from disaggctl.experiment.auction_rows import SCHEDULERS
from disaggctl.experiment.base import Plan, Settings
from disaggctl.experiment.checks import same_run_of
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import ratio_of_means, summarise

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
        "mixshare-90-wide",
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
# What one simulation did, whatever batches it was cut into: the batch-planned figure is an
# account of the batches, so it differs with n where the run itself does not.
RUN_KEYS = tuple(k for k in KEYS if k != "batch_planned_welfare_pct")
TABLE_KEYS = (
    "realised_welfare_pct",
    "planned_welfare_pct",
    "cache_hit_rate",
    "mean_ttft_s",
    "revenue",
)
COST = {"chains": 3.0, "trees-long": 3.5}  # relative to the stars and short trees


def plan(settings: Settings) -> Plan:
    from cluster.sim.profile import load_profile
    from cluster.sim.workloads import make_workload

    g = QUICK if settings.quick else FULL
    Q = g["Q"]
    cache = load_profile(PROFILE).decode.kv_capacity_tokens
    knobs, facts = [], []
    for name in g["workloads"]:
        w = make_workload(name, Q, seed=0)
        shown = {k: v for k, v in w.knobs.items() if k not in ("n", "values")}
        knobs.append(f"{name}: " + ", ".join(f"{k} = {v}" for k, v in shown.items()))
        # What a cache of the worker's size makes of the order: shared prefixes that fit it
        # are found in every order (the workload is a control for the schedulers' hit rate);
        # more than it holds reward the orders that keep a prefix's requests together.
        shared = w.shared_prefix_tokens
        fits = "fit the cache: a control" if shared <= cache else "exceed the cache"
        facts.append(
            f"{name}: {100 * w.shared_fraction:.0f}% of tokens shared, mean prompt "
            f"{w.mean_prompt_tokens:.0f} tokens, {w.distinct_tokens} distinct, shared "
            f"prefixes {shared} tokens ({fits} of {cache})"
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
    # A scheduler whose runs do not change with n (no-sort keeps the arrival order whatever
    # the batch) is one run at every n: shown at its first n, named at the others.
    same: dict[tuple[Any, ...], int] = {}
    for sweep, workload, values, rho in dict.fromkeys((k[0], k[1], k[3], k[4]) for k in groups):
        for name in SCHEDULERS:
            by_n = {
                k[2]: [r[name] for r in runs]
                for k, runs in groups.items()
                if (k[0], k[1], k[3], k[4]) == (sweep, workload, values, rho)
            }
            for n, first in same_run_of(by_n, RUN_KEYS).items():
                same[(sweep, workload, n, values, rho, name)] = first
    rows, shares = [], []
    for (sweep, workload, n, values, rho), runs in groups.items():
        base = {"sweep": sweep, "workload": workload, "n": n, "values": values, "rho": rho}
        for name in SCHEDULERS:
            rows.append({
                **base, "scheduler": name, **summarise([r[name] for r in runs], KEYS),
                "same_as_n": same.get((sweep, workload, n, values, rho, name)),
            })  # fmt: skip
        share: dict[str, Any] = {**base}
        for figure in ("realised_welfare_pct", "planned_welfare_pct"):
            share[figure], share[f"{figure}_se"] = ratio_of_means(
                [r["dfs-bid"][figure] for r in runs], [r["bid-sort"][figure] for r in runs]
            )
        shares.append(share)
    n_sweep = [job.kwargs for job in plan.jobs if job.kwargs["sweep"] == "n"]
    checked = baselines(
        list(dict.fromkeys(kw["workload"] for kw in n_sweep)),
        n_sweep[0]["Q"],
        sorted({kw["seed"] for kw in n_sweep}),
    )
    return {"rows": rows, "shares": shares, "trials": raw, "baselines": checked}


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    from disaggctl.experiment.auction_prose import (
        describe_cache,
        describe_n,
        describe_one_cluster,
        describe_rho,
    )

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
                *(
                    (stat_cell(r, k) for k in TABLE_KEYS)
                    if r["same_as_n"] is None
                    else (f"the run of n = {r['same_as_n']}",) * len(TABLE_KEYS)
                ),
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
        "dfs-bid's share of bid-sort's welfare (the ratio of their mean % above ½Σb over the "
        "seeds, ± its delta-method standard error, the seeds paired; – where bid-sort's mean is "
        "not above ½Σb):\n\n"
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
