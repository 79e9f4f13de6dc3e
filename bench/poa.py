"""PoA estimator speed: one estimate over windows of 256 and 1024 requests on 2, 5, 16 workers.

Target: a 1024-request, 5-worker window in ≤ 100 ms (1% of a 10 s window's wall time): the
whole estimate, both fits, the replays and the fresh router's assignment. That assignment solves
one slot assignment per epoch by successive shortest paths; the Hungarian method on each
epoch's slot-expanded matrix, the reference, is run beside it, and both must agree (a second
target). ``met`` on top of the JSON says whether both hold; the exit status is 1 when one does
not.

    .venv/bin/python -m bench.poa [--repeats 5] [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np

from bench.common import add_output_flags, at_most, emit, holds, verdict
from cluster.progress import progress_bar
from games.assignment import optimal_cost, optimal_cost_hungarian
from games.poa import CandidateLoad, WindowRequest, estimate_parts, fresh_routing, poa_hat

TARGET_CASE = (1024, 5)  # (window, workers)
ESTIMATE_MS_MAX = 100.0  # 1% of a 10 s window
SPAN_S = 10.0


def service_s(n: int, workers: int) -> float:
    """The synthetic window's service time of a cached request: 90% of capacity overall, so
    the herded worker 0 queues. With nobody queued a request takes this long: its unloaded
    latency."""
    return 0.9 * SPAN_S * workers / n


def synthetic_window(n: int, workers: int, seed: int) -> list[WindowRequest]:
    """A KV-aware router's window over 10 s: requests mostly on the worker caching their prefix,
    a fifth herded onto worker 0; each worker a FIFO queue, so latency grows with its load, and
    the route event's per-candidate loads (active prefill tokens, decode blocks) follow."""
    rng = np.random.default_rng(seed)
    span = SPAN_S
    service = service_s(n, workers)
    free_at = np.zeros(workers)
    in_flight: list[list[tuple[float, int]]] = [[] for _ in range(workers)]  # (first token, u)
    window = []
    for i in range(n):
        t = span * i / n
        home = int(rng.integers(workers))
        uncached = rng.integers(64, 2048, workers)
        uncached[home] = rng.integers(0, 64)
        for w in range(workers):
            in_flight[w] = [(f, u) for f, u in in_flight[w] if f > t]
        candidates = {
            w: CandidateLoad(
                int(uncached[w]),
                sum(u for _, u in in_flight[w]),
                8 * len(in_flight[w]) + int(rng.integers(0, 64)),
            )
            for w in range(workers)
        }
        chosen = home if rng.random() < 0.8 else 0
        start = max(t, free_at[chosen])
        first = start + service * (1 + uncached[chosen] / 2048) * rng.lognormal(0.0, 0.1)
        free_at[chosen] = first
        in_flight[chosen].append((first, int(uncached[chosen])))
        window.append(WindowRequest(f"r{i}", chosen, t, first, first - t, candidates))
    return window


def _median(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_case(n: int, workers: int, repeats: int) -> dict[str, Any]:
    window = synthetic_window(n, workers, seed=n + workers)
    unloaded = service_s(n, workers)
    elapsed = _median(lambda: poa_hat(window, unloaded_latency_s=unloaded), repeats)
    est = poa_hat(window, unloaded_latency_s=unloaded)
    row: dict[str, Any] = {
        "window": n,
        "workers": workers,
        "estimate_ms": round(1e3 * elapsed, 2),
        "poa_hat": round(est.poa_hat, 4),
        "poa_routing": round(est.poa_routing, 4),
        "poa_capacity": round(est.poa_capacity, 4),
    }
    arrays, _, _, cf = estimate_parts(window, unloaded_latency_s=unloaded)
    problems: list[tuple[Any, Any, Any]] = []
    fresh_routing(arrays, cf, lambda P, base, svc: problems.append((P, base, svc)))
    flow = sum(optimal_cost(*p) for p in problems)
    start = time.perf_counter()
    reference = sum(optimal_cost_hungarian(*p) for p in problems)
    row["epochs"] = len(problems)
    row["largest_epoch"] = max((len(p[0]) for p in problems), default=0)
    row["hungarian_ms"] = round(1e3 * (time.perf_counter() - start), 1)
    row["agrees_with_hungarian"] = bool(np.isclose(reference, flow))
    return row


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """Speed on the 1024-request, 5-worker window and agreement with the Hungarian reference
    wherever it was timed, from ``report["results"]``. A missing target case is a miss; with no
    case small enough for the reference, agreement is missed too (nothing was checked)."""
    rows = report["results"]
    row = next((r for r in rows if (r["window"], r["workers"]) == TARGET_CASE), None)
    checked = [r for r in rows if "agrees_with_hungarian" in r]
    disagree = [[r["window"], r["workers"]] for r in checked if not r["agrees_with_hungarian"]]
    return verdict(
        {
            "estimate_ms_1024_window_5_workers": at_most(
                None if row is None else row["estimate_ms"], ESTIMATE_MS_MAX
            ),
            "agrees_with_hungarian": holds(
                bool(checked) and not disagree,
                "equal optimum to the Hungarian reference on every epoch",
                cases_checked=len(checked),
                disagreeing_cases=disagree,
            ),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_output_flags(parser)
    args = parser.parse_args(argv)
    cases = [(n, w) for n in (256, 1024) for w in (2, 5, 16)]
    bar = progress_bar(cases, progress=args.progress, quiet=args.quiet, desc="poa bench")
    report = {"results": [bench_case(n, w, args.repeats) for n, w in bar]}
    return emit("poa", judge(report), report, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
