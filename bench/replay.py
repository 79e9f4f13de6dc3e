"""Trace replay: the simulator's pace on a whole production trace, the loader's on a million
lines, and the live client's punctuality (docs/design.md §8 "Real traces").

- ``sim``: the whole Mooncake conversation trace (12,031 requests, 3,537 s) on Llama-3.1-70B
  3P/3D, static τ 0 ω 1, in virtual time: virtual seconds per wall second (target ≥ 100) and the
  process's peak RSS (≤ 1.5 GiB), in a process of its own so nothing else counts in either.
- ``load``: a million synthetic Mooncake lines (the trace's own rows, repeated with new times and
  new block ids) read and validated through ``trace_requests``: seconds (≤ 10) and the RSS it
  adds (≤ 200 MiB), in a process of its own.
- ``live``: the first 2 minutes of the shipped Mooncake slice at arrivals ×4 against a running
  service (3P/3D at engine speed-up 4, its processes at a lower priority than this one's, as a
  load generator on its own machine): the share of requests sent within 50 ms of their time
  (target ≥ 99%) and the lateness distribution.

    .venv/bin/python -m bench.replay [--part sim|load|live|all] [--trace PATH] [--quiet]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import add_output_flags, at_least, at_most, emit, lower_service_priority, verdict

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"
PROFILE, TOPOLOGY = "b200-llama70b-fp8-tp4", "3P/3D"
SPEED_MIN = 100.0  # virtual seconds per wall second
RSS_MAX_MIB = 1536.0
LINES, LOAD_S_MAX, LOAD_MIB_MAX = 1_000_000, 10.0, 200.0
LIVE_WINDOW, LIVE_SPEEDUP, ON_TIME_S, ON_TIME_SHARE = "0:120", 4.0, 0.05, 0.99


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sim_part(trace: str) -> dict[str, Any]:
    """The whole trace through one static arm (runs in a fresh process)."""
    from cluster.sim.profile import load_profile
    from cluster.sim.replay import parse_arm, replay_on_sim
    from cluster.traces import TracePrompts, TraceReader, trace_requests

    reader = TraceReader(trace)
    started = time.perf_counter()
    run = replay_on_sim(
        trace_requests(reader), TracePrompts(reader.block_tokens), load_profile(PROFILE),
        TOPOLOGY, parse_arm("static:0,1"),
    )  # fmt: skip
    wall = time.perf_counter() - started
    summary = run.summary()
    return {
        "trace": trace,
        "requests": summary["requests"],
        "virtual_s": round(summary["virtual_s"], 1),
        "wall_s": round(wall, 2),
        "virtual_per_wall": round(summary["virtual_s"] / wall, 1),
        "peak_rss_mib": round(_rss_mib(), 1),
        "ttft_p50_s": round(summary["ttft_p50_s"], 4),
        "ttft_p99_s": round(summary["ttft_p99_s"], 4),
        "prefix_reuse": round(summary["prefix_reuse"], 4),
    }


def write_synthetic(path: Path, lines: int, source: Path) -> None:
    """``lines`` Mooncake rows: the source's shapes in turn, times going on, ids made new."""
    rows = [json.loads(x) for x in source.read_text().splitlines()]
    span = rows[-1]["timestamp"] + 1
    with path.open("w") as fh:
        for k in range(lines):
            row = rows[k % len(rows)]
            lap = k // len(rows)
            ids = [i + lap * 10_000_000 for i in row["hash_ids"]]
            fh.write(json.dumps({
                "timestamp": row["timestamp"] + lap * span, "input_length": row["input_length"],
                "output_length": row["output_length"], "hash_ids": ids,
            }) + "\n")  # fmt: skip


def load_part(path: str) -> dict[str, Any]:
    """Read and validate every line of ``path`` as a replay would (runs in a fresh process)."""
    from cluster.traces import TraceReader, trace_requests

    before = _rss_mib()
    started = time.perf_counter()
    reader = TraceReader(path)
    count = sum(1 for _ in trace_requests(reader))
    wall = time.perf_counter() - started
    return {
        "lines": reader.stats.lines,
        "requests": count,
        "seconds": round(wall, 2),
        "lines_per_s": round(count / wall),
        "added_rss_mib": round(_rss_mib() - before, 1),
    }


def live_part() -> dict[str, Any]:
    """The shipped slice's first 2 minutes at ×4 against a service started here."""
    from cluster.config import ServeConfig
    from cluster.nats_server import free_port
    from cluster.service import Service
    from cluster.traces import ReplayWindow, TracePrompts, TraceReader, trace_requests
    from cluster.traces.window import parse_window
    from disaggctl.replay.live import lateness_summary, replay_live
    from disaggctl.replay.live_arm import served_model

    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        config = ServeConfig(
            topology=TOPOLOGY, speedup=LIVE_SPEEDUP, ledger_path=f"{tmp}/ledger.sqlite",
            metrics_port=0, namespace="benchreplay",
        )  # fmt: skip
        service = Service(config)
        try:
            service.start(host="127.0.0.1", port=free_port())
            lowered = lower_service_priority()
            assert service.url is not None
            start, duration = parse_window(LIVE_WINDOW)
            window = ReplayWindow(start_s=start, duration_s=duration, speedup=LIVE_SPEEDUP)
            reader = TraceReader(SLICE)
            run = replay_live(
                service.url, trace_requests(reader, window), TracePrompts(reader.block_tokens),
                model=served_model(service.url),
            )  # fmt: skip
        finally:
            service.stop()
    answered = sum(1 for r in run.requests if r.status == 200)
    return {
        "window": LIVE_WINDOW,
        "speedup": LIVE_SPEEDUP,
        "service_processes_lowered": lowered,
        "requests": len(run.requests),
        "answered": answered,
        "lateness": lateness_summary(run.requests, ON_TIME_S),
        "seconds": round(run.seconds, 1),
    }


def _isolated(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a fresh process (spawned: nothing of this one's heap), its result back."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, args)


def judge(report: dict[str, Any]) -> dict[str, Any]:
    targets: dict[str, Any] = {}
    sim = report.get("sim")
    if sim is not None:
        targets["virtual_per_wall"] = at_least(sim.get("virtual_per_wall"), SPEED_MIN)
        targets["peak_rss_mib"] = at_most(sim.get("peak_rss_mib"), RSS_MAX_MIB)
    load = report.get("load")
    if load is not None:
        targets["load_seconds"] = at_most(load.get("seconds"), LOAD_S_MAX, lines=load["lines"])
        targets["load_added_rss_mib"] = at_most(load.get("added_rss_mib"), LOAD_MIB_MAX)
    live = report.get("live")
    if live is not None:
        share = live["lateness"].get("within_share")
        targets["live_sent_within_50ms"] = at_least(share, ON_TIME_SHARE)
        targets["live_all_answered"] = at_least(live["answered"], live["requests"])
    return verdict(targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", choices=("sim", "load", "live", "all"), default="all")
    parser.add_argument("--trace", type=Path, default=TRACE, help="the whole Mooncake trace")
    add_output_flags(parser)
    args = parser.parse_args(argv)
    parts = ("sim", "load", "live") if args.part == "all" else (args.part,)
    report: dict[str, Any] = {"profile": PROFILE, "topology": TOPOLOGY}
    if "sim" in parts:
        if not args.trace.is_file():
            parser.error(f"--trace {args.trace}: no such file (Mooncake's conversation trace)")
        report["sim"] = _isolated(sim_part, str(args.trace))
    if "load" in parts:
        with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
            path = Path(tmp) / "million.jsonl"
            write_synthetic(path, LINES, SLICE)
            size = {"file_mib": round(path.stat().st_size / 2**20)}
            report["load"] = _isolated(load_part, str(path)) | size
    if "live" in parts:
        report["live"] = _isolated(live_part)
    return emit("replay", judge(report), report, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
