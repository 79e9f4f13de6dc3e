"""The pareto experiment's prose: what the frontier, the heat maps and the cache hit rates
show, in sentences computed from the cells (``disaggctl.experiment.pareto``)."""

from __future__ import annotations

from typing import Any

from disaggctl.experiment.pareto import CONCURRENCY, SATURATED, STATIC, VIEWS, WORKLOAD, panel
from disaggctl.experiment.stats import fmt, routing_share


def _cell(rows: list[dict[str, Any]], policy: tuple[float, float]) -> dict[str, Any] | None:
    return next((r for r in rows if (r["tau"], r["omega"]) == policy), None)


def _pct(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "–"
    return f"{100 * (a / b - 1):+.0f}%"


def _worse(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    """a's mean above b's by more than their combined standard errors."""
    ea, eb = a.get(f"{key}_se") or 0.0, b.get(f"{key}_se") or 0.0
    return bool(a[key] is not None and b[key] is not None and a[key] - b[key] > ea + eb)


def _ties(rows: list[dict[str, Any]], best: dict[str, Any], key: str) -> str:
    """The cells the trials cannot tell from ``best`` on ``key`` (neither worse than the other
    by more than their combined standard errors), as a clause; empty when there are none."""
    tied = [
        r for r in rows
        if r is not best and not _worse(r, best, key) and not _worse(best, r, key)
    ]  # fmt: skip
    if not tied:
        return ""
    cells = ", ".join(f"({r['tau']:g}, {r['omega']:g})" for r in tied)
    return f" (a tie within the trials' noise with {cells})"


def describe_same_runs(data: dict[str, Any]) -> str:
    """Which cells are one run (``pareto.mark_same_runs``), and why."""
    same = [r for r in data["cells"] if r.get("same_as")]
    if not same:
        return (
            "No two cells of a panel are one run: in each pair, some request was placed on "
            "another worker in some seed (``cluster.sim.records.placements_digest``)."
        )
    parts = [
        f"({r['tau']:g}, {r['omega']:g}) at C = {r['concurrency']}, {r['view']} views is the run "
        f"of ({r['same_as'][0]:g}, {r['same_as'][1]:g})"
        for r in same
    ]
    text = (
        "Cells that are one run, shown once: " + "; ".join(parts) + ". Each placed every "
        "request on the same prefill and decode workers as the cell it names, in every seed "
        "(``cluster.sim.records.placements_digest``), so every figure is that cell's."
    )
    if all(r["tau"] == 0 and r["omega"] > 0 and r["same_as"][1] > 0 for r in same):
        text += (
            " Why: at τ = 0 the router takes the cheapest worker, and a prefill worker holds no "
            "decode blocks, so its cost is ω·prefill_blocks alone and every ω > 0 ranks the "
            "prefill workers alike; the digests show the decode choices coincided as well."
        )
    return text


def describe_frontier(data: dict[str, Any]) -> str:
    parts, against = [], []
    for c in CONCURRENCY:
        for view in VIEWS:
            rows = [
                r for r in panel(data, c, view, distinct=True) if r["ttft_p99_s"] is not None
            ]
            if not rows:
                continue
            best = min(rows, key=lambda r: r["ttft_p99_s"])
            static, sat = _cell(rows, STATIC), _cell(rows, SATURATED)
            tp = [r["throughput_rps"] for r in rows if r["throughput_rps"]]
            regime = static["regime"] if static else best["regime"]
            text = (
                f"C = {c}, {view} views (static (0, 1) in the {regime} regime): lowest TTFT P99 at "
                f"(τ, ω) = ({best['tau']:g}, {best['omega']:g}), {fmt(best['ttft_p99_s'])} s"
                + _ties(rows, best, "ttft_p99_s")
            )
            if static:
                text += f", {_pct(best['ttft_p99_s'], static['ttft_p99_s'])} against static (0, 1)"
            if sat:
                on = "on" if sat.get("frontier") else "off"
                text += (
                    f"; the saturated entry (0.8, 0.1) is {on} the frontier, "
                    f"{_pct(sat['ttft_p99_s'], static['ttft_p99_s'] if static else None)} "
                    f"TTFT P99 against static"
                )
                if (
                    static
                    and regime in ("transition", "saturated")
                    and _worse(sat, static, "ttft_p99_s")
                ):
                    against.append(
                        f"at C = {c} with {view} views the saturated policy (0.8, 0.1) "
                        f"has a higher TTFT P99 than static (0, 1)"
                    )
            if tp:
                text += f"; throughput varies by {100 * (max(tp) / min(tp) - 1):.1f}% across cells"
            parts.append(text)
            if c == max(CONCURRENCY) and regime == "below":
                against.append(
                    f"C = {c} was meant to be at saturation, but with {view} views "
                    "static (0, 1) stays below the controller's first threshold"
                )
            if static and static["regime"] == "below" and _worse(static, best, "ttft_p99_s"):
                against.append(
                    f"at C = {c} with {view} views the below-saturation policy (0, 1) "
                    f"is not the best cell"
                )
    text = (
        "Throughput against TTFT P99 per cell (mean ± 1 s.e.), the frontier joined. "
        + "; ".join(parts)
        + ". In a closed loop throughput is C over the request time, so "
        "cells differ mostly in latency."
    )
    if against:
        text += " Against what the policy table intends: " + "; ".join(against) + "."
    return text


def describe_heatmaps(data: dict[str, Any]) -> str:
    from scipy.stats import spearmanr

    parts, against = [], []
    for c in CONCURRENCY:
        for view in VIEWS:
            rows = [
                r
                for r in panel(data, c, view, distinct=True)
                if r["poa_hat"] is not None and r["ttft_p99_s"] is not None
            ]
            if len(rows) < 3:
                continue
            lo = min(rows, key=lambda r: r["poa_hat"])
            hi = max(rows, key=lambda r: r["poa_hat"])
            rho = float(spearmanr([r["poa_hat"] for r in rows], [r["ttft_p99_s"] for r in rows])[0])
            text = (
                f"C = {c}, {view}: poa_hat from {fmt(lo['poa_hat'])} at ({lo['tau']:g}, "
                f"{lo['omega']:g}) to {fmt(hi['poa_hat'])} at ({hi['tau']:g}, "
                f"{hi['omega']:g}), rank correlation with TTFT P99 {rho:+.2f}"
            )
            share = routing_share(rows)
            if share is not None:
                text += f", {100 * share:.0f}% of its spread in log poa_routing"
            parts.append(text)
            if not rho > 0.5:
                against.append(f"C = {c}, {view}")
    text = "poa_hat per (τ, ω) cell (left) and TTFT P99 (right). " + "; ".join(parts) + "."
    text += (
        " The share in log poa_routing is cov(log poa_routing, log poa_hat) / var(log poa_hat)"
        " across the panel's cells; the rest is in log poa_capacity. In this closed loop a herd"
        " also bunches the clients' next requests, which no routing of those requests undoes,"
        " so part of a policy's cost shows as capacity (with open-loop arrivals, where only the"
        " routing differs, most of it is in poa_routing:"
        " tests/games/test_poa_split_on_simulator.py)."
    )
    if against:
        text += (
            " Where poa_hat should rank policies as their latency does, it does not clearly "
            "(rank correlation ≤ 0.5): " + ", ".join(against) + "."
        )
    else:
        text += " poa_hat ranks the policies as their TTFT P99 does in every panel."
    return text


def _spread(rows: list[dict[str, Any]], along: str, fixed: str) -> tuple[float, float] | None:
    """The widest range of the cache hit rate along ``along`` (τ or ω) at one value of
    ``fixed``: (range, that value)."""
    best: tuple[float, float] | None = None
    for value in sorted({r[fixed] for r in rows}):
        hits = [r["cache_hit_rate"] for r in rows if r[fixed] == value]
        if len(hits) > 1 and (best is None or max(hits) - min(hits) > best[0]):
            best = (max(hits) - min(hits), value)
    return best


def describe_cache(data: dict[str, Any]) -> str:
    """How the prefix-cache hit rate moves with the policy, per panel, against the workload's
    ideal (every step back on the worker of its trajectory's last one)."""
    parts = []
    for c in CONCURRENCY:
        for view in VIEWS:
            rows = [
                r for r in panel(data, c, view, distinct=True) if r["cache_hit_rate"] is not None
            ]
            if not rows:
                continue
            lo = min(rows, key=lambda r: r["cache_hit_rate"])
            hi = max(rows, key=lambda r: r["cache_hit_rate"])
            text = (
                f"C = {c}, {view}: {lo['cache_hit_rate']:.3f} at ({lo['tau']:g}, "
                f"{lo['omega']:g}){_ties(rows, lo, 'cache_hit_rate')} to "
                f"{hi['cache_hit_rate']:.3f} at ({hi['tau']:g}, "
                f"{hi['omega']:g}){_ties(rows, hi, 'cache_hit_rate')}"
            )
            by_omega, by_tau = _spread(rows, "omega", "tau"), _spread(rows, "tau", "omega")
            if by_omega is not None and by_tau is not None:
                text += (
                    f"; ω alone moves it by up to {by_omega[0]:.3f} (at τ = {by_omega[1]:g}), "
                    f"τ alone by up to {by_tau[0]:.3f} (at ω = {by_tau[1]:g})"
                )
            parts.append(text)
    return (
        "Prefix-cache hit rate, the share of prompt tokens found cached where the request was "
        "prefilled. Over whole trajectories, a router that sent every step back to the worker "
        f"of its trajectory's last one would hit {WORKLOAD.ideal_hit_rate():.3f}; a hold sees "
        f"about three rounds of the {WORKLOAD.trajectories} trajectories, and where the round "
        "robin's phase leaves it fewer first steps (which find only the system prompt) than "
        "later ones, a cell reads above that. " + "; ".join(parts) + "."
    )


def describe_tails(data: dict[str, Any]) -> str:
    """Why (τ, ω) move TTFT P99 more at one load than at the other: where the slowest 5% of
    first tokens spend their time (``pareto.tail_breakdown``), per panel, at its fastest and
    slowest cells."""
    parts, waiting = [], {}
    for c in CONCURRENCY:
        for view in VIEWS:
            rows = [
                r for r in panel(data, c, view, distinct=True)
                if r["ttft_p99_s"] is not None and r.get("tail_wait_s") is not None
            ]  # fmt: skip
            if len(rows) < 2:
                continue
            lo = min(rows, key=lambda r: r["ttft_p99_s"])
            hi = max(rows, key=lambda r: r["ttft_p99_s"])
            totals = [r["tail_wait_s"] + r["tail_prefill_s"] + r["tail_other_s"] for r in rows]
            waiting[(c, view)] = sum(
                r["tail_wait_s"] / t for r, t in zip(rows, totals, strict=True) if t
            ) / len(rows)
            cells = []
            for r in (lo, hi):
                cells.append(
                    f"({r['tau']:g}, {r['omega']:g}): {fmt(r['tail_wait_s'])} s waiting, "
                    f"{fmt(r['tail_prefill_s'])} s prefilling, {fmt(r['tail_other_s'])} s "
                    f"after (hit rate {fmt(r['cache_hit_rate'])})"
                )
            parts.append(
                f"C = {c}, {view}: TTFT P99 {fmt(lo['ttft_p99_s'])}–{fmt(hi['ttft_p99_s'])} s; "
                + " against ".join(cells)
                + f"; waiting is {100 * waiting[(c, view)]:.0f}% of the tail across the cells"
            )
    if not parts:
        return ""
    text = (
        "Where the slowest 5% of first tokens spend their time (mean over the hold's tail, per "
        "cell): " + "; ".join(parts) + "."
    )
    low, high = min(CONCURRENCY), max(CONCURRENCY)
    below = [waiting[(low, v)] for v in VIEWS if (low, v) in waiting]
    above = [waiting[(high, v)] for v in VIEWS if (high, v) in waiting]
    if below and above and max(below) < min(above):
        text += (
            f" So the mechanism: at C = {low} the tail is mostly prefill work, which the cached "
            "prefix shortens, so the policies that keep a trajectory on its worker (ω > 0 at a "
            f"low τ) cut it; at C = {high} the tail is mostly waiting for a prefill worker. "
            "There the closed loop keeps the same C requests in the system whatever the policy, "
            "so a prefill the cache shortens lets the next request in sooner without "
            "shortening the queue it joins, and (τ, ω) move TTFT P99 by a few percent only. "
            "This is why the invariance runs the other way from the source study's (policies "
            "matter only above the knee): below it, our trajectories' long shared histories "
            "make the cache hit rate, which the policy sets, most of a first token's time."
        )
    return text
