"""The poa experiment's prose: what the factors, the latency and the fixed throughput ceilings
show, in sentences computed from the points (``disaggctl.experiment.poa``)."""

from __future__ import annotations

import math
from typing import Any

from disaggctl.experiment.poa import CONFIGS, _knees, _rows
from disaggctl.experiment.stats import fmt

__all__ = ["describe_factors", "describe_fixed_ceiling", "describe_label_gaps", "describe_latency"]

HIGH_POA = 5.0  # a poa_hat at which the queue already dominates TTFT


def describe_factors(data: dict[str, Any]) -> str:
    """What the poa_hat figure shows, from the numbers."""
    parts, against = [], []
    for name, _, topology in CONFIGS:
        rows = _rows(data, name)
        if not rows:
            continue
        lo, hi = rows[0], max(rows, key=lambda p: p["poa_hat"] or 0.0)
        trans, sat = _knees(rows)
        text = (
            f"{name}: poa_hat {fmt(lo['poa_hat'])} at C = {lo['concurrency']}, highest "
            f"{fmt(hi['poa_hat'])} at C = {hi['concurrency']}"
        )
        text += f"; transition from C = {trans}" if trans else "; never in transition"
        text += f", saturated from C = {sat}" if sat else ", never saturated"
        sat_rows = [p for p in rows if p["regime"] == "saturated" and p["poa_hat"]]
        if topology.startswith("1P/"):
            # The window places a request by its prefill decision (docs/design.md §3), and one
            # prefill worker leaves that decision no choice: the split says so by construction.
            route = max(p["poa_routing"] or 1.0 for p in rows)
            text += (
                f"; poa_routing is at most {fmt(route)} (one prefill worker: the prefill that "
                f"TTFT waits on has nowhere else to go, so routing can recover nothing)"
            )
        elif sat_rows:
            share = [
                math.log(p["poa_capacity"]) / math.log(p["poa_hat"])
                for p in sat_rows
                if p["poa_hat"] > 1 and p["poa_capacity"]
            ]
            route = max(p["poa_routing"] or 1.0 for p in sat_rows)
            if share:
                text += (
                    f"; when saturated the capacity factor carries "
                    f"{100 * sum(share) / len(share):.0f}% of log poa_hat and poa_routing is "
                    f"at most {fmt(route)}"
                )
        parts.append(text)
        below = [p["poa_hat"] for p in rows if p["regime"] == "below" and p["poa_hat"]]
        if sat_rows and below and max(p["poa_hat"] for p in sat_rows) <= max(below):
            against.append(f"on {name} poa_hat is no higher saturated than below saturation")
        if any(p["poa_hat"] is not None and p["poa_hat"] < 1.0 for p in rows):
            against.append(f"on {name} poa_hat falls below 1, which it should not by construction")
    text = "poa_hat (mean ± 1 s.e. over the trials) against concurrency, its two factors beside "
    text += "it, the background coloured by regime. " + "; ".join(parts) + "."
    if against:
        text += " Against what the estimator is meant to show: " + "; ".join(against) + "."
    else:
        text += (
            " As intended, poa_hat stays ≥ 1 and is higher in saturation than below it on "
            "every deployment."
        )
    return text


def describe_latency(data: dict[str, Any]) -> str:
    parts = []
    peak = {}
    for name, _, _ in CONFIGS:
        rows = _rows(data, name)
        if not rows:
            continue
        best = max(rows, key=lambda p: p["throughput_rps"] or 0.0)
        peak[name] = best["throughput_rps"] or 0.0
        knee = next(p for p in rows if (p["throughput_rps"] or 0.0) >= 0.95 * peak[name])
        last = rows[-1]
        ttft_growth = (last["ttft_p99_s"] or math.nan) / (rows[0]["ttft_p99_s"] or math.nan)
        itl_growth = (last["itl_p99_s"] or math.nan) / (rows[0]["itl_p99_s"] or math.nan)
        parts.append(
            f"{name} reaches 95% of its peak throughput ({fmt(peak[name])} req/s) at "
            f"C = {knee['concurrency']}; from C = {rows[0]['concurrency']} to "
            f"{last['concurrency']} TTFT P99 grows {fmt(ttft_growth)}× and ITL P99 "
            f"{fmt(itl_growth)}×"
        )
    text = "TTFT P99, ITL P99 and throughput against concurrency. " + "; ".join(parts) + "."
    a, b = peak.get("70B 1P/2D"), peak.get("70B 1P/5D")
    if a and b:
        gain = b / a - 1
        text += (
            f" Going from 2 to 5 decode workers on 70B changes peak throughput by "
            f"{100 * gain:+.0f}%: "
            + (
                "the single prefill worker is the bottleneck, so extra decode capacity buys "
                "nothing at saturation; that is capacity, not routing, and only a re-split helps."
                if abs(gain) < 0.05
                else "decode capacity was binding."
            )
        )
    return text


def describe_fixed_ceiling(data: dict[str, Any]) -> str:
    """Why some points' throughput has a standard error of 0 while their TTFT P99 varies: the
    same count of completions in every seed, read from the trials (``run_point``)."""
    fixed: dict[str, list[tuple[int, int]]] = {}
    shapes, varied = set(), set()
    for name, c in sorted({(t["config"], t["concurrency"]) for t in data["trials"]}):
        trials = [t for t in data["trials"] if (t["config"], t["concurrency"]) == (name, c)]
        counts = {t.get("completed") for t in trials}
        if len(trials) > 1 and len(counts) == 1 and None not in counts:
            fixed.setdefault(name, []).append((c, counts.pop()))
            shapes |= {t.get("shapes") for t in trials}
            varied.add(len({t.get("ttft_p99_s") for t in trials}) > 1)
    if not fixed:
        return "Every point's throughput varies across the seeds."
    parts = [
        f"{name} at C = {', '.join(str(c) for c, _ in points)} "
        f"({', '.join(str(n) for _, n in points)} requests)"
        for name, points in fixed.items()
    ]
    text = (
        "Points whose throughput is the same in every seed (s.e. 0): the hold completes the "
        "same number of requests in each: " + "; ".join(parts) + "."
    )
    if shapes == {1}:
        text += (
            " Every request of this workload has the same prompt and output lengths, so a closed "
            "loop's pace does not depend on the seed: below the knee it is each client's round "
            "trip, and at saturation the one prefill worker, busy back to back, releases the "
            "same number of requests per second whatever the seed (the ceiling is the prefill "
            "pool's rate)."
        )
    if varied == {True}:
        text += (
            " Every seed did reach the engines: at each of these points the seeds' TTFT P99 "
            "are not all equal (the seed draws which template each request sends and, above a "
            "few clients, where it runs), which moves the tail but not the count."
        )
    return text


def describe_label_gaps(data: dict[str, Any]) -> str:
    """The points labelled ``below`` although their poa_hat is high, with the rule's numbers:
    the labels follow TTFT P99 against the knee's thresholds, poa_hat the queue's share."""
    gaps = [
        p for p in data["points"]
        if p["regime"] == "below" and (p["poa_hat"] or 0.0) >= HIGH_POA
    ]  # fmt: skip
    if not gaps:
        return ""
    parts = [
        f"{p['config']} at C = {p['concurrency']} (poa_hat {fmt(p['poa_hat'])}, TTFT P99 "
        f"{fmt(p['ttft_p99_s'])} s under θ1 = {fmt(p['label_theta_s'][0])} s)"
        for p in gaps
    ]
    text = (
        "Points labelled below though poa_hat is already high: " + "; ".join(parts) + ". The "
        "label compares TTFT P99 with the knee's θ1 (a third of the TTFT P99 where the "
        "throughput asymptotes meet), and a deployment whose calm TTFT is long reaches the "
        "knee late in seconds; poa_hat compares each request's time with its service alone, "
        "so it rises as soon as a queue forms."
    )
    calm = {p["calm_regime"] for p in gaps}
    if calm <= {"transition", "saturated"}:
        text += " The calm multiples, beside, call them " + " or ".join(sorted(calm)) + "."
    return text
