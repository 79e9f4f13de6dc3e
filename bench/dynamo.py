"""Our ingress over Dynamo against Dynamo's own frontend, on the same Dynamo mocker pools (1P/2D).

Why: the Dynamo backend puts the project's path (Ray Serve ingress, auction, controller, our
router in shadow) in front of Dynamo's workers and KV router; this measures what that costs
against Dynamo alone, same engines, same load, in one run of this process ((a) then (b)), so the
ratios compare like with like on a noisy host.

(a) ``frontend``: ``dynamo.frontend --router-mode kv``
(:class:`cluster.backends.dynamo.DynamoFrontend`)
    over one prefill and two decode ``dynamo.mocker`` processes started here, an embedded NATS
    server and a fresh discovery folder;
(b) ``ingress``: :class:`cluster.service.Service` on Dynamo (1P/2D, the same mocker settings;
    its own NATS, Ray, workers and Serve ingress), its controller's thresholds far above this
    load (``CONTROLLER``) so that tau stays 0. The load goes to the ingress replica's own port
    (``direct_port``: Ray Serve's direct ingress, cluster/serve/direct_ingress.py), as it goes
    to Dynamo's frontend process; then, reported beside it, the same levels through Serve's
    HTTP proxy on the API port (``ingress_proxy``: one process more per request).

Load, identical on both: chat messages over ``SYSTEM_PROMPTS`` shared ~300-token system prompts
(KV reuse) with distinct user turns, ``--max-tokens`` out, streamed by ``openai.AsyncOpenAI``;
closed loop per level for ``--seconds`` (the first ``--warmup`` not counted). Reported per level
and system: requests/s answered in the counted window, TTFT P50/P99 (to the first content chunk),
errors, and the ratios ingress/frontend; of (b): our router's agreement with Dynamo's pick at
tau = 0 (per role "same", "tie" = another worker at our lowest cost, "different"; summed over
the replicas from ``/metrics``), the unary actor calls the ingress made per request (its
``disagg_ingress_actor_calls_total``), and the TTFT P50 added at 1 client.
Target (docs/design.md "Data flow"): ingress requests/s >= 0.9x frontend's at every level
(``met``; exit status 1 if not).

    .venv/bin/python bench/dynamo.py [--reduced] [--seconds 20] [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

# Before anything imports Ray: a private loopback session, no token auth, no usage report.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np

from bench.common import add_output_flags, at_least, emit, ratio, verdict
from bench.dynamo_saturated import saturated_point
from bench.openai_load import (
    MODEL,
    PROMPTS_PER_LEVEL,
    READY_TIMEOUT_S,
    SYSTEM_PROMPTS,
    make_prompts,
    run_levels,
)

TOPOLOGY = "1P/2D"
MOCKER: dict[str, Any] = {"speedup_ratio": 1.0, "num_gpu_blocks": 256}
# Thresholds (wall s of TTFT P99) far above this load: the regime stays "below", tau = 0.
CONTROLLER: dict[str, Any] = {"theta1_s": 30.0, "theta2_s": 60.0, "resplit": {"enabled": False}}
LEVELS, REDUCED_LEVELS = (1, 8, 32), (8,)
THROUGHPUT_RATIO_MIN = 0.9


# -- (a) Dynamo's own frontend -----------------------------------------------------------------


async def start_workers(settings: Any, model_path: str, nats_url: str, discovery: Any,
                        log_dir: Path, started: list[Any]) -> None:  # fmt: skip
    """One prefill and two decode mockers, ready; each process started is appended to
    ``started`` at once (the caller stops them). A taken system port is retried."""
    from cluster.backends.dynamo import DynamoProcess, DynamoStartError, dynamo_env, worker_command
    from cluster.backends.dynamo.settings import free_system_port

    async def one(role: str, i: int) -> None:
        argv = worker_command(settings, role, model_path)
        for attempt in range(3):
            port = free_system_port()
            env = dynamo_env(settings, nats_url=nats_url, discovery=discovery, system_port=port)
            where = {"component": settings.component(role), "endpoint": settings.endpoint}
            process = DynamoProcess(argv, env, log_dir / f"{role}-{i}.log", port, **where)
            started.append(process)
            await asyncio.to_thread(process.start)
            try:
                await process.wait_ready(settings.startup_timeout_s)
                return
            except DynamoStartError:
                if not process.port_taken() or attempt == 2:
                    raise

    await asyncio.gather(one("prefill", 0), one("decode", 1), one("decode", 2))


def served_per_worker(processes: Sequence[Any]) -> dict[str, float]:
    """Requests each mocker's generate endpoint served (its ``/metrics``), by log name."""
    from cluster.backends.dynamo.process import parse_metrics

    out: dict[str, float] = {}
    for p in processes:
        for name, labels, value in parse_metrics(asyncio.run(p.metrics_text())):
            if name == "dynamo_component_requests_total" and labels.get("dynamo_endpoint") == (
                p.endpoint
            ):
                out[p.log_path.stem] = value
    return out


def run_frontend(settings: Any, model_path: str, tmp: Path, prompts: Sequence[Any],
                 args: argparse.Namespace, bar: Any) -> dict[str, Any]:  # fmt: skip
    from cluster.backends.dynamo import DynamoFrontend
    from cluster.backends.dynamo.discovery import Discovery
    from cluster.nats_server import NatsServer

    discovery = Discovery.folder(tempfile.mkdtemp(prefix="discovery-", dir=tmp))
    started: list[Any] = []
    t0 = time.perf_counter()
    with NatsServer() as nats:
        nats.export_credentials()  # the Dynamo processes connect as the dynamo role
        frontend = DynamoFrontend(settings, nats_url=nats.url, discovery=discovery,
                                  log_path=tmp / "logs" / "frontend.log")  # fmt: skip
        try:
            asyncio.run(start_workers(settings, model_path, nats.url, discovery,
                                      tmp / "logs", started))  # fmt: skip
            frontend.start()
            frontend.wait_ready_sync(READY_TIMEOUT_S)
            startup = round(time.perf_counter() - t0, 2)
            levels = run_levels(frontend.url, prompts, args, bar)
            served = served_per_worker([p for p in started if p.alive])
            return {"levels": levels, "startup_s": startup, "served": served}
        finally:
            frontend.stop()
            for process in started:
                process.stop()


# -- (b) our ingress over Dynamo ---------------------------------------------------------------


def service_config(tmp: Path) -> Any:
    from cluster.config import ServeConfig
    from cluster.nats_server import free_port

    return ServeConfig.model_validate({
        "backend": "dynamo", "topology": TOPOLOGY, "model_name": MODEL,
        "ledger_path": str(tmp / "ledger.sqlite"), "dynamo": dict(MOCKER),
        "controller": CONTROLLER, "metrics_port": 0, "direct_port": free_port(),
    })  # fmt: skip


def agreement(counts: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Per role: the counts and the rates of "same" and of "same" or "tie"."""
    out: dict[str, Any] = {}
    for role, c in counts.items():
        total = sum(c.values())
        same, tie = c.get("same", 0), c.get("tie", 0)
        out[role] = {
            **c, "total": total,
            "same_rate": round(same / total, 4) if total else None,
            "same_or_tie_rate": round((same + tie) / total, 4) if total else None,
        }  # fmt: skip
    return out


def metric_counts(
    metrics_url: str, family: str, sample: str = "_total"
) -> dict[tuple[str, ...], float]:
    """The ``sample`` samples (a counter's ``_total``, a summary's ``_sum`` or ``_count``) of
    ``family`` at ``metrics_url`` (the service's metrics server), by their label values (sorted
    by label name)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(metrics_url, timeout=10.0).text
    return {
        tuple(v for _, v in sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text) if f.name == family
        for s in f.samples if s.name == family + sample
    }  # fmt: skip


def agreement_counts(metrics_url: str) -> dict[str, dict[str, int]]:
    """``disagg_dynamo_router_agreement_total`` by role and verdict, every replica summed."""
    out: dict[str, dict[str, int]] = {r: {"same": 0, "tie": 0, "different": 0}
                                      for r in ("prefill", "decode")}  # fmt: skip
    for (agree, role), n in metric_counts(metrics_url, "disagg_dynamo_router_agreement").items():
        out.setdefault(role, {})[agree] = int(n)
    return out


def cost_gaps(metrics_url: str) -> dict[str, float | None]:
    """Per role, the mean of cost(Dynamo's pick) − our lowest cost over every followed pick
    (``disagg_dynamo_router_cost_gap``, every replica summed)."""
    family = "disagg_dynamo_router_cost_gap"
    sums = metric_counts(metrics_url, family, "_sum")
    counts = metric_counts(metrics_url, family, "_count")
    return {role: round(sums.get((role,), 0.0) / n, 6) if n else None
            for (role,), n in sorted(counts.items())}  # fmt: skip


def run_ingress(tmp: Path, prompts: Sequence[Any], args: argparse.Namespace,
                bar: Any) -> dict[str, Any]:  # fmt: skip
    from cluster.nats_server import free_port
    from cluster.ray.refs import get_answer
    from cluster.ray.status import RouterStats, as_json
    from cluster.service import Service

    svc = Service(service_config(tmp))
    t0 = time.perf_counter()
    try:
        port = free_port()
        svc.start(host="127.0.0.1", port=port)
        url, metrics = f"http://127.0.0.1:{port}", str(svc.metrics_url)
        (direct,) = svc.direct_urls
        startup, router = time.perf_counter() - t0, svc.handles.router
        assert router is not None  # started by svc.start
        before = get_answer(router.stats.remote(), RouterStats, 30).policy
        calls_before = metric_counts(metrics, "disagg_ingress_actor_calls")
        levels = run_levels(f"{direct}/v1", prompts, args, bar)
        # The replicas' last load reports reach the router actor, and their last metrics push
        # (every PUSH_PERIOD_S = 1 s) the metrics server.
        time.sleep(1.5)
        stats = get_answer(router.stats.remote(), RouterStats, 30)
        calls = metric_counts(metrics, "disagg_ingress_actor_calls")
        made = {m[0]: n - calls_before.get(m, 0.0) for m, n in calls.items()}
        requests = sum(level["requests"] for level in levels.values())
        proxy = run_levels(f"{url}/v1", prompts, args, bar)
        bar.update(1)
        return {"levels": levels, "proxy_levels": proxy, "startup_s": round(startup, 2),
                "routed_to": as_json(stats.routed_to),
                "agreement": agreement(agreement_counts(metrics)), "cost_gap": cost_gaps(metrics),
                "actor_calls": {
                    "per_request": round(sum(made.values()) / requests, 4) if requests else None,
                    "by_method": {m: int(n) for m, n in sorted(made.items()) if n},
                },
                "policy": {"before": as_json(before), "after": as_json(stats.policy)}}  # fmt: skip
    finally:
        svc.stop()


# -- the verdict and main ----------------------------------------------------------------------


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """Per level: ingress requests/s over frontend's >= 0.9 (a level without a ratio misses)."""
    return verdict({
        f"throughput_ingress_over_frontend_at_{p['clients']}": at_least(
            p["ingress_over_frontend"]["rps"], THROUGHPUT_RATIO_MIN,
            ingress_rps=p["ingress"]["rps"], frontend_rps=p["frontend"]["rps"])
        for p in report["points"]
    })  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reduced", action="store_true",
                        help="one level (8 clients), short: what the test runs")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=None,
                        help="per level, warm-up included (default 20; --reduced 6)")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=None,
                        help="first seconds not counted (default 3; --reduced 1)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    add_output_flags(parser)
    args = parser.parse_args(argv)
    r = args.reduced
    args.levels = REDUCED_LEVELS if r else LEVELS
    args.seconds = args.seconds if args.seconds is not None else (6.0 if r else 20.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if r else 3.0)
    if not 0 <= args.warmup < args.seconds <= 600:
        parser.error("need 0 <= --warmup < --seconds <= 600")
    if not 1 <= args.max_tokens <= 4096:
        parser.error("--max-tokens must be in [1, 4096]")
    return args


NOTES = [
    "(a) and (b) ran one after the other in this process on the same host; the load client "
    "(openai, one asyncio loop) shares the CPUs with the servers in both.",
    "agreement_tau0: our router's pick against Dynamo's on the same request, warm-up requests "
    "included; the controller's thresholds (config.controller) keep tau = 0 (policy.before/"
    "after); with one prefill worker the prefill pick is always the same. cost_gap_tau0: the "
    "mean of cost(Dynamo's pick) − our lowest cost in our router's cost (0: the disagreements "
    "cost nothing in our model).",
    "saturated (full run only): 64 clients, two of Dynamo's frontends (half the clients each) "
    "against two of our ingress replicas behind Serve's proxy, the controller calibrated on (b)'s "
    "1-client TTFT P99; reported, no target.",
    "actor_calls: the unary Ray actor calls the ingress made, over the requests answered in the "
    "counted windows (the calls of warm-up requests included: an upper bound); our router's "
    "shadow decision runs in each ingress replica, not in an actor.",
    "ingress: on the replica's own port (direct ingress), as the load reaches Dynamo's frontend "
    "process; ingress_proxy: the same service and levels through Serve's HTTP proxy, run after "
    "(b) and reported, not judged.",
]
MISSED_NOTE = (
    "target missed: (b) adds the Ray Serve ingress replica, our router in shadow and NATS "
    "events to every request, on the same few cores as the mockers, Dynamo's routers and the "
    "load client."
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cluster.backends.dynamo import DynamoSettings, require_dynamo
    from cluster.model_dir import ChatTokenizer, default_model_dir
    from cluster.progress import progress_bar

    require_dynamo()
    model_path = str(default_model_dir())
    saturated = not args.reduced and 1 in args.levels  # its controller calibrates on 1 client
    prompts = make_prompts(PROMPTS_PER_LEVEL * (len(args.levels) + saturated), args.seed)
    tokens = [ChatTokenizer.from_dir(Path(model_path)).encode_chat(m) for m in prompts[:64]]
    tmp = Path(tempfile.mkdtemp(prefix="bench-dynamo-"))
    bar = progress_bar(total=3 * len(args.levels) + 1 + 2 * saturated, progress=args.progress,
                       quiet=args.quiet, desc="dynamo bench")  # fmt: skip
    try:
        with contextlib.redirect_stdout(sys.stderr):  # Ray prints on stdout: only JSON goes there
            a = run_frontend(DynamoSettings.model_validate(MOCKER), model_path, tmp, prompts,
                             args, bar)  # fmt: skip
            b = run_ingress(tmp, prompts, args, bar)
            calm = b["levels"].get(1, {}).get("ttft_p99_ms")
            point = None
            if saturated and calm is not None:
                point = saturated_point(
                    DynamoSettings.model_validate(MOCKER), model_path, tmp,
                    prompts[len(args.levels) * PROMPTS_PER_LEVEL :], args, bar, calm / 1e3,
                )  # fmt: skip
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    points = []
    for c in args.levels:
        fa, ib, ip = a["levels"][c], b["levels"][c], b["proxy_levels"][c]
        keys = ("rps", "ttft_p50_ms", "ttft_p99_ms")
        points.append({
            "clients": c, "frontend": fa, "ingress": ib, "ingress_proxy": ip,
            "ingress_over_frontend": {k.removesuffix("_ms"): ratio(ib[k], fa[k]) for k in keys},
            "ingress_proxy_over_frontend": {
                k.removesuffix("_ms"): ratio(ip[k], fa[k]) for k in keys},
        })  # fmt: skip
    report: dict[str, Any] = {
        "reduced": args.reduced,
        "config": {
            "topology": TOPOLOGY, "model": MODEL, "mocker": MOCKER, "controller": CONTROLLER,
            "levels": list(args.levels), "seconds": args.seconds, "warmup_s": args.warmup,
            "max_tokens": args.max_tokens, "system_prompts": SYSTEM_PROMPTS,
            "prompt_tokens_mean": round(float(np.mean([len(t) for t in tokens])), 1),
            "client": "openai.AsyncOpenAI, chat.completions, stream=True", "cpus": os.cpu_count(),
        },
        "startup_s": {"frontend": a["startup_s"], "ingress": b["startup_s"]},
        "points": points,
        "served": {"frontend_per_worker": a["served"], "ingress_routed_to": b["routed_to"]},
        "agreement_tau0": b["agreement"],
        "cost_gap_tau0": b["cost_gap"],
        "policy": b["policy"],
        "actor_calls": b["actor_calls"],
        "saturated": point,
    }  # fmt: skip
    if 1 in args.levels:
        f1, i1 = a["levels"][1]["ttft_p50_ms"], b["levels"][1]["ttft_p50_ms"]
        report["ttft_p50_added_ms_at_1"] = None if f1 is None or i1 is None else round(i1 - f1, 2)
    judged = judge(report)
    report["notes"] = NOTES if judged["met"] else [*NOTES, MISSED_NOTE]
    return emit("dynamo", judged, report, args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
