"""Simulator speed: simulated seconds per wall second, and peak memory.

Llama-3.1-70B 1P/5D in a closed loop at C = 128 for 60 simulated seconds (target ≥ 50×), plus the
calm C = 16 and deep C = 512 points for scale. Peak memory is the traced Python heap of one run
(tracemalloc, in a separate run so it does not slow the timed one) and the process RSS.

    .venv/bin/python -m bench.sim [--seconds 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from tqdm import tqdm

from cluster.sim.cluster import SimCluster
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.profile import load_profile
from cluster.workloads import TemplateSource

PROFILE = "b200-llama70b-fp8-tp4"


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = [
        bench_point(c, args.seconds, args.repeats)
        for c in tqdm((16, 128, 512), desc="sim bench", file=sys.stderr)
    ]
    target = next(r for r in rows if r["concurrency"] == 128)
    report = {
        "benchmark": "sim",
        "profile": PROFILE,
        "topology": "1P/5D",
        "target": {"sim_seconds_per_wall_second_min": 50.0, "at_concurrency": 128},
        "met": target["sim_seconds_per_wall_second"] >= 50.0,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "results": rows,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
