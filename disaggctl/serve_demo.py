"""``make demo``: the live service on the embedded default, driven through the knee and a spike.

It starts ``disaggctl serve``'s service in-process (local Ray, embedded NATS, simulated 70B 1P/5D
at ``speedup``), makes three bidding users (gold, silver, bronze) beside anonymous traffic, and
runs the HTTP load client (:mod:`disaggctl.load_client`) through calm → ramp → saturated hold →
recovery → spike → calm. Every second it reads the service's ``/metrics`` (a live status line on
a terminal) into a timeline. At the end: a phase table (requests, TTFT/ITL P99, throughput, the
regime and poa_hat the service reported), the regime changes, priced priority per user, and
``timeline.png`` + ``serve.json`` in the results folder. Re-splits of the P/D pools the controller
made on its own (docs/design.md §4, "two levers") are listed with their reason and marked on the
plot; the load is the same whether one happens or not.

Phases are attributed by arrival: a request belongs to the phase in which it was sent.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from cluster.config import ServeConfig
from cluster.nats_server import free_port
from cluster.ray.refs import get_answer
from cluster.ray.status import AuctionStats, ControllerSnapshot, as_json
from cluster.serve.users import Users
from cluster.service import Service
from cluster.sim.profile import load_profile
from cluster.sim.scenario import calm_baseline_p99
from controller.detector import CALM_MULTIPLES
from disaggctl.jsonout import strict_dumps
from disaggctl.load_client import Bidder, ClientResult, LoadPhase, by_phase, run_load
from disaggctl.serve_cli import format_status, parse_status

__all__ = ["DEMO_PHASES", "run_serve_demo"]

# Concurrency is what sets the regime (the knee of 70B 1P/5D with 64 output tokens lies near
# C ≈ 30: X_max · E2E(C=1) ≈ 47 req/s · 0.65 s); the speed-up only stretches time, so a 2-core
# machine carries the HTTP streams (docs/design.md "Serve runtime").
DEMO_PHASES = (
    LoadPhase("calm", 20.0, 8, ramp_s=3.0),
    LoadPhase("ramp", 35.0, 64, ramp_s=35.0),
    LoadPhase("saturated", 25.0, 64),
    LoadPhase("recovery", 25.0, 8, ramp_s=2.0),
    LoadPhase("spike", 10.0, 96, ramp_s=1.0),
    LoadPhase("after", 20.0, 8, ramp_s=1.0),
)
DEMO_SPEEDUP = 0.5
MAX_TOKENS = 64
# Answers vary in length (the simulated demo's reason, disaggctl.system_demo): ±50% around 64.
MAX_TOKENS_RANGE_RATIO = 0.5
BIDDERS = (("gold", 3.0, 0.06), ("silver", 1.0, 0.06), ("bronze", 0.3, 0.06))  # bid, share
BUDGET = 1000.0
# Regime thresholds as multiples of the calm TTFT P99 (docs/design.md §4), the detector's own:
# the simulator's calm baseline for this profile, stretched to wall time.
BELOW_X, SATURATED_X = CALM_MULTIPLES


@dataclass(frozen=True)
class Sample:
    t: float
    phase: str
    clients: int
    status: dict[str, Any]


def demo_config(out: Path, speedup: float, seed: int) -> ServeConfig:
    profile = load_profile("b200-llama70b-fp8-tp4")
    baseline = calm_baseline_p99(profile, "1P/5D", concurrency=8, seconds=20.0, seed=seed)
    return ServeConfig.model_validate(
        {
            "speedup": speedup,
            "seed": seed,
            "ledger_path": str(out / "ledger.sqlite"),
            "metrics_port": 0,  # any free port: the demo reads it from the service
            "controller": {
                "calibrate": {
                    "baseline_s": baseline / speedup,
                    "below_x": BELOW_X,
                    "saturated_x": SATURATED_X,
                }
            },
        }
    )


async def _poll(
    metrics_url: str, start: float, phases: Sequence[LoadPhase], samples: list[Sample], live: bool
) -> None:
    from disaggctl.load_client import concurrency_at

    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            t = time.perf_counter() - start
            phase, clients = concurrency_at(phases, t)
            try:
                status = parse_status((await client.get(metrics_url)).text)
            except httpx.HTTPError:
                status = {}
            samples.append(Sample(t, phase, clients, status))
            if live:
                line = f"{t:5.0f}s {phase:<9} C={clients:<3} " + format_status(status)
                print("\r" + line[:160].ljust(160), end="", file=sys.stderr, flush=True)
            await asyncio.sleep(1.0)


async def _drive(
    url: str,
    metrics_url: str,
    phases: Sequence[LoadPhase],
    bidders: Sequence[Bidder],
    seed: int,
    live: bool,
    model: str,
) -> tuple[list[ClientResult], list[Sample], float]:
    samples: list[Sample] = []
    start = time.perf_counter()
    poller = asyncio.create_task(_poll(metrics_url, start, phases, samples, live))
    try:
        run = await run_load(
            url,
            phases,
            bidders=bidders,
            max_tokens=MAX_TOKENS,
            max_tokens_range_ratio=MAX_TOKENS_RANGE_RATIO,
            model=model,
            seed=seed,
        )
    finally:
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
    if live:
        print(file=sys.stderr)
    return run.results, samples, run.seconds


def _p(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def phase_table(
    results: Sequence[ClientResult], samples: Sequence[Sample], phases: Sequence[LoadPhase]
) -> list[dict[str, Any]]:
    grouped = by_phase(results)
    rows = []
    for phase in phases:
        rs = grouped.get(phase.name, [])
        ok = [r for r in rs if r.status == 200]
        ticks = [s for s in samples if s.phase == phase.name and s.status]
        poa = [s.status["poa_hat"] for s in ticks if _finite(s.status.get("poa_hat"))]
        last = ticks[-1].status if ticks else {}
        rows.append(
            {
                "phase": phase.name,
                "clients": phase.concurrency,
                "requests": len(rs),
                "ok": len(ok),
                "errors": len(rs) - len(ok),
                "throughput_rps": len(ok) / phase.seconds,
                "ttft_p50_s": _p([r.ttft_s for r in ok if r.ttft_s is not None], 50),
                "ttft_p99_s": _p([r.ttft_s for r in ok if r.ttft_s is not None], 99),
                "itl_p99_s": _p([r.itl_s for r in ok if r.itl_s is not None], 99),
                "regime_at_end": last.get("regime"),
                "poa_hat_mean": float(np.mean(poa)) if poa else None,
                "poa_hat_below_one": sum(1 for v in poa if v < 1.0),
            }
        )
    return rows


def _auction_stats(service: Service) -> dict[str, Any]:
    """The auction actor's totals: money captured (ledger) and welfare per user."""
    auction = service.handles.auction
    if auction is None:
        return {}
    try:
        return dict(as_json(get_answer(auction.stats.remote(), AuctionStats, 10)))
    except Exception:  # a report without the auction's totals beats no report
        return {}


def user_table(
    results: Sequence[ClientResult],
    bidders: Sequence[Bidder],
    auction: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Per user: what was answered and auctioned, where it queued, TTFT P50/P99, what the
    auction charged (the ledger) in all and per answered request, and the user's welfare V_i
    summed over batches (docs/design.md §1)."""
    auction = auction or {}
    charged = auction.get("users") or {}
    welfare = auction.get("user_welfare") or {}
    rows = []
    for name, bid in [(b.name, b.bid) for b in bidders] + [("anonymous", 0.0)]:
        rs = [r for r in results if r.user == name and r.status == 200]
        queued = [r.position for r in rs if r.position > 0]
        paid = float((charged.get(name) or {}).get("spent", 0.0))
        rows.append(
            {
                "user": name,
                "bid": bid,
                "answered": len(rs),
                "auctioned": len(queued),
                "mean_position": float(np.mean(queued)) if queued else None,
                "paid": paid,
                "paid_per_request": paid / len(rs) if rs else None,
                "welfare": float(welfare.get(name, 0.0)),
                "ttft_p50_s": _p([r.ttft_s for r in rs if r.ttft_s is not None], 50),
                "ttft_p99_s": _p([r.ttft_s for r in rs if r.ttft_s is not None], 99),
            }
        )
    return rows


def _controller_snapshot(service: Service) -> dict[str, Any]:
    controller = service.handles.controller
    if controller is None:
        return {}
    try:
        return dict(as_json(get_answer(controller.snapshot.remote(), ControllerSnapshot, 10)))
    except Exception:  # a report without the re-splits beats no report
        return {}


# How a re-split ends: its worker serves the new role, or the old one again (cluster/ray/pools.py).
ENDS = ("warm", "abandoned", "cancelled")


def resplit_table(snapshot: dict[str, Any], start_wall: float) -> list[dict[str, Any]]:
    """The re-splits the controller made (its pools' steps, docs/design.md §4): per re-split,
    when it started and ended (demo seconds), the pools before → after, and why."""
    steps = (snapshot.get("pools") or {}).get("steps") or []
    out: list[dict[str, Any]] = []
    for step in steps:
        pools = (len(step["prefill"]), len(step["decode"]))
        if step["action"] == "resplit_start":
            # The moving worker is in neither pool now: before, it was in the other role's.
            moved_from_prefill = step["to_role"] == "decode"
            before = (pools[0] + moved_from_prefill, pools[1] + (not moved_from_prefill))
            out.append({
                "t": round(step["t"] - start_wall, 1), "end_t": None, "worker": step["worker_id"],
                "to_role": step["to_role"], "before": "{}P/{}D".format(*before), "after": None,
                "reason": step["reason"], "outcome": None,
            })  # fmt: skip
        elif step["action"] in ENDS and out and out[-1]["end_t"] is None:
            out[-1]["end_t"] = round(step["t"] - start_wall, 1)
            out[-1]["after"] = "{}P/{}D".format(*pools)
            out[-1]["outcome"] = step["action"]
    return out


def regime_changes(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    changes, last = [], None
    for s in samples:
        regime = s.status.get("regime")
        if regime is not None and regime != last:
            changes.append(
                {
                    "t": round(s.t, 1),
                    "phase": s.phase,
                    "regime": regime,
                    "tau": s.status.get("tau"),
                    "omega": s.status.get("omega"),
                }
            )
            last = regime
    return changes


def error_summary(results: Sequence[ClientResult]) -> dict[str, Any]:
    """Failed requests by HTTP status, with the first message seen for each."""
    out: dict[str, Any] = {}
    for r in results:
        if r.status != 200:
            entry = out.setdefault(str(r.status), {"count": 0, "first": r.error})
            entry["count"] += 1
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if _finite(value) else "-"


def format_report(report: dict[str, Any]) -> str:
    lines = ["phase       C   requests  ok     TTFT p50   TTFT p99   ITL p99   req/s  regime"
             "      poa_hat"]  # fmt: skip
    for r in report["phases"]:
        flag = "†" if r["poa_hat_below_one"] else ""
        lines.append(
            f"{r['phase']:<10} {r['clients']:>3} {r['requests']:>9} {r['ok']:>4} "
            f"{_fmt(r['ttft_p50_s'], '9.3f')}s {_fmt(r['ttft_p99_s'], '9.3f')}s "
            f"{_fmt(r['itl_p99_s'], '8.4f')}s {r['throughput_rps']:>6.1f}  "
            f"{r['regime_at_end'] or '-':<10} {_fmt(r['poa_hat_mean'], '.2f')}{flag}"
        )
    if any(r["poa_hat_below_one"] for r in report["phases"]):
        lines.append("† some ticks of this phase read poa_hat < 1, which is impossible (realised "
                     "over optimal): an estimator defect, shown as measured.")  # fmt: skip
    lines.append("")
    lines.append("regime changes: " + ", ".join(
        f"{c['t']:.0f}s {c['regime']} (τ={c['tau']}, ω={c['omega']})" for c in report["regimes"]
    ))  # fmt: skip
    resplits = report.get("resplits") or []
    if not resplits:
        lines.append("re-splits: none (the pools kept their split: saturation never read as "
                     "capacity-bound long enough, or no overload outlasted the role switch a "
                     "move would cost)")  # fmt: skip
    for r in resplits:
        end = "still warming" if r["end_t"] is None else f"until {r['end_t']:.0f}s"
        outcome = "" if r["outcome"] in (None, "warm") else f" ({r['outcome']})"
        lines.append(f"re-split at {r['t']:.0f}s ({end}): {r['before']} → {r['after'] or '…'}"
                     f"{outcome}: {r['reason']}")  # fmt: skip
    lines.append("")
    lines.append("user       bid  answered  auctioned  mean position   paid  per req  welfare"
                 "   TTFT p50   TTFT p99")  # fmt: skip
    for u in report["users"]:
        lines.append(
            f"{u['user']:<9} {u['bid']:>4.1f} {u['answered']:>9} {u['auctioned']:>10} "
            f"{_fmt(u['mean_position'], '14.1f')} {u['paid']:>6.2f} "
            f"{_fmt(u['paid_per_request'], '8.3f')} {u['welfare']:>8.2f} "
            f"{_fmt(u['ttft_p50_s'], '9.3f')}s {_fmt(u['ttft_p99_s'], '9.3f')}s"
        )
    lines.append(
        f"revenue charged {report['revenue']:.2f}, welfare of the auctioned batches "
        f"{report['welfare']:.2f}  (ledger: {report['ledger']})"
    )
    for status, entry in report.get("errors", {}).items():
        lines.append(f"HTTP {status}: {entry['count']} requests, e.g. {entry['first']}")
    return "\n".join(lines)


def run_serve_demo(
    out: Path,
    *,
    seed: int = 0,
    phases: Sequence[LoadPhase] = DEMO_PHASES,
    speedup: float = DEMO_SPEEDUP,
    progress: bool | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Start the service, drive it, stop it; write ``serve.json`` and ``timeline.png``."""
    from cluster.progress import progress_wanted
    from disaggctl.serve_plot import plot_timeline

    out.mkdir(parents=True, exist_ok=True)
    ledger = out / "ledger.sqlite"
    for stale in (ledger, Path(f"{ledger}-wal"), Path(f"{ledger}-shm")):
        stale.unlink(missing_ok=True)  # a demo run starts with fresh budgets
    keys = {name: "sk-demo-" + secrets.token_urlsafe(16) for name, _, _ in BIDDERS}
    users = Users.from_keys({name: (keys[name], BUDGET) for name, _, _ in BIDDERS})
    bidders = [Bidder(name, keys[name], bid, share) for name, bid, share in BIDDERS]
    config = demo_config(out, speedup, seed)
    port = free_port()
    live = progress_wanted(progress, quiet)
    service = Service(config, users=users)
    try:
        if not quiet:
            print(f"starting the service ({config.profile} {config.topology}, "
                  f"speed-up {speedup}) ...", file=sys.stderr)  # fmt: skip
        service.start(port=port)
        assert service.url is not None and service.metrics_url is not None
        if not quiet:
            print(f"serving at {service.url}/v1; driving {sum(p.seconds for p in phases):.0f} s "
                  "of load", file=sys.stderr)  # fmt: skip
        start_wall = time.time()
        results, samples, seconds = asyncio.run(
            _drive(service.url, service.metrics_url, phases, bidders, seed, live, config.model_name)
        )
        auction = _auction_stats(service)
        resplits = resplit_table(_controller_snapshot(service), start_wall)
    finally:
        service.stop()
    report = {
        "config": config.model_dump(),
        "speedup": speedup,
        "seconds": seconds,
        "phases": phase_table(results, samples, phases),
        "regimes": regime_changes(samples),
        "resplits": resplits,
        "users": user_table(results, bidders, auction),
        "welfare": float(auction.get("welfare", 0.0)),
        "revenue": float(auction.get("revenue", 0.0)),
        "errors": error_summary(results),
        "ledger": str(ledger),
        "timeline": [asdict(s) for s in samples],
    }
    (out / "serve.json").write_text(strict_dumps(report, indent=1))
    plot_timeline(samples, phases, out / "timeline.png", resplits=resplits)
    shutil.rmtree(out / "tmp", ignore_errors=True)
    return report
