"""Our simulator against Dynamo's offline replay: the same trace slice, topology, engine timing and
routing policy in both, one run each (docs/design.md §8, "The simulator checked against
Dynamo's").

Two parts, each on the first ``--requests`` requests of Mooncake's conversation trace:

- ``mocker``: the engines are Dynamo's mocker with its default timing in both (ours runs the
  ``dynamo-mocker`` profile, which reproduces it). Judged: per arm, ours over Dynamo's within
  15% for TTFT median and throughput, 25% for TTFT P99, 0.03 for prefix reuse; and every effect
  (KV router over round robin, 3P/3D over 1P/5D, τ 0.8 ω 0.1 over τ 0 ω 1, on TTFT P99) on the
  same side of 1 in both (or within 5% of 1 in both) and within a factor 1.5.
- ``b200``: our Llama-3.1-70B B200 profile in both (Dynamo through its external tables,
  ``cluster.sim.dynamo_profile``). Reported with the same figures, not judged: where they part,
  ours also runs without its jitter, then without its KV transfer, then with its prefill in the
  tables' form (one pass of T tokens, no per-request cost, no attention to a request's context),
  and how much of the gap each removes names the mechanism.

Arms: Dynamo's KV router at (τ, ω) = (0, 1) and (0.8, 0.1) against ours at the same (τ, ω), and
round robin in both. Topologies 1P/5D, 2P/4D, 3P/3D; loads f·X_max for f = 0.6 and 1.3, X_max
the capacity our simulator measures for the slice on that topology (the same arrivals go to
both simulators, so the choice favours neither).

    .venv/bin/python -m bench.crosscheck [--part mocker|b200|all] [--requests 3000] [--quiet]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from itertools import pairwise
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import add_output_flags, emit, holds, verdict
from cluster.progress import progress_bar

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"
TOPOLOGIES = ("1P/5D", "2P/4D", "3P/3D")
LOADS = (0.6, 1.3)
ARMS = {  # name: (our policy, Dynamo's router mode, τ, ω)
    "kv 0,1": ("static:0,1", "kv_router", 0.0, 1.0),
    "round robin": ("round-robin", "round_robin", 0.0, 1.0),
    "kv 0.8,0.1": ("static:0.8,0.1", "kv_router", 0.8, 0.1),
}
PROFILES = {"mocker": "dynamo-mocker", "b200": "b200-llama70b-fp8-tp4"}
VARIANTS = ("as is", "no jitter", "no jitter, no transfer", "Dynamo's tables' form")
KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "throughput_rps", "prefix_reuse")
WITHIN = {"ttft_p50_s": 0.15, "throughput_rps": 0.15, "ttft_p99_s": 0.25}  # relative
REUSE_WITHIN = 0.03  # absolute
EFFECT_FACTOR, FLAT = 1.5, 0.05


def variant(profile_name: str, name: str) -> Any:
    """Our profile with the differences from Dynamo's model removed up to ``name``."""
    from cluster.sim.profile import load_profile

    p = load_profile(profile_name)
    if name == "as is":
        return p
    p = dataclasses.replace(
        p,
        prefill=dataclasses.replace(p.prefill, jitter=0.0),
        decode=dataclasses.replace(p.decode, jitter=0.0),
    )
    if name == "no jitter":
        return p
    p = dataclasses.replace(p, link=dataclasses.replace(p.link, bandwidth_gbps=1e5, latency_s=0.0))
    if name == "no jitter, no transfer":
        return p
    q = p.prefill  # one pass of T tokens costs a + c_r + b·T + (e/2)·T², as the tables say
    form = dataclasses.replace(
        q,
        a_s=q.a_s + q.c_s_per_request,
        c_s_per_request=0.0,
        e_s_per_token_pair=0.0,
        f_s_per_iteration_token_sq=q.f_s_per_iteration_token_sq + q.e_s_per_token_pair / 2,
    )
    return dataclasses.replace(p, prefill=form)


def ours(
    trace: str, profile: str, name: str, topology: str, arm: str, speedup: float
) -> dict[str, Any]:
    from cluster.sim.replay import parse_arm, replay_on_sim
    from cluster.traces import ReplayWindow, TracePrompts, TraceReader, trace_requests

    reader = TraceReader(trace)
    run = replay_on_sim(
        trace_requests(reader, ReplayWindow(speedup=speedup)),
        TracePrompts(reader.block_tokens),
        variant(profile, name),
        topology,
        parse_arm(ARMS[arm][0]),
    )
    s = run.summary()
    return {k: s[k] for k in (*KEYS, "requests", "completed", "wall_s")}


def theirs(trace: str, profile: str, topology: str, arm: str, speedup: float) -> dict[str, Any]:
    from cluster.backends.dynamo.replay import DynamoArm, dynamo_replay
    from cluster.sim.profile import load_profile

    _, mode, tau, omega = ARMS[arm]
    out = dynamo_replay(
        trace,
        topology,
        DynamoArm(mode, tau, omega),  # type: ignore[arg-type]  # ARMS holds the two modes
        load_profile(profile),
        speedup=speedup,
    )
    return {k: out[k] for k in (*KEYS, "requests", "completed", "wall_s")}


def capacity(trace: str, profile_name: str, topology: str) -> float:
    from cluster.sim.profile import load_profile
    from cluster.sim.replay import trace_capacity_rps
    from cluster.traces import ReplayWindow, TracePrompts, TraceReader, trace_requests

    reader = TraceReader(trace)
    first = list(trace_requests(reader, ReplayWindow(max_requests=512)))
    return trace_capacity_rps(load_profile(profile_name), topology, first, TracePrompts(512))


def _rate(trace: str) -> float:
    from cluster.traces import TraceReader, trace_requests

    times = [r.arrival_s for r in trace_requests(TraceReader(trace))]
    return len(times) / max(times[-1], 1e-9)


def write_slice(source: Path, requests: int, out: Path) -> Path:
    lines = source.read_text().splitlines(keepends=True)[:requests]
    out.write_text("".join(lines))
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


Point = tuple[str, float, float]  # topology, load f, speed-up
Key = tuple[Any, ...]


def points_of(trace: str, caps: dict[str, float]) -> list[Point]:
    """Each topology at each load f: the speed-up that makes the slice's rate f·X_max."""
    rate = _rate(trace)
    return [(t, f, round(f * caps[t] / rate, 4)) for t in TOPOLOGIES for f in LOADS]


def runs_of(part: str, trace: str, points: list[Point]) -> list[tuple[Key, Any, tuple[Any, ...]]]:
    """Every replay a part needs: (its key, the function, its arguments)."""
    profile = PROFILES[part]
    runs: list[tuple[Key, Any, tuple[Any, ...]]] = []
    for topology, f, speedup in points:
        for arm in ARMS:
            runs.append((("dynamo", topology, f, arm), theirs,
                         (trace, profile, topology, arm, speedup)))  # fmt: skip
            for name in VARIANTS if part == "b200" and arm == "kv 0,1" else VARIANTS[:1]:
                runs.append((("ours", topology, f, arm, name), ours,
                             (trace, profile, name, topology, arm, speedup)))  # fmt: skip
    return runs


def assemble(
    part: str, caps: dict[str, float], points: list[Point], got: dict[Key, Any], rate: float
) -> dict[str, Any]:
    """The part's report from its runs' results: a row per (topology, load, arm), ours over
    Dynamo's, and (b200) how much of the gap each of our model's differences makes."""
    rows = []
    for topology, f, speedup in points:
        for arm in ARMS:
            d, o = got[("dynamo", topology, f, arm)], got[("ours", topology, f, arm, "as is")]
            row: dict[str, Any] = {
                "topology": topology, "load": f, "speedup": speedup, "arm": arm,
                "dynamo": d, "ours": o,
                "ours_over_dynamo": {
                    k: round(_ratio(o[k], d[k]), 4) for k in KEYS if k != "prefix_reuse"
                },
                "reuse_difference": round(o["prefix_reuse"] - d["prefix_reuse"], 4),
            }  # fmt: skip
            if part == "b200" and arm == "kv 0,1":
                row["variants"] = {
                    name: {
                        k: round(_ratio(got[("ours", topology, f, arm, name)][k], d[k]), 4)
                        for k in ("ttft_p50_s", "ttft_p99_s")
                    }
                    for name in VARIANTS
                }
            rows.append(row)
    return {
        "profile": PROFILES[part],
        "capacity_rps": caps,
        "trace_rate_rps": round(rate, 4),
        "rows": rows,
        "effects": effects(rows),
    }


def run_part(
    part: str, trace: str, pool: ProcessPoolExecutor, *, progress: bool | None, quiet: bool
) -> dict[str, Any]:
    profile = PROFILES[part]
    caps = dict(
        zip(
            TOPOLOGIES,
            pool.map(capacity, *zip(*[(trace, profile, t) for t in TOPOLOGIES], strict=True)),
            strict=True,
        )
    )
    points = points_of(trace, caps)
    jobs = {pool.submit(fn, *args): key for key, fn, args in runs_of(part, trace, points)}
    got: dict[Any, Any] = {}
    bar = progress_bar(total=len(jobs), progress=progress, quiet=quiet, desc=f"crosscheck {part}")
    with bar:
        for job in as_completed(jobs):
            got[jobs[job]] = job.result()
            bar.update()
    return assemble(part, caps, points, got, _rate(trace))


def _p99(rows: list[dict[str, Any]], side: str, topology: str, f: float, arm: str) -> float:
    row = next(r for r in rows if (r["topology"], r["load"], r["arm"]) == (topology, f, arm))
    return float(row[side]["ttft_p99_s"])


def effects(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each effect's size (a ratio of TTFT P99) in both simulators."""
    out = []
    for f in LOADS:
        for topology in TOPOLOGIES:
            for name, a, b in (
                ("KV router over round robin", "kv 0,1", "round robin"),
                ("τ 0.8 ω 0.1 over τ 0 ω 1", "kv 0.8,0.1", "kv 0,1"),
            ):
                out.append(
                    {
                        "effect": name,
                        "topology": topology,
                        "load": f,
                        **{
                            s: round(
                                _ratio(
                                    _p99(rows, s, topology, f, a), _p99(rows, s, topology, f, b)
                                ),
                                4,
                            )
                            for s in ("ours", "dynamo")
                        },
                    }
                )
        for first, last in pairwise((TOPOLOGIES[0], TOPOLOGIES[-1])):
            out.append(
                {
                    "effect": f"{last} over {first}",
                    "topology": f"{last}/{first}",
                    "load": f,
                    **{
                        s: round(
                            _ratio(
                                _p99(rows, s, last, f, "kv 0,1"), _p99(rows, s, first, f, "kv 0,1")
                            ),
                            4,
                        )
                        for s in ("ours", "dynamo")
                    },
                }
            )
    return out


def effect_agrees(ours_ratio: float, dynamo_ratio: float) -> bool:
    """Same side of 1 (or both within 5% of it), and sizes within a factor 1.5."""
    if (
        not (math.isfinite(ours_ratio) and math.isfinite(dynamo_ratio))
        or min(ours_ratio, dynamo_ratio) <= 0
    ):
        return False
    flat = abs(ours_ratio - 1) <= FLAT and abs(dynamo_ratio - 1) <= FLAT
    side = (ours_ratio - 1) * (dynamo_ratio - 1) > 0
    size = max(ours_ratio, dynamo_ratio) / min(ours_ratio, dynamo_ratio) <= EFFECT_FACTOR
    return flat or (side and size)


def arm_misses(row: dict[str, Any]) -> list[str]:
    """The figures of one arm's row outside the targets (empty: the arm agrees)."""
    names = {"ttft_p50_s": "TTFT median", "ttft_p99_s": "TTFT P99", "throughput_rps": "req/s"}
    ratios = row["ours_over_dynamo"]
    misses = [
        f"{names[k]} {ratios[k]:.3g}x" for k, tol in WITHIN.items() if not abs(ratios[k] - 1) <= tol
    ]
    if not abs(row["reuse_difference"]) <= REUSE_WITHIN:
        misses.append(f"reuse {row['reuse_difference']:+.3f}")
    return misses


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The mocker part's targets (the b200 part is reported, not judged)."""
    part = report.get("mocker")
    if part is None:
        return verdict({})
    targets: dict[str, Any] = {}
    for r in part["rows"]:
        label = f"{r['arm']} {r['topology']} f={r['load']:g}"
        targets[f"agree: {label}"] = holds(
            not arm_misses(r),
            "TTFT median, throughput ±15%, P99 ±25%, reuse ±0.03",
            ratios=r["ours_over_dynamo"],
            reuse_difference=r["reuse_difference"],
        )
    for e in part["effects"]:
        label = f"effect: {e['effect']} {e['topology']} f={e['load']:g}"
        targets[label] = holds(
            effect_agrees(e["ours"], e["dynamo"]),
            "same side of 1, within 1.5x",
            ours=e["ours"],
            dynamo=e["dynamo"],
        )
    return verdict(targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", choices=("mocker", "b200", "all"), default="all")
    parser.add_argument("--requests", type=int, default=3000, help="the trace's first N requests")
    parser.add_argument("--trace", type=Path, default=FULL if FULL.is_file() else SLICE)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: cores)")
    add_output_flags(parser)
    args = parser.parse_args(argv)
    parts = ("mocker", "b200") if args.part == "all" else (args.part,)
    report: dict[str, Any] = {"requests": args.requests, "source": str(args.trace)}
    ctx = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory(prefix="crosscheck-") as tmp,
        ProcessPoolExecutor(args.workers, mp_context=ctx) as pool,
    ):
        trace = str(write_slice(args.trace, args.requests, Path(tmp) / "slice.jsonl"))
        for part in parts:
            report[part] = run_part(part, trace, pool, progress=args.progress, quiet=args.quiet)
    return emit("crosscheck", judge(report), report, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
