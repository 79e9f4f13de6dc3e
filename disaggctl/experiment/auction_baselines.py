"""The auction experiment's baselines, checked where three trials cannot check them (§8).

``no-sort`` serves in arrival order, and a workload's arrival order is a permutation drawn apart
from its values, so its welfare is 0% above ½Σb in expectation. Three trials cannot show that:
a 1 + Pareto(1.5) value has infinite variance, so a few large bids decide a trial's figure and
three trials' standard error understates the spread. The planned welfare of the arrival order
needs no simulation, so it is measured here over ``BASELINE_SEEDS`` workloads per name.

``bid-sort`` and ``no-sort`` ignore the prompts. ``mixshare-P``'s generator draws the same
values in the same arrival order for every P (common random numbers: the workloads differ only
in how much of each prompt is shared), so those two orders, and their welfare, are the same for
every P; only the cache hit rate and the TTFT differ. :func:`common_values` checks that on the
trials' seeds rather than assuming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from auction.welfare import welfare, welfare_pct_above_half
from disaggctl.experiment.stats import fmt, mean_se

BASELINE_SEEDS = 200


def arrival_bids(name: str, Q: int, seed: int) -> np.ndarray:
    """The bids of workload ``name`` (Q requests, ``seed``) in arrival order."""
    from cluster.sim.workloads import make_workload

    queue = sorted(make_workload(name, Q, seed=seed).requests, key=lambda r: r.arrival)
    return np.array([r.bid for r in queue], dtype=np.float64)


def arrival_order_welfare(name: str, Q: int, seeds: Sequence[int]) -> list[float]:
    """Per seed, the arrival order's planned welfare, % above ½Σb (``no-sort``'s plan)."""
    out = []
    for seed in seeds:
        bids = arrival_bids(name, Q, seed)
        out.append(welfare_pct_above_half(welfare(np.arange(bids.size), bids), bids))
    return out


def common_values(workloads: Sequence[str], Q: int, seeds: Sequence[int]) -> bool:
    """Whether the ``mixshare-P`` workloads share their bids in arrival order on every seed."""
    stars = [w for w in workloads if w.startswith("mixshare-")]
    return len(stars) > 1 and all(
        all(np.array_equal(arrival_bids(stars[0], Q, s), arrival_bids(w, Q, s)) for w in stars)
        for s in seeds
    )


def baselines(workloads: Sequence[str], Q: int, trial_seeds: Sequence[int]) -> dict[str, Any]:
    """The arrival order's welfare per workload, on the trials' seeds and on many."""
    rows = []
    for name in workloads:
        many = arrival_order_welfare(name, Q, range(BASELINE_SEEDS))
        mean, se = mean_se(many)
        trials = [many[s] if s < BASELINE_SEEDS else arrival_order_welfare(name, Q, [s])[0]
                  for s in trial_seeds]  # fmt: skip
        rows.append({"workload": name, "seeds": BASELINE_SEEDS, "planned_welfare_pct": mean,
                     "planned_welfare_pct_se": se, "trials": trials})  # fmt: skip
    return {"rows": rows, "trial_seeds": list(trial_seeds),
            "common_values": common_values(workloads, Q, trial_seeds)}  # fmt: skip


def describe_baselines(data: dict[str, Any]) -> str:
    rows = data["rows"]
    off = [r for r in rows if abs(r["planned_welfare_pct"]) > 2 * r["planned_welfare_pct_se"]]
    text = (
        f"no-sort's order (arrival) over {rows[0]['seeds']} workloads per name, planned welfare "
        "% above ½Σb, mean ± 1 s.e.: "
        + "; ".join(
            f"{r['workload']} {fmt(r['planned_welfare_pct'])} ± {fmt(r['planned_welfare_pct_se'])}"
            for r in rows
        )
        + ". "
    )
    if off:
        text += (
            "More than 2 s.e. from 0, against the arrival order's independence of the values: "
            + ", ".join(r["workload"] for r in off)
            + "."
        )
    else:
        text += "Every one is within 2 s.e. of 0, as an order drawn apart from the values must be."
    seeds = ", ".join(str(s) for s in data["trial_seeds"])
    for r in rows:
        mean, se = mean_se(r["trials"])
        if mean is not None and se and abs(mean) > 2 * se:
            text += (
                f" On {r['workload']} the trials' seeds ({seeds}) read "
                + ", ".join(fmt(t) for t in r["trials"])
                + f": {fmt(abs(mean) / se)} of their own s.e. from 0, a sample of a heavy "
                "tail that three trials take for a bias."
            )
    if data["common_values"]:
        text += (
            " The mixshare workloads carry the same bids in the same arrival order on every "
            "trial's seed, so bid-sort's and no-sort's rows (orders that ignore the prompts) are "
            "the same for every share; only their cache hit rate and TTFT differ."
        )
    return text
