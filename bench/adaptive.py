"""Static vs adaptive routing vs adaptive routing + re-split, on the simulator, through
calm → ramp → saturated hold → spike → calm (docs/design.md §4, §6).

Cases (``CASES``), each over ``--seeds`` seeds:

- ``fresh-*``: the source study's topologies (70B FP8 1P/2D and 1P/5D, 340B FP8 1P/2D) with one
  router that sees load exactly and at once. Reported as they come: no target.
- ``stale-*``: four router replicas (ingress/frontend replicas behind a load balancer), each
  with its own KV index and load view, fed by load reports every 250 ms (``STALE``), on 70B
  1P/5D and 2P/4D. Target: adaptive / static ≤ 0.8 for saturated-hold poa_hat and TTFT P99, at a
  throughput cost of at most 15% (adaptive / static ≥ 0.85).
- ``resplit-1P/5D``: 70B 1P/5D with the controller's second lever. Target: saturated-hold TTFT
  P99 at least 2× lower than static (re-split / static ≤ 0.5).

Every adaptive run must also reach the ``saturated`` regime (the ramp crosses the knee). Static
keeps τ = 0, ω = 1 on every router; adaptive runs the controller with thresholds 5× and 15× a
calm baseline P99 measured on the same deployment, the design's policy table, and (re-split)
``ResplitSettings()``'s defaults. Nothing here is tuned toward a target: the view settings are
the issue's, the delay is a NATS hop plus the engine's per-iteration event batching.

JSON: per case, arm and phase (means over seeds): poa_hat and its factors, TTFT P99, ITL P99,
throughput, pools; regime switches and re-splits per seed; and ``summary``: per case, the
saturated-hold ratios ``over_static`` of the compared arm (judged), and, reported beside them,
``late_hold_over_static``: TTFT P99 over the requests arriving in the hold's second half, the
same window for every arm. A re-split needs the regime's dwell, its own dwell, a drain and the
profile's role switch (30 s on 70B) before a new prefill worker serves; the requests that
arrive meanwhile are in the whole hold's P99, and the second half shows the split it reached;
``before_new_prefill`` (re-split arms) says how many: when the first added prefill worker served
(seconds into the hold), the share of the hold's arrivals before then and their TTFT P99 over
static's whole-hold P99.
``met`` says whether every target holds; the exit status is 1 when one does not.

    .venv/bin/python -m bench.adaptive [--seeds 3] [--reduced] [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np

from bench.common import add_output_flags, at_least, at_most, emit, holds, ratio, verdict
from cluster.progress import progress_bar
from cluster.sim.loadgen import Phase
from cluster.sim.profile import load_profile
from cluster.sim.records import summarize
from cluster.sim.scenario import NamedPhase, ScenarioResult, calm_baseline_p99, run_scenario
from cluster.sim.views import ViewSettings
from controller.detector import Thresholds
from controller.resplit import ResplitSettings

LLAMA, NEMOTRON = "b200-llama70b-fp8-tp4", "b200-nemotron340b-fp8-tp8"
FRESH = ViewSettings()
# Four replicas, load reports every 250 ms (the deployment); 10 ms for a report or a KV
# event to cross NATS and the engine's per-iteration event batching.
STALE = ViewSettings.stale(replicas=4, report_period_s=0.25, delay_s=0.01)

PHASES = (
    NamedPhase("calm", Phase(30.0, 48, ramp=5.0)),
    NamedPhase("ramp", Phase(60.0, 192, ramp=60.0)),
    # Long enough for a re-split to finish and show: dwell 5 s + drain (one E2E, ~3 s) + the
    # 70B profile's 30 s role switch, as a real saturation episode would last.
    NamedPhase("saturated", Phase(90.0, 192)),
    NamedPhase("spike", Phase(15.0, 384, ramp=1.0)),
    NamedPhase("calm-after", Phase(60.0, 48)),
)
# The reduced form `make test` runs: the same shape, shorter, one seed, two cases.
REDUCED_PHASES = (
    NamedPhase("calm", Phase(10.0, 48, ramp=2.0)),
    NamedPhase("ramp", Phase(20.0, 192, ramp=20.0)),
    NamedPhase("saturated", Phase(50.0, 192)),
    NamedPhase("spike", Phase(5.0, 384, ramp=1.0)),
    NamedPhase("calm-after", Phase(10.0, 48)),
)
HOLD = "saturated"
KEYS = ("poa_hat", "poa_routing", "poa_capacity", "ttft_p99_s", "itl_p99_s", "throughput_rps")
RATIO_KEYS = ("poa_hat", "ttft_p99_s", "itl_p99_s", "throughput_rps")

STALE_RATIO_MAX = 0.8  # poa_hat and TTFT P99, adaptive / static
STALE_THROUGHPUT_MIN = 0.85  # at most 15% throughput cost
RESPLIT_TTFT_MAX = 0.5  # at least 2x lower TTFT P99


@dataclass(frozen=True)
class Case:
    name: str
    profile: str
    topology: str
    views: ViewSettings
    arms: tuple[str, ...]
    compare: str  # the arm whose ratios over static make the summary

    @property
    def kind(self) -> str:
        return self.name.split("-", 1)[0]


CASES = (
    Case("fresh-1P/2D", LLAMA, "1P/2D", FRESH, ("static", "adaptive"), "adaptive"),
    Case("fresh-1P/5D", LLAMA, "1P/5D", FRESH, ("static", "adaptive"), "adaptive"),
    Case("fresh-340B-1P/2D", NEMOTRON, "1P/2D", FRESH, ("static", "adaptive"), "adaptive"),
    Case("stale-1P/5D", LLAMA, "1P/5D", STALE, ("static", "adaptive"), "adaptive"),
    Case("stale-2P/4D", LLAMA, "2P/4D", STALE, ("static", "adaptive"), "adaptive"),
    Case("resplit-1P/5D", LLAMA, "1P/5D", FRESH, ("static", "adaptive", "resplit"), "resplit"),
)
REDUCED_CASES = ("stale-2P/4D", "resplit-1P/5D")


def run_arm(
    case: Case, arm: str, seed: int, phases: Sequence[NamedPhase], thresholds: Thresholds
) -> dict[str, Any]:
    """One (case, arm, seed): the figures the report keeps (``arm_figures``)."""
    return arm_figures(arm_scenario(case, arm, seed, phases, thresholds))


def arm_scenario(
    case: Case, arm: str, seed: int, phases: Sequence[NamedPhase], thresholds: Thresholds
) -> ScenarioResult:
    """The simulation of one (case, arm, seed), whole (its timeline, records, pool steps)."""
    return run_scenario(
        load_profile(case.profile),
        case.topology,
        phases,
        adaptive=arm != "static",
        thresholds=thresholds,
        seed=seed,
        views=case.views,
        resplit=ResplitSettings() if arm == "resplit" else None,
    )


def arm_figures(result: ScenarioResult) -> dict[str, Any]:
    """Per phase figures, the hold's second-half TTFT P99, regime switches and re-splits."""
    hold = _hold(result.phases)
    late = summarize(
        result.records, (hold["start_s"] + hold["end_s"]) / 2, hold["end_s"], "arrival"
    )
    return {
        "phases": result.phases,
        "late_hold_ttft_p99_s": late.ttft_p99_s,
        "before_new_prefill": _before_new_prefill(result, hold["start_s"], hold["end_s"]),
        "regime_switches": [(round(c.t, 1), c.regime.label) for c in result.changes[1:]],
        "resplits": [
            {
                "t": round(d.t, 1),
                "to": d.to_role,
                "from": str(d.before),
                "goal": str(d.goal),
                "workers": d.workers,
            }
            for d in result.resplits
        ],
        "pool_steps": [
            (round(p.t, 1), p.action, p.worker, f"{p.prefill}P/{p.decode}D")
            for p in result.pool_changes
        ],
    }


def _before_new_prefill(result: ScenarioResult, start: float, end: float) -> dict[str, Any] | None:
    """The hold's requests that arrived before the first prefill worker a re-split added was
    serving: when it served (seconds into the hold), their share of the hold's arrivals and
    their TTFT P99. They are served by the split the hold began with, whatever the lever does
    later; once they are more than 1% of the hold, the hold's P99 is theirs. None: no move up."""
    ups = [d.t for d in result.resplits if d.to_role == "prefill"]
    warm = [p.t for p in result.pool_changes if ups and p.action == "warm" and p.t >= ups[0]]
    if not warm:
        return None
    serving = min(max(warm[0], start), end)
    arrived = [r for r in result.records if start <= r.arrival < end]
    before = summarize(result.records, start, serving, "arrival") if serving > start else None
    return {
        "serving_at_hold_s": round(serving - start, 1),
        "share_of_hold": round(sum(r.arrival < serving for r in arrived) / max(len(arrived), 1), 4),
        "ttft_p99_s": None if before is None else before.ttft_p99_s,
    }


def _mean_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for phase_rows in zip(*runs, strict=True):
        row = dict(phase_rows[0])
        for key in (*KEYS, "cache_hit_rate"):
            values = [r[key] for r in phase_rows if r[key] is not None]
            row[key] = round(float(np.mean(values)), 5) if values else None
        rows.append(row)
    return rows


def _hold(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["phase"] == HOLD)


def summarize_cases(cases: dict[str, Any]) -> dict[str, Any]:
    """Per case: the compared arm's saturated-hold figures over static's."""
    summary = {}
    for name, entry in cases.items():
        static, other = _hold(entry["static"]["phases"]), _hold(entry[entry["compare"]]["phases"])
        summary[name] = {
            "arm": entry["compare"],
            "over_static": {
                key: round(other[key] / static[key], 4) if static[key] else None
                for key in RATIO_KEYS
            },
            "late_hold_over_static": {
                "ttft_p99_s": ratio(
                    entry[entry["compare"]].get("late_hold_ttft_p99_s"),
                    entry["static"].get("late_hold_ttft_p99_s"),
                )
            },
            "resplits": sum(len(r) for r in entry[entry["compare"]].get("resplits", [])),
        }
        befores = [b for b in entry[entry["compare"]].get("before_new_prefill", []) if b]
        if befores:  # why a whole-hold ratio can stay near 1 while the late hold's falls
            p99s = [b["ttft_p99_s"] for b in befores if b["ttft_p99_s"] is not None]
            summary[name]["before_new_prefill"] = {
                "serving_at_hold_s": round(float(np.mean([b["serving_at_hold_s"]
                                                          for b in befores])), 1),
                "share_of_hold": round(float(np.mean([b["share_of_hold"] for b in befores])), 4),
                "ttft_p99_over_static": ratio(float(np.mean(p99s)) if p99s else None,
                                              static["ttft_p99_s"]),
            }  # fmt: skip
    return summary


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The targets (module docstring) from ``report["cases"]`` and ``report["summary"]``."""
    cases, summary = report["cases"], report["summary"]
    undetected = [
        f"{name}:{arm}"
        for name, entry in cases.items()
        for arm in entry["arms"]
        if arm != "static"
        and not all(
            any(label == "saturated" for _, label in run) for run in entry[arm]["regime_switches"]
        )
    ]
    targets: dict[str, Any] = {
        "saturated_regime_detected": holds(
            bool(cases) and not undetected,
            "every adaptive run switches to saturated",
            missed=undetected,
        )
    }
    for name, row in summary.items():
        ratios = row["over_static"]
        if name.startswith("stale-"):
            targets[f"{name}:poa_hat"] = at_most(ratios["poa_hat"], STALE_RATIO_MAX)
            targets[f"{name}:ttft_p99_s"] = at_most(ratios["ttft_p99_s"], STALE_RATIO_MAX)
            targets[f"{name}:throughput_rps"] = at_least(
                ratios["throughput_rps"], STALE_THROUGHPUT_MIN
            )
        elif name.startswith("resplit-"):
            targets[f"{name}:ttft_p99_s"] = at_most(ratios["ttft_p99_s"], RESPLIT_TTFT_MAX)
    return verdict(targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm (default 3)")
    parser.add_argument(
        "--reduced",
        action="store_true",
        help=f"one seed, shorter phases, cases {', '.join(REDUCED_CASES)} (what make test runs)",
    )
    parser.add_argument("--case", action="append", help="run only this case (repeatable)")
    add_output_flags(parser)
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    phases = REDUCED_PHASES if args.reduced else PHASES
    seeds = 1 if args.reduced else args.seeds
    wanted = args.case or (REDUCED_CASES if args.reduced else [c.name for c in CASES])
    unknown = sorted(set(wanted) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {[c.name for c in CASES]}")
    chosen = [c for c in CASES if c.name in wanted]
    jobs = [(c, arm, seed) for c in chosen for arm in c.arms for seed in range(seeds)]
    bar = progress_bar(jobs, progress=args.progress, quiet=args.quiet, desc="adaptive bench")
    thresholds: dict[str, Thresholds] = {}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for case, arm, seed in bar:
        if case.name not in thresholds:
            baseline = calm_baseline_p99(
                load_profile(case.profile), case.topology, views=case.views
            )
            thresholds[case.name] = Thresholds.calibrated(baseline)
        runs.setdefault((case.name, arm), []).append(
            run_arm(case, arm, seed, phases, thresholds[case.name])
        )
    cases: dict[str, Any] = {}
    for case in chosen:
        entry: dict[str, Any] = {
            "profile": case.profile,
            "topology": case.topology,
            # The deployment this case simulates, as a serve config a user can run, and the
            # simulated bus's delay.
            "views": case.views.record(),
            "arms": list(case.arms),
            "compare": case.compare,
            "thresholds_s": [
                round(thresholds[case.name].theta1, 4),
                round(thresholds[case.name].theta2, 4),
            ],
        }
        for arm in case.arms:
            arm_runs = runs[(case.name, arm)]
            entry[arm] = {
                "phases": _mean_rows([r["phases"] for r in arm_runs]),
                "late_hold_ttft_p99_s": round(
                    float(np.mean([r["late_hold_ttft_p99_s"] for r in arm_runs])), 5
                ),
                "regime_switches": [r["regime_switches"] for r in arm_runs],
                "resplits": [r["resplits"] for r in arm_runs],
                "pool_steps": [r["pool_steps"] for r in arm_runs],
                "before_new_prefill": [r["before_new_prefill"] for r in arm_runs],
            }
        cases[case.name] = entry
    report: dict[str, Any] = {
        "phases": [
            {"name": p.name, "duration_s": p.phase.duration, "concurrency": p.phase.concurrency}
            for p in phases
        ],
        "seeds": seeds,
        "reduced": args.reduced,
        "cases": cases,
    }
    report["summary"] = summarize_cases(cases)
    return emit("adaptive", judge(report), report, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
