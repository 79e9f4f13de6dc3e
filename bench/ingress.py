"""Ingress overhead: the full serve path against a bare Ray Serve deployment of the same engine.

The same streamed requests go, in one Ray session, first through (a) then through (b):

(a) ``bare``: one Ray Serve deployment (FastAPI, one replica) whose replica holds one
    ``cluster.sim.engines.DecodeEngine`` of the profile and speed-up, and streams its tokens as
    SSE completion chunks: no auction, router, worker actor or NATS;
(b) ``full``: ``cluster.service.Service`` (default topology 0P/1D, so the one decode engine
    prefills locally as in (a)): OpenAI ingress replica (admission under the auction's lease,
    routing in-process) → decode worker actor through the replica's shared token stream to it,
    events on an embedded NATS server.

Requests are ``POST /v1/completions`` with ``stream: true``, a prompt of token ids (the
calibration workload's shape: five shared system templates and a unique question, tokenized
once by the client with the chat template, so both sides see the same tokens and the same KV
prefixes; the tokenizer is left out of both) and ``max_tokens`` output tokens. Closed loop at
1, 32 and 256 clients, ``--seconds`` per point of which the first ``--warmup`` are not counted.
Per point and system: p50/p99 TTFT and E2E (wall, at the client), requests/s sustained over the
counted window, errors; the full path's added latency (full − bare) and the ratios full/bare.

Targets (docs/design.md "Data flow"): at 32 clients full-path p50 E2E ≤ 1.15× bare and requests/s
≥ 0.9× bare; at 256 clients (when measured) requests/s ≥ 0.7× bare. Per point the full path also
reports the unary Ray actor calls its ingress made per request, read from the ingress's
``disagg_ingress_actor_calls_total``: to the control plane (``actor_calls_per_request``: the
auction's exchange) and to the engines (``engine_calls_per_request``: batches of orders for a
decode worker's shared stream, prompts to prefill; the bare deployment's engine is in-process).
``met`` on top of the JSON says whether every target holds; the exit status is 1 when one does not.

    .venv/bin/python -m bench.ingress [--seconds 12] [--quick] [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np

from bench.common import add_output_flags, at_least, at_most, emit, ratio, verdict
from bench.completions_load import closed_loop, make_prompts, wait_ready
from bench.load_stats import summarize

TARGET_CLIENTS = 32
P50_E2E_RATIO_MAX = 1.15  # full / bare, at TARGET_CLIENTS
THROUGHPUT_RATIO_MIN = 0.9  # full / bare, at TARGET_CLIENTS
HIGH_CLIENTS = 256
HIGH_THROUGHPUT_RATIO_MIN = 0.7  # full / bare, at HIGH_CLIENTS (when that point is measured)
CLIENTS = (1, 32, 256)
QUICK_CLIENTS = (1, 32)
PROMPTS = 512  # distinct prompts, sent in the same order to both systems
BARE_APP = "bare"

log = logging.getLogger("bench.ingress")


# -- (a) the bare deployment -----------------------------------------------------------------


class BareEngineIngress:
    """A Serve replica holding one simulated decode engine; ``/v1/completions`` streams its
    tokens as SSE completion chunks (the token id as text). Plain class: decorated in
    :func:`run_bare`, so importing this module imports no Ray."""

    def __init__(self, profile: str, speedup: float, seed: int) -> None:
        from cluster.sim.engines import DecodeEngine
        from cluster.sim.profile import load_profile
        from cluster.sim.wallclock import Clock

        self.profile = load_profile(profile)
        self.engine = DecodeEngine(0, self.profile, clock=Clock(speedup), seed=seed)

    async def __serve_build_asgi_app__(self) -> Any:
        from fastapi import FastAPI
        from fastapi.responses import StreamingResponse

        from router.hashing import block_hashes, sequence_hashes

        app = FastAPI()
        block_size = self.profile.block_size
        engine = self.engine

        # A plain Starlette route: no annotations to resolve (this class may travel by value).
        async def completions(request: Any) -> Any:
            body = await request.json()
            tokens = [int(t) for t in body["prompt"]]
            n = int(body["max_tokens"])
            local = block_hashes(tokens, block_size)
            request_id = uuid.uuid4().hex
            stream = engine.generate(
                request_id, len(tokens), local, sequence_hashes(local), n, prefill_locally=True
            )
            return StreamingResponse(_bare_sse(request_id, stream), media_type="text/event-stream")

        app.add_route("/v1/completions", completions, methods=["POST"])
        return app


async def _bare_sse(request_id: str, tokens: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    head = {"id": f"cmpl-{request_id}", "object": "text_completion", "model": BARE_APP}
    async with contextlib.aclosing(tokens):  # type: ignore[type-var]
        async for token in tokens:
            choice = {"index": 0, "text": f" {token.token_id}",
                      "finish_reason": "length" if token.last else None}  # fmt: skip
            yield b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


# -- the load ----------------------------------------------------------------------------------


def compare(bare: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """Added latency (full − bare, ms) and ratios full/bare of one point."""
    keys = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    added = {
        k: None if bare[k] is None or full[k] is None else round(full[k] - bare[k], 2) for k in keys
    }
    ratios = {k.removesuffix("_ms"): ratio(full[k], bare[k]) for k in keys}
    ratios["rps"] = ratio(full["rps"], bare["rps"])
    return {"added_ms": added, "ratios": ratios}


# -- running both systems ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_points(
    base_url: str,
    model: str,
    prompts: Sequence[list[int]],
    args: argparse.Namespace,
    bar: Any,
    metrics_url: str | None = None,
) -> dict[int, dict[str, Any]]:
    """Each client count in turn; with ``metrics_url`` (the full path's metrics server) also
    the actor calls per request."""
    from cluster.ray.metrics_server import PUSH_PERIOD_S

    warm = {"model": model, "prompt": prompts[0], "max_tokens": args.max_tokens, "stream": True}
    wait_ready(base_url, warm)
    out = {}
    for clients in args.clients:
        before = actor_calls(metrics_url)
        samples = asyncio.run(
            closed_loop(base_url, prompts, clients=clients, seconds=args.seconds,
                        max_tokens=args.max_tokens, model=model)
        )  # fmt: skip
        out[clients] = summarize(samples, args.warmup, args.seconds)
        # The replicas push their counts every PUSH_PERIOD_S: wait for the last push, which
        # also lets the last requests' bookkeeping settle.
        time.sleep(PUSH_PERIOD_S + 0.5)
        after = actor_calls(metrics_url)
        if before is not None and after is not None and samples:
            calls = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            for plane in ("control", "engine"):
                made = {m: n for (m, p), n in calls.items() if p == plane}
                name = "actor_calls" if plane == "control" else "engine_calls"
                out[clients][f"{name}_per_request"] = round(sum(made.values()) / len(samples), 3)
                out[clients][f"{name}_by_method"] = {
                    m: round(n / len(samples), 3) for m, n in sorted(made.items()) if n
                }
        bar.update(1)
    return out


def actor_calls(metrics_url: str | None) -> dict[tuple[str, str], float] | None:
    """The ingress's ``disagg_ingress_actor_calls_total`` by (method, plane) (None: no metrics
    server, e.g. the bare deployment). Every request counted by the ingress, warm-up
    included."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    if metrics_url is None:
        return None
    try:
        resp = httpx.get(metrics_url, timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        for family in text_string_to_metric_families(resp.text):
            if family.name == "disagg_ingress_actor_calls":
                return {(s.labels["method"], s.labels["plane"]): s.value
                        for s in family.samples if s.name.endswith("_total")}  # fmt: skip
    except ValueError:
        return None
    return {}  # the family has no sample yet: no call made


def run_bare(
    config: Any, prompts: Sequence[list[int]], args: argparse.Namespace, bar: Any
) -> tuple[dict[int, dict[str, Any]], float]:
    from ray import serve

    from cluster.serve.deployment import MAX_ONGOING_REQUESTS
    from cluster.sim.cluster import Topology

    seed = config.seed * 7919 + Topology.parse(config.topology).prefill  # the first decode id
    port = _free_port()
    t0 = time.perf_counter()
    deployment = serve.deployment(name="bare-engine", max_ongoing_requests=MAX_ONGOING_REQUESTS)(
        serve.ingress()(BareEngineIngress)
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment.bind(config.profile, config.speedup, seed), name=BARE_APP,
                  route_prefix="/")  # fmt: skip
        startup = time.perf_counter() - t0
        return run_points(f"http://127.0.0.1:{port}", BARE_APP, prompts, args, bar), startup
    finally:
        with contextlib.suppress(Exception):
            serve.delete(BARE_APP)
        serve.shutdown()  # type: ignore[no-untyped-call]  # Ray Serve leaves it untyped


def run_full(
    config: Any, prompts: Sequence[list[int]], args: argparse.Namespace, bar: Any
) -> tuple[dict[int, dict[str, Any]], float]:
    from cluster.service import Service

    port = _free_port()
    t0 = time.perf_counter()
    with Service(config) as service:  # stop() on the way out: actors, Serve, NATS
        service.start(host="127.0.0.1", port=port)
        startup = time.perf_counter() - t0
        points = run_points(f"http://127.0.0.1:{port}", config.model_name, prompts, args, bar,
                            metrics_url=service.metrics_url)  # fmt: skip
        return points, startup


# -- the verdict -------------------------------------------------------------------------------


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """From ``report["points"]`` (each ``{"clients", "bare", "full"}`` with the summaries above):
    at ``TARGET_CLIENTS`` clients full p50 E2E / bare ≤ 1.15 and full requests/s / bare ≥ 0.9;
    at ``HIGH_CLIENTS``, when measured, requests/s ≥ 0.7. A missing ``TARGET_CLIENTS`` point, or
    a ratio that cannot be formed (no answered request), is a miss."""
    points = {p["clients"]: p for p in report.get("points", [])}

    def sides(clients: int) -> tuple[dict[str, Any], dict[str, Any]]:
        point = points.get(clients)
        return (point["bare"], point["full"]) if point else ({}, {})

    def rpsratio(bare: dict[str, Any], full: dict[str, Any]) -> float | None:
        if full.get("rps") == 0:  # nothing answered: a zero throughput ratio, not a missing one
            return 0.0 if bare.get("rps") else None
        return ratio(full.get("rps"), bare.get("rps"))

    bare, full = sides(TARGET_CLIENTS)
    p50 = ratio(full.get("e2e_p50_ms"), bare.get("e2e_p50_ms"))
    checks = {
        f"p50_e2e_full_over_bare_at_{TARGET_CLIENTS}": at_most(
            p50, P50_E2E_RATIO_MAX,
            full_ms=full.get("e2e_p50_ms"), bare_ms=bare.get("e2e_p50_ms"),
        ),
        f"throughput_full_over_bare_at_{TARGET_CLIENTS}": at_least(
            rpsratio(bare, full), THROUGHPUT_RATIO_MIN,
            full_rps=full.get("rps"), bare_rps=bare.get("rps"),
        ),
    }  # fmt: skip
    if HIGH_CLIENTS in points:
        bare, full = sides(HIGH_CLIENTS)
        checks[f"throughput_full_over_bare_at_{HIGH_CLIENTS}"] = at_least(
            rpsratio(bare, full), HIGH_THROUGHPUT_RATIO_MIN,
            full_rps=full.get("rps"), bare_rps=bare.get("rps"),
        )  # fmt: skip
    return verdict(checks)


# -- main --------------------------------------------------------------------------------------


def _clients(text: str) -> tuple[int, ...]:
    values = tuple(int(x) for x in text.split(","))
    if not values or any(not 1 <= c <= 1024 for c in values):
        raise argparse.ArgumentTypeError("a comma-separated list of client counts in [1, 1024]")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from cluster.config import DEFAULT_CONFIG

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_CONFIG.profile)
    parser.add_argument("--speedup", type=float, default=DEFAULT_CONFIG.speedup,
                        help="virtual seconds per wall second of both engines")  # fmt: skip
    parser.add_argument("--topology", default="0P/1D", help="of the full path: 0P/1D or 1P/1D")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--seconds", type=float, default=None,
                        help="per point, warm-up included (default 12; --quick: 5)")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=None,
                        help="first seconds not counted (default 2; --quick: 1)")  # fmt: skip
    parser.add_argument("--clients", type=_clients, default=None,
                        help="comma-separated (default 1,32,256; --quick: 1,32)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="short points, 1 and 32 clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream-chunk-s", type=float, default=None,
                        help="the full path's stream_chunk_s (default: the config's)")  # fmt: skip
    add_output_flags(parser)
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 5.0 if args.quick else 12.0
    if args.warmup is None:
        args.warmup = 1.0 if args.quick else 2.0
    if args.clients is None:
        args.clients = QUICK_CLIENTS if args.quick else CLIENTS
    if not 0 <= args.warmup < args.seconds <= 600:
        parser.error("need 0 <= --warmup < --seconds <= 600")
    if not 1 <= args.max_tokens <= 4096:
        parser.error("--max-tokens must be in [1, 4096]")
    if args.topology.replace(" ", "").upper() not in ("0P/1D", "1P/1D"):
        parser.error("--topology must be 0P/1D or 1P/1D")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cluster.config import ServeConfig
    from cluster.models import ConfigError
    from cluster.progress import progress_bar

    tmp = tempfile.mkdtemp(prefix="bench-ingress-")
    try:
        chunk = {} if args.stream_chunk_s is None else {"stream_chunk_s": args.stream_chunk_s}
        config = ServeConfig(
            profile=args.profile, speedup=args.speedup, topology=args.topology, seed=args.seed,
            ledger_path=str(Path(tmp) / "ledger.sqlite"), metrics_port=0, **chunk,
        )  # fmt: skip
    except (ConfigError, ValueError) as exc:
        print(f"bench.ingress: {exc}", file=sys.stderr)
        return 2
    if args.quiet:
        for name in ("ray", "ray.serve"):
            logging.getLogger(name).setLevel(logging.ERROR)
    prompts = make_prompts(PROMPTS, args.seed)
    bar = progress_bar(total=2 * len(args.clients), progress=args.progress, quiet=args.quiet,
                       desc="ingress bench")  # fmt: skip
    try:
        # Ray prints some cluster messages ("(raylet) ...") on stdout: only the JSON goes there.
        with contextlib.redirect_stdout(sys.stderr):
            bare, bare_start, full, full_start = _run_both(config, prompts, args, bar)
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    points = [
        {"clients": c, "bare": bare[c], "full": full[c], **compare(bare[c], full[c])}
        for c in args.clients
    ]
    report = {
        "config": {
            "profile": config.profile, "speedup": config.speedup, "topology": config.topology,
            "max_tokens": args.max_tokens, "seconds": args.seconds, "warmup_s": args.warmup,
            "clients": list(args.clients), "prompts": len(prompts),
            "stream_chunk_s": config.stream_chunk_s,
            "prompt_tokens_mean": round(float(np.mean([len(p) for p in prompts])), 1),
            "cpus": os.cpu_count(),
        },
        "startup_s": {"bare": round(bare_start, 2), "full": round(full_start, 2)},
        "points": points,
    }  # fmt: skip
    return emit("ingress", judge(report), report, args.quiet)


def _run_both(
    config: Any, prompts: Sequence[list[int]], args: argparse.Namespace, bar: Any
) -> tuple[dict[int, Any], float, dict[int, Any], float]:
    """One Ray session for both systems: (a), Serve shut down, then (b); Ray shut down after."""
    import ray

    from cluster.ray.runtime import init_ray
    from cluster.service import SPARE_TP_GROUPS
    from cluster.sim.cluster import Topology
    from cluster.sim.profile import load_profile

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Serve replicas import this module by name when it is not __main__.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    tp = load_profile(config.profile).tp
    gpus = Topology.parse(config.topology).gpus(tp) + SPARE_TP_GROUPS * tp
    started = init_ray(accelerators=gpus, accelerator=config.accelerator_resource)
    try:
        bare, bare_start = run_bare(config, prompts, args, bar)
        full, full_start = run_full(config, prompts, args, bar)
    finally:
        if started.owned:
            ray.shutdown()
            if started.tmpdir:
                shutil.rmtree(started.tmpdir, ignore_errors=True)
    return bare, bare_start, full, full_start


if __name__ == "__main__":
    raise SystemExit(main())
