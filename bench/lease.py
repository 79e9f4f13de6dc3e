"""Lease renewal against the number of accounts ([21] 4; docs/design.md "Admission at
saturation").

Every ingress replica renews its lease a few times per lease TTL, and each renewal carries every
user's available budget (B_i − S_i − H_i), so its cost must not grow one ledger transaction per
user. Measured here: the auction actor's ``lease(replica)`` (the renewal of that replica's holds,
the release of expired ones and every user's available budget, on the actor's ledger thread)
with ``--accounts`` accounts (10,000) and one open hold per ten of them, on SQLite. Target: the
median renewal ≤ 50 ms. The baseline in the same run: the same books read one ``available``
call per user, as renewals read them before, so the ratio says what the one-read form saves.

    .venv/bin/python -m bench.lease [--accounts 10000] [--repeats 9] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import add_output_flags, at_most, emit, verdict

RENEWAL_MAX_MS = 50.0


async def _measure(folder: Path, accounts: int, repeats: int) -> dict[str, Any]:
    from cluster.ray.auction_actor import AuctionActor

    users = [{"name": f"user-{k:05d}", "budget": 100.0} for k in range(accounts)]
    opened = time.perf_counter()
    actor = AuctionActor(
        settings={}, ledger=str(folder / "ledger.sqlite"), users=users, nats_url=None
    )
    setup_s = time.perf_counter() - opened
    try:
        ledger = actor._ledger
        holds = [(f"h{k}@r1", f"user-{k:05d}", 1.0) for k in range(0, accounts, 10)]
        await actor._ledger_call(
            lambda: ledger.reserve_many(holds, owner="r1", expires=time.time() + 3600)
        )
        await actor.lease("r1")  # the first grant; then renewals
        renewals = []
        for _ in range(repeats):
            start = time.perf_counter()
            lease = await actor.lease("r1")
            renewals.append(time.perf_counter() - start)
        assert len(lease.budgets) == accounts

        def per_user() -> dict[str, float]:
            return {a.user: ledger.available(a.user) for a in ledger.accounts()}

        baseline = []
        for _ in range(max(3, repeats // 3)):
            start = time.perf_counter()
            await actor._ledger_call(per_user)
            baseline.append(time.perf_counter() - start)
    finally:
        await actor.shutdown()
    renewal_ms = statistics.median(renewals) * 1000
    per_user_ms = statistics.median(baseline) * 1000
    return {
        "accounts": accounts,
        "open_holds": len(holds),
        "setup_s": round(setup_s, 2),
        "renewal_ms": round(renewal_ms, 2),
        "renewal_ms_max": round(max(renewals) * 1000, 2),
        "per_user_reads_ms": round(per_user_ms, 2),
        "speedup": round(per_user_ms / renewal_ms, 1),
    }


def judge(report: dict[str, Any]) -> dict[str, Any]:
    return verdict(
        {"renewal_ms": at_most(report["renewal_ms"], RENEWAL_MAX_MS, accounts=report["accounts"])}
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accounts", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=9)
    add_output_flags(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.accounts <= 1_000_000 or not 1 <= args.repeats <= 1000:
        parser.error("--accounts must be in [1, 1e6] and --repeats in [1, 1000]")
    with tempfile.TemporaryDirectory(prefix="disagg-lease-") as folder:
        report = asyncio.run(_measure(Path(folder), args.accounts, args.repeats))
    return emit("lease", judge(report), report, args.quiet)


if __name__ == "__main__":
    sys.exit(main())
