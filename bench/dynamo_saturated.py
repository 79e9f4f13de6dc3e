"""``bench.dynamo``'s saturated point: two of Dynamo's frontends against two of our ingress
replicas, on the same mocker pools (1P/2D), with the load split between them.

Why: saturation is where the controller should beat Dynamo's static router (it raises the
router's temperature and lowers the overlap weight so replicas on stale views stop herding), and
both systems scale their routing out the same way: Dynamo with frontends that each run a KvRouter
on the same KV events, we with ingress replicas that each route on their own view. Reported, no
target (docs/design.md "Data flow").

(a) two ``dynamo.frontend --router-mode kv`` over one prefill and two decode mockers; half of the
    ``CLIENTS`` closed-loop clients on each frontend;
(b) :class:`cluster.service.Service` on Dynamo, ``ingress_replicas: 2``, its controller
    calibrated on the calm TTFT P99 that (b) measured at 1 client earlier in the run (θ1, θ2 =
    ``controller.detector.CALM_MULTIPLES`` × it, as a user calibrates it), so the policy follows
    the load; half of the clients on each replica's own port (``direct_port``, as half go to
    each of Dynamo's frontends), and each replica's share is read from its load reports.

Per system: requests/s answered, TTFT P50/P99; per frontend or replica its share of the load;
for (b) the regime and the policy at the end. The mockers decode at ``MOCKER``'s speed with 256
KV blocks each, so at ``CLIENTS`` clients the decode workers' KV memory is what queues requests.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import ratio
from bench.load_stats import Sample, summarize
from bench.openai_load import READY_TIMEOUT_S, closed_loop_over, wait_answering
from controller.detector import CALM_MULTIPLES

CLIENTS = 64
REPLICAS = 2


def _summaries(parts: Sequence[Sequence[Sample]], args: argparse.Namespace) -> dict[str, Any]:
    """The whole system's summary and each part's (a frontend's clients)."""
    every = [s for part in parts for s in part]
    return {
        "total": summarize(every, args.warmup, args.seconds),
        "each": [summarize(part, args.warmup, args.seconds) for part in parts],
    }


def run_frontends(settings: Any, model_path: str, tmp: Path, prompts: Sequence[Any],
                  args: argparse.Namespace, bar: Any) -> dict[str, Any]:  # fmt: skip
    """(a): two frontends on one NATS and one discovery folder, over fresh mockers."""
    from bench.dynamo import served_per_worker, start_workers
    from cluster.backends.dynamo import DynamoFrontend
    from cluster.backends.dynamo.discovery import Discovery
    from cluster.nats_server import NatsServer

    discovery = Discovery.folder(tempfile.mkdtemp(prefix="discovery-saturated-", dir=tmp))
    started: list[Any] = []
    with NatsServer() as nats:
        nats.export_credentials()  # the Dynamo processes connect as the dynamo role
        logs = [tmp / "logs" / f"frontend-saturated-{i}.log" for i in range(REPLICAS)]
        fronts = [
            DynamoFrontend(settings, nats_url=nats.url, discovery=discovery, log_path=log)
            for log in logs
        ]
        try:
            asyncio.run(start_workers(settings, model_path, nats.url, discovery,
                                      tmp / "logs", started))  # fmt: skip
            for front in fronts:
                front.start()
            for front in fronts:
                front.wait_ready_sync(READY_TIMEOUT_S)
                wait_answering(front.url, prompts[-1], args.max_tokens)
            parts = asyncio.run(closed_loop_over([f.url for f in fronts], prompts, CLIENTS,
                                                 args.seconds, args.max_tokens))  # fmt: skip
            served = served_per_worker([p for p in started if p.alive])
        finally:
            for front in fronts:
                front.stop()
            for process in started:
                process.stop()
    bar.update(1)
    return {**_summaries(parts, args), "served": served}


def run_replicas(tmp: Path, prompts: Sequence[Any], args: argparse.Namespace, bar: Any,
                 calm_ttft_p99_s: float) -> dict[str, Any]:  # fmt: skip
    """(b): our ingress with two replicas and a live controller."""
    from bench.dynamo import service_config
    from cluster.nats_server import free_port, free_ports
    from cluster.ray.controller_settings import ControllerSettings
    from cluster.ray.refs import get_answer
    from cluster.ray.status import RouterStats, as_json
    from cluster.service import Service

    folder = tmp / "saturated"
    folder.mkdir(exist_ok=True)
    controller = ControllerSettings.model_validate({
        "calibrate": {"baseline_s": calm_ttft_p99_s}, "resplit": {"enabled": False},
    })  # fmt: skip
    config = service_config(folder).model_copy(update={
        "ingress_replicas": REPLICAS, "controller": controller, "direct_port": free_ports(REPLICAS),
    })  # fmt: skip
    svc = Service(config)
    try:
        port = free_port()
        svc.start(host="127.0.0.1", port=port)
        urls, router = [f"{u}/v1" for u in svc.direct_urls], svc.handles.router
        assert router is not None  # started by svc.start
        for url in urls:
            wait_answering(url, prompts[-1], args.max_tokens)
        before = get_answer(router.stats.remote(), RouterStats, 30).routed_by_replica
        parts = asyncio.run(closed_loop_over(urls, prompts, CLIENTS, args.seconds,
                                             args.max_tokens))  # fmt: skip
        time.sleep(1.5)  # the replicas' last load reports reach the router actor
        stats = get_answer(router.stats.remote(), RouterStats, 30)
    finally:
        svc.stop()
    bar.update(1)
    routed = {r: n - before.get(r, 0) for r, n in stats.routed_by_replica.items()}
    return {
        **_summaries(parts, args),
        "routed_by_replica": dict(sorted(routed.items())),
        "policy_at_end": as_json(stats.policy),
        "thresholds_s": [round(x * calm_ttft_p99_s, 4) for x in CALM_MULTIPLES],
    }


def saturated_point(settings: Any, model_path: str, tmp: Path, prompts: Sequence[Any],
                    args: argparse.Namespace, bar: Any,
                    calm_ttft_p99_s: float) -> dict[str, Any]:  # fmt: skip
    """Both sides, one after the other, and the ratios ours / Dynamo's."""
    a = run_frontends(settings, model_path, tmp, prompts, args, bar)
    b = run_replicas(tmp, prompts, args, bar, calm_ttft_p99_s)
    fa, ib = a["total"], b["total"]
    return {
        "clients": CLIENTS,
        "frontends": a,
        "ingress_replicas": b,
        "ingress_over_frontends": {
            k.removesuffix("_ms"): ratio(ib[k], fa[k])
            for k in ("rps", "ttft_p50_ms", "ttft_p99_ms")
        },
    }
