"""``traces``: the controller's arms on production traces (docs/design.md §8 "Real traces").

Mooncake's conversation trace (long prompts whose 512-token blocks repeat) and Azure's 2023 code
trace (short prompts, bursts, no prefix information: unique prompts) replayed open loop on
Llama-3.1-70B FP8 at 1P/5D (the embedded default and the source study's deployment: one prefill
worker, so no prefill routing choice) and 3P/3D (the same six workers, three to choose from in
each pool). Four arms on
the same requests: ``static:0,1`` (cache affinity, the policy table's calm row held),
``static:0.8,0.1`` (its saturated row held), ``adaptive`` (the controller with the study's table,
its thresholds 5× and 15× the TTFT P99 of the trace's own requests sent one at a time on
this deployment) and ``adaptive+resplit`` (the same with the P/D re-split lever). Loads are chosen
from the deployment's measured capacity, not tuned: X_max, the throughput of a saturating closed
loop (64 clients) sending the trace's first 512 requests in turn, and the speed-up that brings
the window's mean arrival rate to f·X_max for f = 0.5 (half load), 0.9 (near the knee) and 1.3
(overloaded). Per arm and load: TTFT P50/P99, ITL P50, throughput, prefix reuse (prompt tokens
from a KV cache), re-splits, and the arm's TTFT P99 over ``static:0,1``'s on the same seed (a
paired ratio), mean ± 1 s.e. over prompt-synthesis seeds.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from cluster.sim.profile import load_profile
from cluster.sim.replay import (
    PROBE_CLIENTS,
    PROBE_S,
    PROBE_WARMUP_S,
    parse_arm,
    replay_on_sim,
    trace_calm_thresholds,
    trace_capacity_rps,
)
from cluster.traces import ReplayWindow, TracePrompts, TraceReader, trace_requests
from controller.detector import Thresholds
from disaggctl.experiment.base import Plan, Settings
from disaggctl.experiment.checks import same_run_of
from disaggctl.experiment.fanout import Job, available_cores
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, mean_se, summarise
from disaggctl.experiment.traces_plots import plot_loads

NAME = "traces"
TITLE = "traces: the controller's arms on production traces"
# Wall seconds per replayed trace second on the reference machine (runner.estimate).
SECONDS_PER_UNIT = 0.012

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "traces"
SHARED = ROOT.parent / "shared" / "traces"
PROFILE = "b200-llama70b-fp8-tp4"
TOPOLOGIES = ("1P/5D", "3P/3D")
TRACES = {  # name: (the full trace's file, the shipped slice's)
    "mooncake": ("mooncake_conversation.jsonl", "mooncake_conversation_10min.jsonl"),
    "azure-code": ("azure_llm_2023_code.csv", "azure_code_2023_10min.csv"),
}
ARMS = ("static:0,1", "static:0.8,0.1", "adaptive", "adaptive+resplit")
LOADS = (0.5, 0.9, 1.3)  # f: the arrival rate as a share of the measured capacity X_max
PROBE_REQUESTS = 512  # the capacity probe sends the trace's first requests in turn
CALM_REQUESTS = 256
KEYS = (
    "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "throughput_rps", "prefix_reuse", "resplits",
    "regime_changes",
)  # fmt: skip
# A paired ratio within 1% of 1 is a tie whatever its standard error (identical decisions give
# an error of 0, and two arms that differ in a handful of requests are no verdict).
TIE = 0.01


def trace_path(name: str, settings: Settings) -> Path:
    """The full trace in ``settings.traces`` (default ``../shared/traces``), else the slice."""
    full, shipped = TRACES[name]
    folder = Path(settings.traces) if settings.traces else SHARED
    return folder / full if (folder / full).is_file() else SHIPPED / shipped


def capacity_rps(path: Path, topology: str, seed: int = 0) -> float:
    """X_max of this deployment for the trace's first ``PROBE_REQUESTS`` requests
    (``cluster.sim.replay.trace_capacity_rps``)."""
    reader = TraceReader(path)
    first = list(trace_requests(reader, ReplayWindow(max_requests=PROBE_REQUESTS)))
    prompts = TracePrompts(reader.block_tokens, seed=seed)
    return trace_capacity_rps(load_profile(PROFILE), topology, first, prompts, seed)


ProbeKey = tuple[str, int, int, str]  # (resolved path, size, mtime ns, topology)
_PROBED: dict[ProbeKey, tuple[float, Thresholds]] = {}


def probes(pairs: Sequence[tuple[Path, str]]) -> dict[tuple[Path, str], tuple[float, Thresholds]]:
    """(X_max, the calm thresholds) of each (trace, topology): the same for every window and
    seed, so a process measures each once per file (a plan for ``--quick``, the full run and
    ``--trials`` share them; a file changed in place is measured again). The missing ones run
    in parallel, one process per core: they are simulations, like the jobs."""
    keys = {pair: _key(*pair) for pair in pairs}
    missing = sorted({k for k in keys.values() if k not in _PROBED})
    if len(missing) > 1 and available_cores() > 1:
        ctx = multiprocessing.get_context("spawn")
        workers = min(len(missing), available_cores())
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            _PROBED.update(zip(missing, pool.map(_probe, missing), strict=True))
    else:
        _PROBED.update((k, _probe(k)) for k in missing)
    return {pair: _PROBED[k] for pair, k in keys.items()}


def _key(path: Path, topology: str) -> ProbeKey:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns, topology)


def _probe(key: ProbeKey) -> tuple[float, Thresholds]:
    path, _, _, topology = key
    reader = TraceReader(Path(path))
    calm = list(trace_requests(reader, ReplayWindow(max_requests=CALM_REQUESTS)))
    prompts = TracePrompts(reader.block_tokens)
    thresholds = trace_calm_thresholds(load_profile(PROFILE), topology, calm, prompts)
    return capacity_rps(Path(path), topology), thresholds


def window_rate(path: Path, window_s: float) -> tuple[float, int]:
    """(mean arrival rate, requests) over the trace's first ``window_s`` seconds."""
    count = sum(1 for _ in trace_requests(TraceReader(path), ReplayWindow(duration_s=window_s)))
    return count / window_s, count


def plan(settings: Settings) -> Plan:
    window_s = 120.0 if settings.quick else 1200.0
    traces: dict[str, dict[str, Any]] = {}
    jobs: list[Job] = []
    paths = {name: trace_path(name, settings) for name in TRACES}
    measured = probes([(path, topology) for path in paths.values() for topology in TOPOLOGIES])
    for name, path in paths.items():
        rate, count = window_rate(path, window_s)
        for topology in TOPOLOGIES:
            x_max, t = measured[(path, topology)]
            speedups = {f: round(f * x_max / rate, 3) for f in LOADS}
            traces[f"{name} {topology}"] = {
                "file": _shown(path),
                "requests in the window": count,
                "mean rate (req/s)": round(rate, 3),
                "capacity X_max (req/s)": round(x_max, 3),
                "speed-ups (f: ×)": speedups,
                "thresholds θ1, θ2 (s)": (round(t.theta1, 3), round(t.theta2, 3)),
            }
            for f, speedup in speedups.items():
                for arm in ARMS:
                    for seed in settings.seeds:
                        jobs.append(Job(
                            "disaggctl.experiment.traces:run_arm",
                            {"trace": str(path), "topology": topology, "window_s": window_s,
                             "speedup": speedup, "load": f, "arm": arm, "seed": seed,
                             "thresholds": (t.theta1, t.theta2)},
                            units=window_s / speedup,
                        ))  # fmt: skip
    setup = {
        "profile": PROFILE,
        "topologies": list(TOPOLOGIES),
        "window (trace s, from the start)": window_s,
        "arms": list(ARMS),
        "loads f (of X_max)": list(LOADS),
        "capacity probe": f"closed loop of {PROBE_CLIENTS} clients, the first {PROBE_REQUESTS} "
        f"requests in turn, {PROBE_S:g} s (the first {PROBE_WARMUP_S:g} s unmeasured)",
        "calm baseline": "1 client, the first 256 requests in turn, 600 s; θ = 5×, 15× its "
        "TTFT P99",
        "trials (prompt-synthesis seeds)": list(settings.seeds),
        "traces": traces,
    }
    return Plan(setup, jobs)


def _shown(path: Path) -> str:
    """The trace's path as a reader of the report finds it (from the project's parent)."""
    return str(path.relative_to(ROOT.parent)) if path.is_relative_to(ROOT.parent) else str(path)


def run_arm(
    *,
    trace: str,
    topology: str,
    window_s: float,
    speedup: float,
    load: float,
    arm: str,
    seed: int,
    thresholds: tuple[float, float],
) -> dict[str, Any]:
    """One arm on one trace at one load (a job)."""
    policy, _, lever = arm.partition("+")
    reader = TraceReader(trace)
    requests = trace_requests(reader, ReplayWindow(duration_s=window_s, speedup=speedup))
    run = replay_on_sim(
        requests, TracePrompts(reader.block_tokens, seed=seed), load_profile(PROFILE), topology,
        parse_arm(policy, resplit=lever == "resplit"), seed=seed,
        thresholds=Thresholds(*thresholds),
    )  # fmt: skip
    summary = run.summary()
    return {k: summary[k] for k in (*KEYS, "requests", "completed")}


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    runs: dict[tuple[str, float, str], dict[int, dict[str, Any]]] = {}
    for job, res in zip(plan.jobs, results, strict=True):
        trace = next(n for n in TRACES if job.kwargs["trace"].endswith(tuple(TRACES[n])))
        name = f"{trace} {job.kwargs['topology']}"
        key = (name, job.kwargs["load"], job.kwargs["arm"])
        runs.setdefault(key, {})[job.kwargs["seed"]] = res
    same: dict[tuple[str, float, str], str] = {}
    for name, load in dict.fromkeys((n, f) for n, f, _ in runs):
        arms = {
            a: [by_seed[s] for s in sorted(by_seed)]
            for (n, f, a), by_seed in runs.items()
            if (n, f) == (name, load)
        }
        same |= {(name, load, a): b for a, b in same_run_of(arms, KEYS).items()}
    rows = []
    for (name, load, arm), by_seed in runs.items():
        base = runs[(name, load, ARMS[0])]
        ratios = [
            r["ttft_p99_s"] / base[s]["ttft_p99_s"]
            for s, r in by_seed.items()
            if base[s]["ttft_p99_s"] and math.isfinite(base[s]["ttft_p99_s"])
        ]
        ratio, ratio_se = mean_se(ratios)
        rows.append({
            "trace": name, "load": load,
            "speedup": plan.setup["traces"][name]["speed-ups (f: ×)"][load], "arm": arm,
            **summarise(list(by_seed.values()), KEYS),
            "p99_over_static": ratio, "p99_over_static_se": ratio_se,
            "same_as": same.get((name, load, arm)),  # the arm whose run this is, if any
        })  # fmt: skip
    return {"rows": rows}


def describe_same_runs(repeated: list[dict[str, Any]]) -> str:
    """Which arms are another's run, and why, from their own figures."""
    if not repeated:
        return "No arm repeats another's run."
    parts = []
    for r in repeated:
        why = (
            "its controller never left the policy it starts with"
            if not r["regime_changes"] and not r["resplits"]
            else "its controller never moved a worker"
            if not r["resplits"]
            else "the two decided alike"
        )
        parts.append(f"{r['trace']} at f = {r['load']:g}: {r['arm']} is the run of "
                     f"{r['same_as']} ({why})")  # fmt: skip
    return (
        "Arms shown once because they are one run (every figure equal in every seed, which "
        "the deterministic simulator gives only to runs that decided alike): "
        + "; ".join(parts) + "."
    )


def verdicts(data: dict[str, Any]) -> str:
    """Where each arm wins and loses against ``static:0,1`` at TTFT P99 (beyond 2 s.e. and
    beyond ``TIE``)."""
    lines = []
    for name in dict.fromkeys(r["trace"] for r in data["rows"]):
        for arm in ARMS[1:]:
            won: list[str] = []
            lost: list[str] = []
            tied: list[str] = []
            for r in data["rows"]:
                if (r["trace"], r["arm"]) != (name, arm) or r["p99_over_static"] is None:
                    continue
                ratio, se = r["p99_over_static"], r["p99_over_static_se"] or 0.0
                where = f"f = {r['load']:g} ({fmt(ratio)}×)"
                if abs(ratio - 1) <= TIE or abs(ratio - 1) <= 2 * se:
                    tied.append(where)
                else:
                    (lost if ratio > 1 else won).append(where)
            parts = [
                f"loses at {', '.join(lost)}" if lost else "loses nowhere",
                f"wins at {', '.join(won)}" if won else "wins nowhere",
            ]
            if tied:
                parts.append(f"level with static:0,1 (within 2 s.e. or 1%) at {', '.join(tied)}")
            lines.append(f"- {name}, {arm}: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def regimes(data: dict[str, Any], setup: dict[str, Any]) -> str:
    """Whether the controller acted at all: the adaptive arms that never changed regime."""
    still = [
        f"{r['trace']} f = {r['load']:g}"
        for r in data["rows"]
        if r["arm"].startswith("adaptive") and not r["regime_changes"]
    ]
    moved = [
        f"{r['trace']} f = {r['load']:g} ({fmt(r['regime_changes'])} changes, "
        f"{fmt(r['resplits'])} re-splits)"
        for r in data["rows"]
        if r["arm"] == "adaptive+resplit" and r["regime_changes"]
    ]
    theta = "; ".join(
        f"{name}: θ1 {fmt(t['thresholds θ1, θ2 (s)'][0])} s" for name, t in setup["traces"].items()
    )
    return (
        f"The adaptive arms changed regime at {', '.join(moved) or 'no load'}; they stayed "
        f"`below`, acting as static:0,1 does, at {', '.join(dict.fromkeys(still)) or 'no load'}"
        ". "
        f"Their thresholds are 5× and 15× the calm TTFT P99 of each trace's own requests "
        f"({theta}): on Mooncake the calm P99 is the prefill of its longest prompts (tens of "
        f"thousands of tokens) with nobody ahead, so a queue must add tens of seconds before the "
        f"detector reads it."
    )


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    write_csv(folder / "traces_rows.csv", data["rows"])
    section.text(
        "Per trace, its window, capacity and the speed-ups chosen from it:\n\n"
        + markdown_table(
            (
                "trace, deployment",
                "file",
                "requests",
                "mean req/s",
                "X_max req/s",
                "speed-ups",
                "θ1, θ2 s",
            ),
            [
                (
                    n,
                    t["file"],
                    t["requests in the window"],
                    t["mean rate (req/s)"],
                    t["capacity X_max (req/s)"],
                    ", ".join(f"{f:g}: ×{s:g}" for f, s in t["speed-ups (f: ×)"].items()),
                    ", ".join(fmt(x) for x in t["thresholds θ1, θ2 (s)"]),
                )
                for n, t in setup["traces"].items()
            ],
        )
    )
    header = ("trace, deployment", "f", "speed-up", "arm", "TTFT P50 s", "TTFT P99 s",
              "ITL P50 s", "req/s", "prefix reuse", "regime changes", "re-splits",
              "P99 / static:0,1")  # fmt: skip
    figures = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "throughput_rps", "prefix_reuse",
               "regime_changes", "resplits", "p99_over_static")  # fmt: skip
    table = [
        (r["trace"], f"{r['load']:g}", f"{r['speedup']:g}", r["arm"],
         *((stat_cell(r, k) for k in figures) if r["same_as"] is None
           else (f"the run of {r['same_as']}",) * len(figures)))
        for r in data["rows"]
    ]  # fmt: skip
    repeated = [r for r in data["rows"] if r["same_as"] is not None]
    section.text("Per arm and load, mean ± 1 s.e. over the seeds:\n\n"
                 + markdown_table(header, table) + "\n\n"
                 + describe_same_runs(repeated))  # fmt: skip
    section.text("Where the controller's arms win and lose (TTFT P99, paired by seed):\n\n"
                 + verdicts(data) + "\n\n" + regimes(data, setup))  # fmt: skip
    for name in setup["traces"]:
        file = f"traces_{name.replace(' ', '_').replace('/', '')}.png"
        plot_loads(data, name, ARMS, LOADS, folder / file)
        section.figure(
            file,
            f"TTFT P99 by load, {name}",
            f"Each arm's TTFT P99 (± 1 s.e.) "
            f"at the three loads of {name}; the verdicts above are the paired ratios.",
        )
