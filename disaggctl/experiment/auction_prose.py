"""The auction experiment's prose: what the welfare, cache and correlation figures show, in
sentences computed from the rows (``disaggctl.experiment.auction``)."""

from __future__ import annotations

from typing import Any

from disaggctl.experiment.auction_rows import one, pick
from disaggctl.experiment.stats import fmt, fmt_mean_se

__all__ = ["describe_cache", "describe_n", "describe_one_cluster", "describe_rho"]


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
