"""``disaggctl``: the command line."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from auction import SCHEDULERS, run_auction


def _demo(args: argparse.Namespace) -> int:
    from disaggctl.demo import main as demo_main

    return demo_main(args.out, args.n, args.users, args.seed)


def _auction(args: argparse.Namespace) -> int:
    from cluster.workloads import make_workload

    batch = make_workload(args.workload, args.n, users=args.users, seed=args.seed)
    result = run_auction(batch.requests, args.scheduler)
    top = sorted(result.payments.items(), key=lambda kv: -kv[1])[: args.top]
    report = {
        "workload": batch.name,
        "scheduler": result.scheduler,
        "n": result.tree.n,
        "welfare": result.welfare,
        "welfare_pct_above_half": result.welfare_pct_above_half,
        "revenue": result.revenue,
        "first": list(result.order[: args.top]),
        "top_payments": dict(top),
    }
    print(json.dumps(report, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="disaggctl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the main job on the embedded default")
    demo.add_argument("--n", type=int, default=1024, help="requests per batch")
    demo.add_argument("--users", type=int, default=128)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", type=Path, default=Path("results/demo"))
    demo.set_defaults(func=_demo)

    auction = sub.add_parser("auction", help="order and price one generated batch")
    auction.add_argument(
        "--workload", default="mixshare-50", help="mixshare-P, chains, trees-short or trees-long"
    )
    auction.add_argument("--scheduler", default="dfs-bid", choices=sorted(SCHEDULERS))
    auction.add_argument("--n", type=int, default=256)
    auction.add_argument("--users", type=int, default=32)
    auction.add_argument("--seed", type=int, default=0)
    auction.add_argument("--top", type=int, default=5, help="how many ids and payers to show")
    auction.set_defaults(func=_auction)

    from disaggctl.sim_cli import add_parser as add_sim

    add_sim(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as exc:
        raise SystemExit(f"disaggctl: {exc}") from None


if __name__ == "__main__":
    raise SystemExit(main())
