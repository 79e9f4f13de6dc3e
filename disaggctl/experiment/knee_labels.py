"""The poa experiment's regimes at each deployment's own knee (``controller.knee``), beside the
calm calibration's: the thresholds from a sweep's points, and what the two labelings say."""

from __future__ import annotations

from typing import Any

from disaggctl.experiment.stats import fmt

__all__ = ["describe_thresholds", "knee_thresholds"]


def knee_thresholds(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """N* and θ1, θ2 at it from a deployment's points (means over trials); None where the
    sweep does not reach the knee. The calm calibration's thresholds move to ``calm_*``."""
    from controller.knee import knee

    measured = [r for r in rows if r["throughput_rps"] and r["ttft_p99_s"] and r["concurrency"] > 0]
    try:
        k = knee(
            [r["concurrency"] for r in measured],
            [r["throughput_rps"] for r in measured],
            [r["ttft_p99_s"] for r in measured],
        )
    except ValueError:
        return {"knee_clients": None, "theta1_s": None, "theta2_s": None}
    return {
        "knee_clients": k.concurrency,
        "theta1_s": k.thresholds.theta1,
        "theta2_s": k.thresholds.theta2,
    }


def _first(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((r for r in rows if r.get(key) == "saturated"), None)


def describe_thresholds(data: dict[str, Any]) -> str:
    """Where each labeling first calls a deployment saturated, and its throughput there as a
    share of the sweep's ceiling."""
    parts = []
    for name, th in data["thresholds"].items():
        rows = sorted(
            (p for p in data["points"] if p["config"] == name), key=lambda p: p["concurrency"]
        )
        ceiling = max((r["throughput_rps"] or 0.0 for r in rows), default=0.0)
        said = []
        for key, label in (("regime", "at the knee"), ("calm_regime", "the calm multiples")):
            row = _first(rows, key)
            if row is None:
                said.append(f"{label}: never saturated")
            else:
                share = 100 * (row["throughput_rps"] or 0.0) / ceiling if ceiling else 0.0
                said.append(
                    f"{label}: saturated from C = {row['concurrency']} ({share:.0f}% of the "
                    f"throughput ceiling)"
                )
        knee = th.get("knee_clients")
        head = f"{name}: N* = {fmt(knee)} clients" if knee else f"{name}: the sweep misses N*"
        parts.append(head + "; " + ", ".join(said))
    return "; ".join(parts) + "."
