"""The adaptive experiment's prose: what one seed's timeline shows and how the compared arm did
over the trials, in sentences computed from the runs (``disaggctl.experiment.adaptive``)."""

from __future__ import annotations

from typing import Any

from disaggctl.experiment.adaptive import REGIMES
from disaggctl.experiment.stats import fmt_mean_se

__all__ = ["describe_pools", "describe_timeline"]


def describe_pools(ticks: list[dict[str, Any]]) -> str:
    """The pools' states in order, from the controller's ticks: a worker on its way between
    pools (draining, then warming up in its new role) is in neither, so while one moves the two
    pools add up to one less than the deployment; the time means of the phase table count it so."""
    pools = [(s["prefill_workers"], s["decode_workers"]) for s in ticks]
    if len(set(pools)) < 2:
        return ""
    workers = max(p + d for p, d in pools)
    states: list[tuple[tuple[int, int], float, float]] = []  # (pools, from t, to t)
    for s, pool in zip(ticks, pools, strict=True):
        if states and states[-1][0] == pool:
            states[-1] = (pool, states[-1][1], s["t"])
        else:
            states.append((pool, s["t"], s["t"]))
    steps = []
    for (p, d), start, end in states:
        if p + d < workers:
            steps.append(f"one worker moving ({end - start:.0f} s)")
        else:
            steps.append(f"{p}P/{d}D from t = {start:.0f} s")
    return "the pools go " + " → ".join(steps)


def describe_timeline(
    name: str, entry: dict[str, Any], verdict: dict[str, Any], timeline: dict[str, Any]
) -> str:
    arm = entry["compare"]
    ticks = timeline.get(arm, [])
    parts = []
    firsts = {}
    for level, label in enumerate(REGIMES[1:], start=1):
        t = next((s["t"] for s in ticks if s["regime"] >= level), None)
        firsts[label] = t
    when = {k: "no time" if t is None else f"t = {t:.0f} s" for k, t in firsts.items()}
    parts.append(
        f"In the plotted seed the {arm} arm reaches transition at {when['transition']} and "
        f"saturated at {when['saturated']}"
    )
    taus = sorted({s["tau"] for s in ticks})
    if taus:
        parts.append(f"τ takes the values {', '.join(f'{t:g}' for t in taus)}")
    moves = describe_pools(ticks)
    if moves:
        parts.append(moves)
    r = entry["paired_hold_ratios"]
    text = "; ".join(parts) + ". "
    text += (
        f"Over the trials the saturated hold's TTFT P99 of {arm} is "
        f"{fmt_mean_se(r['ttft_p99_s'], r['ttft_p99_s_se'])}× static's, poa_hat "
        f"{fmt_mean_se(r['poa_hat'], r['poa_hat_se'])}×, throughput "
        f"{fmt_mean_se(r['throughput_rps'], r['throughput_rps_se'])}× (paired by seed)."
    )
    targets = {k: v for k, v in verdict["targets"].items() if k.startswith(f"{name}:")}
    missed = [k.split(":", 1)[1] for k, v in targets.items() if not v["met"]]
    if targets and missed:
        text += (
            f" Against what the controller is meant to achieve: the targets on "
            f"{', '.join(missed)} are missed."
        )
    elif targets:
        text += " Every target of bench.adaptive for this case is met."
    else:
        ratio, se = r["ttft_p99_s"], r["ttft_p99_s_se"] or 0.0
        if ratio is not None and ratio - 2 * se > 1.0:
            text += (
                f" No target here, but {arm} makes the hold's TTFT P99 worse than static, "
                "against what the controller is meant to do."
            )
        elif ratio is not None and ratio + 2 * se < 1.0:
            text += f" No target here; {arm} lowers the hold's TTFT P99."
        else:
            text += f" No target here; {arm} and static are within noise of each other."
    return text
