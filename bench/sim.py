"""Simulator speed: simulated seconds per wall second, and peak memory.

Llama-3.1-70B 1P/5D in a closed loop at C = 128 for 60 simulated seconds (target ≥ 50×), plus the
calm C = 16 and deep C = 512 points for scale. Peak memory is the traced Python heap of one run
(tracemalloc, in a separate run so it does not slow the timed one) and the process RSS. ``met``
on top of the JSON says whether the C = 128 target holds; the exit status is 1 when it does not.

    .venv/bin/python -m bench.sim [--seconds 60] [--repeats 3] [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import add_output_flags, at_least, emit, verdict
from cluster.progress import progress_bar
from cluster.sim.cluster import SimCluster
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.profile import load_profile
from cluster.sim.template_source import TemplateSource

PROFILE = "b200-llama70b-fp8-tp4"
TARGET_CONCURRENCY = 128
SPEED_MIN = 50.0  # simulated seconds per wall second


def one_run(concurrency: int, seconds: float, seed: int) -> tuple[float, int, int]:
    """(wall seconds, requests finished, decode iterations) for one simulated run."""
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, "1P/5D", seed=seed)
    w = profile.workload
    source = TemplateSource(w.templates, w.template_tokens, w.input_tokens, w.output_tokens, seed=1)
    load = ClosedLoop(cluster, source, [Phase(seconds, concurrency, ramp=min(5.0, seconds / 4))])
    start = time.perf_counter()
    cluster.loop.run(load.end)
    wall = time.perf_counter() - start
    done = sum(r.finished is not None for r in cluster.records)
    iterations = sum(d.iteration for d in cluster.decode.values())
    return wall, done, iterations


def bench_point(concurrency: int, seconds: float, repeats: int) -> dict[str, Any]:
    walls = []
    for seed in range(repeats):
        wall, done, iterations = one_run(concurrency, seconds, seed)
        walls.append(wall)
    wall = statistics.median(walls)
    tracemalloc.start()
    one_run(concurrency, seconds, 0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "concurrency": concurrency,
        "simulated_s": seconds,
        "wall_s": round(wall, 3),
        "sim_seconds_per_wall_second": round(seconds / wall, 1),
        "requests_finished": done,
        "decode_iterations": iterations,
        "us_per_decode_iteration": round(1e6 * wall / max(iterations, 1), 2),
        "peak_traced_heap_mb": round(peak / 2**20, 1),
    }


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The speed target at C = 128 from ``report["results"]``; missing that point is a miss."""
    row = next((r for r in report["results"] if r["concurrency"] == TARGET_CONCURRENCY), None)
    speed = None if row is None else row["sim_seconds_per_wall_second"]
    return verdict(
        {
            "sim_seconds_per_wall_second_c128": at_least(
                speed, SPEED_MIN, concurrency=TARGET_CONCURRENCY
            )
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    add_output_flags(parser)
    args = parser.parse_args(argv)
    bar = progress_bar((16, 128, 512), progress=args.progress, quiet=args.quiet, desc="sim bench")
    rows = [bench_point(c, args.seconds, args.repeats) for c in bar]
    report = {
        "profile": PROFILE,
        "topology": "1P/5D",
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "results": rows,
    }
    return emit("sim", judge(report), report, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
