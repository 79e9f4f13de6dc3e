"""``disaggctl sim``: run the simulated cluster, or check a profile against published figures
(docs/design.md §6)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from cluster.progress import progress_bar
from cluster.sim.calibration import WARMUP_S, check, closed_loop, drive
from cluster.sim.control import ControlLoop
from cluster.sim.profile import available_profiles, load_profile
from cluster.sim.records import summarize
from cluster.sim.scenario import phase_figures, unloaded_ttft
from disaggctl.jsonout import strict_dumps
from disaggctl.options import (
    MAX_CONCURRENCY,
    MAX_DECODE_WORKERS,
    MAX_HOLD_S,
    MAX_PREFILL_WORKERS,
    MIN_HOLD_S,
    SimCalibrateOptions,
    SimExportOptions,
    SimRunOptions,
    from_args,
)
from games.poa import MAX_AGE_S, PoaEstimator

AddFlags = Callable[[argparse.ArgumentParser], None]


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter] = argparse.ArgumentDefaultsHelpFormatter,
    output_flags: AddFlags | None = None,
    seed_flag: AddFlags | None = None,
) -> None:
    sim = sub.add_parser(
        "sim",
        help="the simulated disaggregated cluster",
        description=__doc__,
        formatter_class=formatter,
    )
    verbs = sim.add_subparsers(dest="verb", required=True, metavar="VERB")

    run = verbs.add_parser(
        "run",
        help="one closed-loop operating point",
        description="A closed loop at --concurrency on --topology: 10 s warm-up, then --seconds "
        "measured; strict JSON on stdout (a figure nothing was measured for is null). Beside "
        "throughput and latency: the PoA estimate poa_hat = poa_routing x poa_capacity (games/"
        "poa.py), the mean of its 1 s ticks over the hold, and per phase (warmup, hold).",
        formatter_class=formatter,
    )
    run.add_argument(
        "--profile",
        default="b200-llama70b-fp8-tp4",
        choices=available_profiles(),
        help="hardware profile (cluster/sim/profiles)",
    )
    defaults = ", ".join(_default_topologies())
    run.add_argument(
        "--topology",
        default=argparse.SUPPRESS,  # unset: the profile's own (the model's None)
        help=f"xP/yD workers, 0 <= x <= {MAX_PREFILL_WORKERS}, 1 <= y <= {MAX_DECODE_WORKERS} "
        f"(case and spaces do not matter); default: the profile's default_topology ({defaults})",
    )
    run.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help=f"clients in the closed loop, 1 to {MAX_CONCURRENCY}",
    )
    run.add_argument(
        "--seconds",
        type=float,
        default=40.0,
        help=f"measured hold after the warm-up, simulated seconds, {MIN_HOLD_S:g} to "
        f"{MAX_HOLD_S:g} (finite)",
    )
    if seed_flag:
        seed_flag(run)
    else:
        run.add_argument("--seed", type=int, default=0, help="random seed")
    if output_flags:
        output_flags(run)
    run.set_defaults(func=_run)

    calibrate = verbs.add_parser(
        "calibrate",
        help="simulated vs published figures",
        description="Every published figure of each profile against the simulator (minutes).",
        formatter_class=formatter,
    )
    calibrate.add_argument(
        "--profile",
        choices=available_profiles(),
        action="append",
        default=argparse.SUPPRESS,  # unset: every profile (the model's None)
        help="a profile to check (repeat for several; default: all of them)",
    )
    if output_flags:
        output_flags(calibrate)
    calibrate.set_defaults(func=_calibrate)

    export = verbs.add_parser(
        "export-dynamo",
        help="a profile as the external timing model of Dynamo's mocker (.npz)",
        description="Write --profile's prefill and decode costs as the lookup tables Dynamo's "
        "replay reads (`timing_model: {type: external, provider: dynamo_profile, config: {path: "
        "FILE}}`), so Dynamo's simulator runs our engine (cluster/sim/dynamo_profile.py).",
        formatter_class=formatter,
    )
    export.add_argument(
        "--profile", default="b200-llama70b-fp8-tp4", choices=available_profiles(),
        help="hardware profile (cluster/sim/profiles)",
    )  # fmt: skip
    export.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    export.set_defaults(func=_export_dynamo)


def _default_topologies() -> list[str]:
    """``name xP/yD`` per profile for the help; a broken profile file must not break --help."""
    shown = []
    for name in available_profiles():
        try:
            shown.append(f"{name} {load_profile(name).default_topology}")
        except ValueError:  # ConfigError: reported when that profile is used
            shown.append(f"{name} ?")
    return shown


def _run(args: argparse.Namespace) -> int:
    o = from_args(SimRunOptions, args)
    profile = load_profile(o.profile)
    topology = o.topology or profile.default_topology
    cluster, load = closed_loop(profile, topology, o.concurrency, o.seconds, o.seed)
    # The estimator as scenarios and serve mode run it; without a controller the ticks only
    # observe, so the run is the one `run_point` (and calibration) would make.
    estimator = PoaEstimator(256, MAX_AGE_S, unloaded_latency_s=unloaded_ttft(profile))
    control = ControlLoop(cluster, None, estimator, until=load.end)
    drive(cluster, load.end, progress=o.progress, quiet=o.quiet)
    phases = [
        phase_figures(name, start, end, cluster.records, control.timeline)
        for name, start, end in (("warmup", 0.0, WARMUP_S), ("hold", WARMUP_S, load.end))
    ]
    poa = {k: phases[-1][k] for k in ("poa_hat", "poa_routing", "poa_capacity")}
    report = {
        "profile": profile.name,
        "topology": topology,
        "concurrency": o.concurrency,
        "seconds": o.seconds,
        **summarize(cluster.records, WARMUP_S, load.end).as_dict(),
        **poa,
        "phases": phases,
    }
    print(strict_dumps(report, indent=2))
    return 0


def _export_dynamo(args: argparse.Namespace) -> int:
    from cluster.sim.dynamo_profile import write_dynamo_profile

    o = from_args(SimExportOptions, args)
    path = write_dynamo_profile(load_profile(o.profile), o.out)
    print(strict_dumps({"profile": o.profile, "npz": str(path)}))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    o = from_args(SimCalibrateOptions, args)
    profiles = [load_profile(name) for name in o.profile or available_profiles()]
    header = (
        f"{'profile':<27} {'topo':<6} {'metric':<18} {'C':>4} {'published':>15} "
        f"{'simulated':>10} {'':>5}"
    )
    print(header)
    print("-" * len(header))
    missed = 0
    points = [(p, point) for p in profiles for point in p.calibration]
    with progress_bar(
        points, progress=o.progress, quiet=o.quiet, desc="calibration points", unit="pt"
    ) as bar:
        for profile, point in bar:
            (r,) = check(profile, [point])
            verdict = "ok" if r.ok else ("MISS" if point.reproduced else "known")
            missed += verdict == "MISS"
            tqdm.write(  # on stdout, above the bar (stderr) rather than through it
                f"{profile.name:<27} {point.topology:<6} {point.metric:<18} "
                f"{point.concurrency:>4} {r.published:>15} {r.simulated:>10.5g} {verdict:>5}"
            )
    print("\nknown: recorded figures the FCFS model cannot meet; see the profile's note.")
    return 1 if missed else 0
