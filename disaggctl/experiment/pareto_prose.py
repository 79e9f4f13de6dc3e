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


def describe_frontier(data: dict[str, Any]) -> str:
    parts, against = [], []
    for c in CONCURRENCY:
        for view in VIEWS:
            rows = [r for r in panel(data, c, view) if r["ttft_p99_s"] is not None]
            if not rows:
                continue
            best = min(rows, key=lambda r: r["ttft_p99_s"])
            static, sat = _cell(rows, STATIC), _cell(rows, SATURATED)
            tp = [r["throughput_rps"] for r in rows if r["throughput_rps"]]
            regime = static["regime"] if static else best["regime"]
            text = (
                f"C = {c}, {view} views (static (0, 1) in the {regime} regime): lowest TTFT P99 at "
                f"(τ, ω) = ({best['tau']:g}, {best['omega']:g}), {fmt(best['ttft_p99_s'])} s"
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
                for r in panel(data, c, view)
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
            rows = [r for r in panel(data, c, view) if r["cache_hit_rate"] is not None]
            if not rows:
                continue
            lo = min(rows, key=lambda r: r["cache_hit_rate"])
            hi = max(rows, key=lambda r: r["cache_hit_rate"])
            text = (
                f"C = {c}, {view}: {lo['cache_hit_rate']:.3f} at ({lo['tau']:g}, "
                f"{lo['omega']:g}) to {hi['cache_hit_rate']:.3f} at ({hi['tau']:g}, "
                f"{hi['omega']:g})"
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
