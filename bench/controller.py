"""The controller on real traces, in two simulators, against static splits and Dynamo's planner
(docs/design.md §4 "A re-split plans from the traffic"; ``disaggctl experiment controller``
runs the same arms over several seeds and writes docs/results.md's section).

Each trace's first ``window_s`` seconds at the speed-up [18] chose where 1P/5D saturates (1.3
times the capacity our simulator measures for 1P/5D: Mooncake ×0.871, Azure code ×5.873;
docs/results.md "traces"), Llama-3.1-70B B200 TP4 workers, a fixed budget of six:

- our simulator (``cluster.sim.replay``): every split 1P/5D … 5P/1D at τ 0 ω 1 and at the
  study's saturated row τ 0.8 ω 0.1 (the best of these ten is the hindsight-best), the study's
  table (``adaptive``) and ours routing only (``evidence``) on every split, and from 1P/5D ours
  routing + re-split (``evidence+resplit``: the re-split planned from the traffic,
  controller/traffic.py) and Dynamo's planner (its throughput and latency targets,
  ``max_gpu_budget`` six workers), which sizes the pools through ``cluster.sim.scaling``;
- Dynamo's replay (``dynamo._core.run_mocker_trace_replay``, its engines timed by the same
  profile's tables, its KV router fixed for the whole run, so no routing arm runs there): the
  same static arms, and from 1P/5D Dynamo's planner and ours
  (``cluster.backends.dynamo.scaling.ResplitScaling``, the same decision core).

A new worker, or one changing role, starts after the profile's role switch in both; a worker the
planner gives up parks and stops counting in the worker-seconds. Ours runs once more, in both,
on engines that serve both roles without a restart (``KV_BOTH``: the profile's
``kv_both_switch_s``, its reason written in the profile). Both controllers plan for the
goodput's SLO: TTFT ≤ 2 s and ITL ≤ 50 ms, at the 99% the P99 targets read (``SLO``). Per arm:
TTFT P50/P99, goodput (the share of requests with TTFT ≤ 2 s and mean ITL ≤ 50 ms),
worker-seconds (TP groups held × seconds) and moves. Targets, ratios within one run, each
simulator on its own: on Mooncake, ours (routing + re-split) TTFT P99 ≤ 1.25× the
hindsight-best static's (with either switch) and ≤ 0.8× Dynamo's planner's (each target); on
both traces, routing only never more than 5% worse than static τ 0 ω 1 on any split; on Azure
code, ours' goodput ≥ the planner's (each target).

Dynamo's planner imports two modules of NVIDIA's ``aisimulate`` packages, which the registry
does not serve: ``bench.dynamo_planner`` (and nothing in the product) installs import-time
placeholders for them; its throughput and latency targets never call them. Its other imports
come with ``make planner``; without them its arms report what is missing and its targets are
missed.

    .venv/bin/python -m bench.controller [--window 1200] [--trace mooncake|azure-code] [--quiet]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import add_output_flags, at_least, at_most, emit, holds, ratio, verdict
from bench.dynamo_planner import (
    PLANNER_TARGETS,
    engine_args,
    planner_config,
    planner_missing,
    planner_moves,
    planner_policy,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
# name: (file, speed-up): 1.3 × our simulator's 1P/5D capacity for the trace's first 1,200 s,
# as [18]'s experiment measured it (docs/results.md "traces").
TRACES = {
    "mooncake": ("mooncake_conversation.jsonl", 0.871),
    "azure-code": ("azure_llm_2023_code.csv", 5.873),
}
PROFILE = "b200-llama70b-fp8-tp4"
START = "1P/5D"
STATIC = ("1P/5D", "2P/4D", "3P/3D", "4P/2D", "5P/1D")
POLICIES = ("static:0,1", "static:0.8,0.1")  # cache affinity; the study's saturated row
WORKERS = 6
SLA_TTFT_S, SLA_ITL_S, SLA_ATTAINMENT = 2.0, 0.050, 0.99
KV_BOTH = "ours routing+resplit (kv_both)"  # the profile's switch without a restart
OURS = {  # arm: (replay policy, re-split)
    "study table": ("adaptive", False),
    "ours routing": ("evidence", False),
    "ours routing+resplit": ("evidence", True),
    KV_BOTH: ("evidence", True),
}
CALM_REQUESTS = 256


# The arms that move the split from START, in both simulators.
MOVING = (*PLANNER_TARGETS, "ours routing+resplit", KV_BOTH)


def arms() -> list[tuple[str, str, str]]:
    """(simulator, arm, topology) of every run one trace gets: each split at each static
    policy in both simulators; in ours, the study's table and ours routing only on each split
    too (routing's effect where the split is right); the arms that move the split from 1P/5D."""
    static = [(sim, p, t) for sim in ("ours", "dynamo") for t in STATIC for p in POLICIES]
    routing = [("ours", a, t) for t in STATIC for a in ("study table", "ours routing")]
    moving = [(sim, a, START) for sim in ("ours", "dynamo") for a in MOVING]
    return [*static, *routing, *moving]


def arm_key(arm: str, topology: str) -> str:
    """How a run is named in the results: ``static:0,1 2P/4D``, ``ours routing 3P/3D``; an arm
    that moves the split by its own name (it starts from 1P/5D)."""
    return arm if arm in MOVING else f"{arm} {topology}"


def profile_for(arm: str) -> Any:
    """The profile an arm runs: the kv_both arm's switches without a restart
    (``HardwareProfile.with_kv_both``), every other the profile's own restart."""
    from cluster.sim.profile import load_profile

    profile = load_profile(PROFILE)
    return profile.with_kv_both() if arm == KV_BOTH else profile


def slo() -> Any:
    from games.pd_allocation import SloTargets

    return SloTargets(ttft_s=SLA_TTFT_S, itl_s=SLA_ITL_S, attainment=SLA_ATTAINMENT)


def thresholds(trace: str) -> tuple[float, float]:
    """The detector's θ1, θ2 for this trace on 1P/5D (``cluster.sim.replay``)."""
    from cluster.sim.profile import load_profile
    from cluster.sim.replay import trace_calm_thresholds
    from cluster.traces import TracePrompts, TraceReader
    from cluster.traces.window import ReplayWindow, trace_requests

    reader = TraceReader(trace)
    calm = list(trace_requests(reader, ReplayWindow(max_requests=CALM_REQUESTS)))
    t = trace_calm_thresholds(load_profile(PROFILE), START, calm, TracePrompts(reader.block_tokens))
    return t.theta1, t.theta2


def _figures(
    ttft: Sequence[float], good: int, total: int, worker_s: float, moves: int
) -> dict[str, Any]:
    import numpy as np

    return {
        "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft else math.nan,
        "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else math.nan,
        "goodput": good / total if total else math.nan,
        "worker_s": worker_s,
        "moves": moves,
        "requests": total,
    }


def run_ours(
    trace: str,
    window_s: float,
    speedup: float,
    arm: str,
    topology: str,
    seed: int,
    theta: tuple[float, float],
) -> dict[str, Any]:
    """One arm on our simulator: figures over every request of the window. Dynamo's planner
    sizes the pools of a static τ 0 ω 1 arm through ``cluster.sim.scaling``."""
    from cluster.sim.replay import parse_arm, replay_on_sim
    from cluster.traces import TracePrompts, TraceReader
    from cluster.traces.window import ReplayWindow, trace_requests
    from controller.detector import Thresholds

    reader = TraceReader(trace)
    requests = trace_requests(reader, ReplayWindow(duration_s=window_s, speedup=speedup))
    profile = profile_for(arm)
    policy, resplit = OURS.get(arm, (arm, False))
    replay = functools.partial(
        replay_on_sim, requests, TracePrompts(reader.block_tokens, seed=seed), profile,
        topology, seed=seed, thresholds=Thresholds(*theta), slo=slo(),
    )  # fmt: skip
    if arm in PLANNER_TARGETS:
        missing = planner_missing()
        if missing is not None:
            return {"missing": missing}
        target = PLANNER_TARGETS[arm]
        with (
            tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp,
            planner_policy(target, WORKERS, profile, Path(tmp)) as planner,
        ):
            run = replay(parse_arm("static:0,1"), scaling=planner)
            moves = planner_moves(planner.finalize([]))
    else:
        run = replay(parse_arm(policy, resplit))
        moves = len(run.resplits)
    ttft = [r.ttft for r in run.records if r.ttft is not None]
    good = sum(
        1
        for r in run.records
        if r.ttft is not None
        and r.ttft <= SLA_TTFT_S
        and (r.mean_itl is None or r.mean_itl <= SLA_ITL_S)
    )
    return _figures(ttft, good, len(run.records), run.worker_s, moves)


def write_mooncake(trace: str, window_s: float, path: Path) -> Path:
    """The trace's first ``window_s`` seconds as Dynamo reads a trace (Mooncake's JSONL: ms
    timestamps, lengths, one id per 512-token block; a row without block ids gets ids of its
    own, a prompt nobody shares, as our replay reads it)."""
    from cluster.traces import TraceReader
    from cluster.traces.window import ReplayWindow, trace_requests

    reader = TraceReader(trace)
    fresh = 1 << 40  # above any id Mooncake's trace uses
    with path.open("w") as out:
        for r in trace_requests(reader, ReplayWindow(duration_s=window_s)):
            ids = r.block_ids
            if ids is None:
                n = max(1, math.ceil(r.input_length / 512))
                ids, fresh = tuple(range(fresh, fresh + n)), fresh + n
            row = {
                "timestamp": round(r.arrival_s * 1000.0, 3), "input_length": r.input_length,
                "output_length": r.output_length, "hash_ids": list(ids),
            }  # fmt: skip
            out.write(json.dumps(row) + "\n")
    return path


def run_dynamo(
    trace: str,
    window_s: float,
    speedup: float,
    arm: str,
    topology: str,
    theta: tuple[float, float],
    seed: int = 0,
) -> dict[str, Any]:
    """One arm in Dynamo's replay: figures from its summary. ``seed`` only names the repeat:
    Dynamo's replay is not seeded (its ties at τ 0 fall as they fall)."""
    os.environ.setdefault("DYN_LOG", "warn")  # else one log line per routing decision
    from cluster.backends.dynamo.install import require_dynamo
    from cluster.backends.dynamo.scaling import ResplitScaling
    from cluster.sim.planning import GameOnePlanner
    from cluster.sim.pools import Topology
    from controller.detector import Thresholds
    from controller.resplit import Pools

    require_dynamo()
    if arm in PLANNER_TARGETS:
        missing = planner_missing()
        if missing is not None:
            return {"missing": missing}
    from dynamo._core import KvRouterConfig, run_mocker_trace_replay
    from dynamo.replay import run_trace_replay

    from cluster.sim.replay import parse_arm

    routing = parse_arm(arm if arm.startswith("static:") else "static:0,1")
    profile = profile_for(arm)
    pools = Topology.parse(topology)
    with tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp:
        window = write_mooncake(trace, window_s, Path(tmp) / "window.jsonl")
        prefill, decode = engine_args(profile, Path(tmp))
        kwargs: dict[str, Any] = dict(
            prefill_engine_args=prefill, decode_engine_args=decode,
            num_prefill_workers=pools.prefill, num_decode_workers=pools.decode,
            router_mode="kv_router", trace_format="mooncake", trace_block_size=512,
            router_config=KvRouterConfig(
                router_temperature=routing.tau, prefill_load_scale=routing.omega
            ),
            arrival_speedup_ratio=speedup, sla_ttft_ms=SLA_TTFT_S * 1000,
            sla_itl_ms=SLA_ITL_S * 1000,
        )  # fmt: skip
        moves = 0
        if arm in PLANNER_TARGETS:
            config = planner_config(PLANNER_TARGETS[arm], WORKERS, Path(tmp))
            result = run_trace_replay(str(window), planner_config=config, **kwargs)
            moves = planner_moves(result.planner)
        elif arm in ("ours routing+resplit", KV_BOTH):
            start = Pools(pools.prefill, pools.decode)
            planner = GameOnePlanner(profile, pools, slo())
            policy = ResplitScaling(planner, start, Thresholds(*theta), profile.role_switch_s)
            result = run_mocker_trace_replay([str(window)], scaling_policy=policy, **kwargs)
            moves = policy.target.moves
        else:
            result = run_mocker_trace_replay([str(window)], **kwargs)
        rows = [json.loads(x) for x in window.read_text().splitlines() if x.strip()]
    s = dict(result.summary)
    total = len(rows)
    good = int(s.get("goodput_completed_requests") or 0)
    held = sum(float(s.get(f"{p}_worker_seconds") or 0.0) for p in ("prefill", "decode"))
    out = _figures([], good, total, held, moves)
    out["ttft_p50_s"] = float(s["median_ttft_ms"]) / 1000.0
    out["ttft_p99_s"] = float(s["p99_ttft_ms"]) / 1000.0
    return out


def trace_path(name: str, folder: Path = SHARED) -> Path:
    return folder / TRACES[name][0]


def run_trace(name: str, window_s: float, seed: int = 0) -> dict[str, Any]:
    """Every arm of ``name`` once (the benchmark's run; the experiment fans them out)."""
    trace = str(trace_path(name))
    speedup = TRACES[name][1]
    theta = thresholds(trace)
    out: dict[str, Any] = {"speedup": speedup, "thresholds": theta, "ours": {}, "dynamo": {}}
    for sim, arm, topology in arms():
        key = arm_key(arm, topology)
        if sim == "ours":
            out["ours"][key] = run_ours(trace, window_s, speedup, arm, topology, seed, theta)
        else:
            out["dynamo"][key] = run_dynamo(trace, window_s, speedup, arm, topology, theta)
    return out


def hindsight_best(runs: dict[str, dict[str, Any]]) -> str:
    """The static split and policy of least TTFT P99."""
    statics = [k for k in runs if k.startswith("static:")]
    return min(statics, key=lambda k: runs[k]["ttft_p99_s"])


def routing_effects(ours: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Ours routing only over static τ 0 ω 1, TTFT P99, on each split."""
    out = {}
    for t in STATIC:
        r = ratio(ours[f"ours routing {t}"]["ttft_p99_s"], ours[f"static:0,1 {t}"]["ttft_p99_s"])
        if r is not None:
            out[t] = r
    return out


def judge(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    targets = {}
    for name, r in results.items():
        for sim in ("ours", "dynamo"):
            runs = r[sim]
            mine = runs["ours routing+resplit"]
            if name == "mooncake":
                best = hindsight_best(runs)
                for arm, label in (("ours routing+resplit", "re-split"), (KV_BOTH, "kv_both")):
                    targets[f"{name} {sim}: {label} P99 / best static ({best})"] = at_most(
                        ratio(runs[arm]["ttft_p99_s"], runs[best]["ttft_p99_s"]), 1.25
                    )
            for planner, target in PLANNER_TARGETS.items():
                theirs = runs.get(planner, {})
                if name == "mooncake":
                    targets[f"{name} {sim}: re-split P99 / planner's ({target})"] = at_most(
                        ratio(mine["ttft_p99_s"], theirs.get("ttft_p99_s")), 0.8
                    )
                else:
                    targets[f"{name} {sim}: re-split goodput / planner's ({target})"] = at_least(
                        ratio(mine["goodput"], theirs.get("goodput")), 1.0
                    )
        ours = r["ours"]
        worst = max(routing_effects(ours).items(), key=lambda kv: kv[1])
        targets[f"{name} ours: routing only P99 / static:0,1, worst split ({worst[0]})"] = at_most(
            worst[1], 1.05
        )
        targets[f"{name}: every request answered in every arm"] = holds(
            all(v.get("requests", 0) > 0 for s in ("ours", "dynamo") for v in r[s].values()),
            "each arm served the window",
        )
    return verdict(targets)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--window", type=float, default=1200.0, help="trace seconds, from 0")
    parser.add_argument("--trace", choices=tuple(TRACES), action="append")
    add_output_flags(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    names = args.trace or list(TRACES)
    results = {name: run_trace(name, args.window) for name in names}
    body = {
        "window_s": args.window, "profile": PROFILE, "workers": WORKERS,
        "slo": {"ttft_s": SLA_TTFT_S, "itl_s": SLA_ITL_S, "attainment": SLA_ATTAINMENT},
        "traces": results, "wall_s": time.perf_counter() - started,
    }  # fmt: skip
    return emit("controller", judge(results), body, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
