"""Static vs adaptive routing on the simulator, through a load ramp into a saturated hold.

70B FP8 on 1P/2D and 1P/5D. Static keeps τ = 0, ω = 1; adaptive runs the controller (thresholds
5× and 15× a calm baseline P99, the design's policy table). Per phase: poa_hat, poa_routing, TTFT P99,
ITL P99 and throughput, as JSON, plus the ratios adaptive / static in the saturated hold.

    .venv/bin/python -m bench.adaptive [--seeds 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np
from tqdm import tqdm

from cluster.sim.loadgen import Phase
from cluster.sim.profile import load_profile
from cluster.sim.scenario import NamedPhase, calm_baseline_p99, run_scenario
from controller.detector import Thresholds

PROFILE = "b200-llama70b-fp8-tp4"
PHASES = (
    NamedPhase("calm", Phase(30.0, 48, ramp=5.0)),
    NamedPhase("ramp", Phase(60.0, 192, ramp=60.0)),
    NamedPhase("saturated", Phase(60.0, 192)),
)
KEYS = ("poa_hat", "poa_routing", "ttft_p99_s", "itl_p99_s", "throughput_rps")


def _mean_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for phase_rows in zip(*runs, strict=True):
        row = dict(phase_rows[0])
        for key in (*KEYS, "poa_capacity", "cache_hit_rate"):
            row[key] = round(float(np.mean([r[key] for r in phase_rows])), 5)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args(argv)
    profile = load_profile(PROFILE)
    report: dict[str, Any] = {
        "benchmark": "adaptive",
        "profile": PROFILE,
        "phases": [
            {"name": p.name, "duration_s": p.phase.duration, "concurrency": p.phase.concurrency}
            for p in PHASES
        ],
        "topologies": {},
    }
    jobs = [(topo, adaptive) for topo in ("1P/2D", "1P/5D") for adaptive in (False, True)]
    for topology, adaptive in tqdm(jobs, desc="adaptive bench", file=sys.stderr):
        thresholds = Thresholds.calibrated(calm_baseline_p99(profile, topology), 5, 15)
        runs, switches = [], []
        for seed in range(args.seeds):
            result = run_scenario(
                profile, topology, PHASES, adaptive=adaptive, thresholds=thresholds, seed=seed
            )
            runs.append(result.phases)
            switches.append([(c.t, c.regime.label) for c in result.changes[1:]])
        entry = report["topologies"].setdefault(topology, {})
        entry["adaptive" if adaptive else "static"] = {
            "phases": _mean_rows(runs),
            "regime_switches": switches,
            "thresholds_s": [round(thresholds.theta1, 4), round(thresholds.theta2, 4)],
        }
    for entry in report["topologies"].values():
        static = entry["static"]["phases"][-1]
        adaptive = entry["adaptive"]["phases"][-1]
        entry["saturated_adaptive_over_static"] = {
            key: round(adaptive[key] / static[key], 4) if static[key] else None for key in KEYS
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
