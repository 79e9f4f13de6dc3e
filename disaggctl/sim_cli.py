"""``disaggctl sim``: run the simulated cluster, or check a profile against published figures."""

from __future__ import annotations

import argparse
import json

from cluster.sim.calibration import check, run_point
from cluster.sim.profile import available_profiles, load_profile


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("sim", help="the simulated disaggregated cluster")
    verbs = sim.add_subparsers(dest="verb", required=True)

    run = verbs.add_parser("run", help="one closed-loop operating point")
    run.add_argument("--profile", default="b200-llama70b-fp8-tp4", choices=available_profiles())
    run.add_argument("--topology", default="1P/5D")
    run.add_argument("--concurrency", type=int, default=64)
    run.add_argument("--seconds", type=float, default=40.0, help="measured hold after warm-up")
    run.add_argument("--seed", type=int, default=0)
    run.set_defaults(func=_run)

    calibrate = verbs.add_parser("calibrate", help="simulated vs published figures")
    calibrate.add_argument("--profile", choices=available_profiles(), action="append")
    calibrate.set_defaults(func=_calibrate)


def _run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    summary = run_point(profile, args.topology, args.concurrency, args.seconds, args.seed)
    print(
        json.dumps(
            {
                "profile": profile.name,
                "topology": args.topology,
                "concurrency": args.concurrency,
                **summary.as_dict(),
            },
            indent=2,
        )
    )
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    header = (
        f"{'profile':<27} {'topo':<6} {'metric':<17} {'C':>4} {'published':>15} "
        f"{'simulated':>10} {'':>5}"
    )
    print(header)
    print("-" * len(header))
    missed = 0
    for name in args.profile or available_profiles():
        for r in check(load_profile(name)):
            verdict = "ok" if r.ok else ("MISS" if r.point.reproduced else "known")
            missed += verdict == "MISS"
            print(
                f"{name:<27} {r.point.topology:<6} {r.point.metric:<17} "
                f"{r.point.concurrency:>4} {r.published:>15} {r.simulated:>10.4g} {verdict:>5}"
            )
    print("\nknown: recorded figures the FCFS model cannot meet; see the profile's note.")
    return 1 if missed else 0
