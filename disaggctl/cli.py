"""``disaggctl``: the command line.

Every subcommand's flags are checked by a strict model (disaggctl.options) before any work
starts: a bad value ends with ``disaggctl: --flag message, got value`` and exit status 2, a
failure during the work with ``disaggctl: message`` and status 1. Output on stdout is the result
(strict JSON where it is JSON); progress bars and live status go to stderr, only on a terminal
or with ``--progress``, never with ``--quiet``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from auction import SCHEDULERS
from cluster.backends.dynamo.install import DynamoMissingError
from cluster.progress import progress_bar
from disaggctl.jsonout import strict_dumps
from disaggctl.options import (
    MAX_N,
    MAX_QUEUE,
    MAX_SEED,
    MAX_TOP,
    MAX_USERS,
    WORKLOADS_HELP,
    AuctionOptions,
    DemoOptions,
    UsageError,
    from_args,
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after every option's help; descriptions keep their line breaks."""


def package_version() -> str:
    try:
        return version("disaggctl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--quiet``, shared by every subcommand that runs for a while."""
    parser.add_argument(
        "--progress",
        action="store_const",
        const=True,
        default=argparse.SUPPRESS,  # unset: bars only when stderr is a terminal
        help="draw progress bars even when stderr is not a terminal (default: only on a terminal)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars and no live status lines; the final result is still printed",
    )


def seed_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seed", type=int, default=0, help=f"random seed, 0 to {MAX_SEED}: same seed, same run"
    )


def _demo(args: argparse.Namespace) -> int:
    o = from_args(DemoOptions, args)
    if o.sim:
        from disaggctl.demo import main as demo_main

        return demo_main(o.out, o.n, o.users, o.seed, progress=o.progress, quiet=o.quiet)
    from disaggctl.serve_demo import format_report, run_serve_demo

    report = run_serve_demo(o.out, seed=o.seed, progress=o.progress, quiet=o.quiet)
    print(format_report(report))
    print(f"\nwrote {o.out / 'serve.json'} and {o.out / 'timeline.png'}")
    failed = sum(row["errors"] for row in report["phases"])
    return 0 if failed == 0 else 1


def _auction(args: argparse.Namespace) -> int:
    from cluster.sim.auction_queue import plan_queue, simulate_queue
    from cluster.sim.workloads import ValueModel, make_workload

    o = from_args(AuctionOptions, args)
    queue = o.n if o.queue is None else o.queue
    steps = 3 if o.simulate else 2
    with progress_bar(total=steps, desc="auction", progress=o.progress, quiet=o.quiet) as bar:
        values = ValueModel(o.value_model, o.rho)
        batch = make_workload(o.workload, queue, users=o.users, seed=o.seed, values=values)
        bar.update(1)
        plan = plan_queue(batch, o.scheduler, o.n, seed=o.seed)
        bar.update(1)
        run = simulate_queue(batch, o.scheduler, o.n, seed=o.seed) if o.simulate else None
        bar.update(steps - 2)
    top = sorted(plan.payments.items(), key=lambda kv: -kv[1])[: o.top]
    report = {
        "workload": batch.name,
        "scheduler": o.scheduler,
        "values": values.label,
        "queue": len(batch.requests),
        "n": min(o.n, len(batch.requests)),
        "batches": len(plan.batches),
        # Planned: the welfare formula on the order the auctions chose (all batches back to
        # back); the batch figure is each batch's own, averaged.
        "welfare": plan.welfare,
        "welfare_pct_above_half": plan.welfare_pct_above_half,
        "batch_welfare_pct_above_half": plan.batch_welfare_pct_above_half,
        "revenue": plan.revenue,
        "first": list(plan.order[: o.top]),
        "top_payments": dict(top),
    }
    if run is not None:  # realised on the simulator, beside the planned figures above
        report |= {
            "realised_welfare_pct_above_half": run.realised_welfare_pct,
            "cache_hit_rate": run.cache_hit_rate,
            "mean_ttft_s": run.mean_ttft_s,
            "p99_ttft_s": run.p99_ttft_s,
            "makespan_s": run.makespan_s,
            "simulator": {"profile": run.profile, "topology": run.topology},
        }
    print(strict_dumps(report, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disaggctl", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version()}",
        help="print the installed package version and exit",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="the main job: the live service driven through the knee (about 3 min)",
        description="The live service (local Ray, embedded NATS, simulated 70B 1P/5D) driven over "
        "HTTP by a load client through calm, a ramp through the knee, a saturated hold and a "
        "spike; a phase table, regime changes and priced priority per user on stdout, serve.json "
        "and timeline.png in --out. With --sim: the virtual-time demo (whole system on the "
        "simulator, then the auction on every workload shape; about 15 s).",
        formatter_class=HelpFormatter,
    )
    demo.add_argument(
        "--sim",
        action="store_true",
        help="run the virtual-time demo on the simulator instead of the live service",
    )
    demo.add_argument(
        "--n", type=int, default=1024, help=f"with --sim: requests per auction batch, 1 to {MAX_N}"
    )
    demo.add_argument(
        "--users",
        type=int,
        default=128,
        help=f"with --sim: bidding users per batch, 1 to {MAX_USERS}",
    )
    seed_flag(demo)
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("results/demo"),
        help="output folder (created; checked writable before the run starts)",
    )
    add_output_flags(demo)
    demo.set_defaults(func=_demo)

    auction = sub.add_parser(
        "auction",
        help="order and price a generated queue, batch by batch (optionally on the simulator)",
        description="Generate a queue of Q requests, cut it into batches of n (arrival order), "
        "order each batch with one scheduler and price it (VCG, dfs-bid only); JSON out with the "
        "planned welfare (% above a random order's ½Σb). With --simulate, the queue also runs "
        "on the simulator (one h100-32b worker, all Q there at t = 0) and the realised welfare "
        "(the same formula on the order of the simulated TTFTs), cache hit rate and TTFT come "
        "beside the planned figures.",
        formatter_class=HelpFormatter,
    )
    auction.add_argument(
        "--workload", default="mixshare-50", help=WORKLOADS_HELP.replace("%", "%%")
    )  # argparse %-formats help: a literal "P%" would break --help
    auction.add_argument(
        "--scheduler", default="dfs-bid", choices=sorted(SCHEDULERS), help="the ordering policy"
    )
    auction.add_argument(
        "--n", type=int, default=256, help=f"batch size: requests per auction, 1 to {MAX_N}"
    )
    auction.add_argument(
        "--queue",
        type=int,
        default=argparse.SUPPRESS,  # unset: one batch of n (said in the help)
        help=f"queue size Q: requests waiting, auctioned in batches of n, 1 to {MAX_QUEUE} "
        "(default: n, one batch)",
    )
    auction.add_argument("--users", type=int, default=32, help=f"bidding users, 1 to {MAX_USERS}")
    auction.add_argument(
        "--value-model",
        default="iid",
        choices=("iid", "correlated", "one-cluster"),
        help="values 1 + Pareto(1.5): i.i.d., correlated within a cluster (--rho), or one "
        "bidding cluster and zeros",
    )
    auction.add_argument(
        "--rho",
        type=float,
        default=0.0,
        help="with --value-model correlated: the correlation within a cluster, 0 to 1",
    )
    auction.add_argument(
        "--simulate",
        action="store_true",
        help="also run the queue on the simulator and report realised welfare, cache hit rate "
        "and TTFT",
    )
    seed_flag(auction)
    auction.add_argument(
        "--top", type=int, default=5, help=f"how many ids and payers to show, 0 to {MAX_TOP}"
    )
    add_output_flags(auction)
    auction.set_defaults(func=_auction)

    from disaggctl.sim_cli import add_parser as add_sim

    add_sim(sub, HelpFormatter, add_output_flags, seed_flag)

    from disaggctl.experiment.cli import add_parser as add_experiment

    add_experiment(sub, HelpFormatter, add_output_flags)

    from disaggctl.replay.cli import add_parser as add_replay

    add_replay(sub, HelpFormatter, add_output_flags)

    from disaggctl.serve_cli import add_parser as add_serve

    add_serve(sub, HelpFormatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:  # a bad flag value: like argparse's own errors, status 2
        parser.exit(2, "".join(f"disaggctl: {line}\n" for line in str(exc).splitlines()))
    except (ValueError, DynamoMissingError) as exc:
        print(f"disaggctl: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`disaggctl ... | head`): not an error of ours. Point stdout at
        # devnull so the interpreter's final flush does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the pipe


if __name__ == "__main__":
    raise SystemExit(main())
