"""Our ingress over Dynamo against Dynamo's own frontend, on the same Dynamo mocker pools (1P/2D).

What is measured, and why: the Dynamo backend puts the project's serving path (Ray Serve ingress,
auction, controller, our router in shadow) in front of Dynamo's workers and KV router. This asks
what that costs against Dynamo serving alone, on the same engines and the same load, in one run
of this process (first (a), then (b)), so that the ratio compares like with like on a noisy host:

(a) ``frontend``: ``dynamo.frontend --router-mode kv`` (:class:`cluster.dynamo.DynamoFrontend`)
    over one prefill and two decode ``dynamo.mocker`` processes started here
    (:class:`cluster.dynamo.DynamoProcess`), an embedded NATS server, a fresh discovery folder;
(b) ``ingress``: :class:`cluster.dynamo.service.DynamoService` (``backend: dynamo``, 1P/2D, the
    same mocker settings), which starts its own NATS, Ray, mocker workers and Serve ingress. Its
    controller gets thresholds far above what the load reaches (``CONTROLLER``), so tau stays 0
    and our router and Dynamo's decide on the same cost.

The load, identical on both: chat messages from ``SYSTEM_PROMPTS`` shared system prompts of about
300 tokens (so prefixes are reused) and a distinct user turn, ``max_tokens`` output tokens,
streamed with the official ``openai.AsyncOpenAI`` client; closed loop at each concurrency level
for ``--seconds`` (the first ``--warmup`` not counted). Per level and system: requests/s answered
within the counted window, TTFT P50/P99 (time to the first content chunk), errors; the ratios
ingress/frontend. Of (b) also: how often our router picked the worker Dynamo picked at tau = 0
(per role: "same", "tie" = another worker at our lowest cost, "different"), and the router actor
calls the Dynamo path adds per request, timed from the driver (``policy`` + ``shadow_route``;
``finish_prefill`` + ``complete`` beside them), plus the TTFT P50 difference at 1 client.

Target: ingress requests/s >= 0.8x frontend at every level (``met``; exit status 1 otherwise).

    .venv/bin/python bench/dynamo.py [--reduced] [--seconds 20] [--progress] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

# Before anything imports Ray: a private loopback session, no token auth, no usage report.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np

from bench.common import add_output_flags, at_least, emit, verdict

MODEL = "disagg-tiny"
TOPOLOGY = "1P/2D"
MOCKER: dict[str, Any] = {"speedup_ratio": 1.0, "num_gpu_blocks": 256}
# Thresholds (wall s of TTFT P99) far above this load: the regime stays "below", tau = 0.
CONTROLLER: dict[str, Any] = {"theta1_s": 30.0, "theta2_s": 60.0, "resplit": {"enabled": False}}
SYSTEM_PROMPTS, SYSTEM_WORDS, QUESTION_WORDS = 8, 280, 24  # ~300-token system prompts
LEVELS, REDUCED_LEVELS = (1, 8, 32), (8,)
PROMPTS_PER_LEVEL = 4000  # each level its own distinct user turns, the same on both systems
THROUGHPUT_RATIO_MIN = 0.8
DRAIN_S = 30.0
REQUEST_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 180.0
Levels = dict[int, dict[str, Any]]  # concurrency level -> its summary


# -- the load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    started: float  # seconds since the level began
    ended: float
    error: str | None  # None: the stream ended normally
    ttft_s: float | None  # to the first chunk with content
    chunks: int


def make_prompts(total: int, seed: int) -> list[list[dict[str, str]]]:
    from disaggctl.load_client import PromptSource

    source = PromptSource(seed, templates=SYSTEM_PROMPTS, template_words=SYSTEM_WORDS,
                          question_words=QUESTION_WORDS)  # fmt: skip
    return [source.messages() for _ in range(total)]


def make_client(base_url: str, clients: int) -> Any:
    import httpx2  # what openai's client is built on
    import openai

    limits = httpx2.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    http = openai.DefaultAsyncHttpxClient(limits=limits, trust_env=False)
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                              timeout=REQUEST_TIMEOUT_S, http_client=http)  # fmt: skip


async def one_request(client: Any, messages: Any, max_tokens: int, t_point: float) -> Sample:
    import httpx2
    import openai

    t0 = time.perf_counter()
    ttft: float | None = None
    chunks = 0
    error: str | None = None
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                chunks += 1
    except (openai.OpenAIError, httpx2.HTTPError) as exc:
        error = type(exc).__name__
    t1 = time.perf_counter()
    return Sample(t0 - t_point, t1 - t_point, error, ttft, chunks)


async def closed_loop(base_url: str, prompts: Sequence[Any], clients: int, seconds: float,
                      max_tokens: int) -> list[Sample]:  # fmt: skip
    """``clients`` clients, each sending its next request when its last one ended, for
    ``seconds``; in-flight requests then get ``DRAIN_S`` to finish."""
    order = itertools.count()
    samples: list[Sample] = []
    client = make_client(base_url, clients)
    async with client:
        t_point = time.perf_counter()

        async def loop() -> None:
            while time.perf_counter() - t_point < seconds:
                messages = prompts[next(order) % len(prompts)]
                samples.append(await one_request(client, messages, max_tokens, t_point))

        tasks = [asyncio.create_task(loop()) for _ in range(clients)]
        _, pending = await asyncio.wait(tasks, timeout=seconds + DRAIN_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return samples


def _ms(values: Sequence[float], q: float) -> float | None:
    return round(1e3 * float(np.percentile(values, q)), 2) if values else None


def summarize(samples: Sequence[Sample], warmup: float, seconds: float) -> dict[str, Any]:
    """TTFT of the requests started in [warmup, seconds); requests/s: those answered in it."""
    counted = [s for s in samples if warmup <= s.started < seconds]
    errors: dict[str, int] = {}
    for s in counted:
        if s.error is not None:
            errors[s.error] = errors.get(s.error, 0) + 1
    ttft = [s.ttft_s for s in counted if s.error is None and s.ttft_s is not None]
    answered = sum(1 for s in samples if s.error is None and warmup <= s.ended < seconds)
    return {
        "requests": sum(1 for s in counted if s.error is None),
        "errors": errors,
        "no_content": sum(1 for s in counted if s.error is None and s.ttft_s is None),
        "rps": round(answered / (seconds - warmup), 3),
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
    }


def wait_answering(base_url: str, messages: Any, max_tokens: int) -> None:
    """Until one streamed request is answered with content, then a few more (warm-up)."""
    deadline = time.monotonic() + READY_TIMEOUT_S

    async def probe() -> Sample:
        async with make_client(base_url, 1) as client:
            return await one_request(client, messages, max_tokens, time.perf_counter())

    while (last := asyncio.run(probe())).error is not None or last.ttft_s is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base_url} did not answer within {READY_TIMEOUT_S:g} s: {last}")
        time.sleep(0.5)
    for _ in range(4):
        asyncio.run(probe())


def run_levels(base_url: str, prompts: Sequence[Any], args: argparse.Namespace,
               bar: Any) -> dict[int, dict[str, Any]]:  # fmt: skip
    wait_answering(base_url, prompts[-1], args.max_tokens)
    out = {}
    for k, clients in enumerate(args.levels):
        level_prompts = prompts[k * PROMPTS_PER_LEVEL : (k + 1) * PROMPTS_PER_LEVEL]
        samples = asyncio.run(
            closed_loop(base_url, level_prompts, clients, args.seconds, args.max_tokens)
        )
        out[clients] = summarize(samples, args.warmup, args.seconds)
        bar.update(1)
        time.sleep(1.0)  # the last requests' bookkeeping settles
    return out


# -- (a) Dynamo's own frontend -----------------------------------------------------------------


async def start_workers(settings: Any, model_path: str, nats_url: str, discovery: str,
                        log_dir: Path, started: list[Any]) -> None:  # fmt: skip
    """One prefill and two decode mockers, ready; each process started is appended to
    ``started`` at once (the caller stops them). A taken system port is retried."""
    from cluster.dynamo import DynamoProcess, DynamoStartError, dynamo_env, worker_command
    from cluster.dynamo.settings import free_system_port

    async def one(role: str, i: int) -> None:
        argv = worker_command(settings, role, model_path)
        for attempt in range(3):
            port = free_system_port()
            env = dynamo_env(settings, nats_url=nats_url, discovery_dir=discovery,
                             system_port=port)  # fmt: skip
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


def run_frontend(settings: Any, model_path: str, tmp: Path, prompts: Sequence[Any],
                 args: argparse.Namespace, bar: Any) -> tuple[dict[int, Any], float]:  # fmt: skip
    from cluster.dynamo import DynamoFrontend
    from cluster.nats_server import NatsServer

    discovery = tempfile.mkdtemp(prefix="discovery-", dir=tmp)
    started: list[Any] = []
    t0 = time.perf_counter()
    with NatsServer() as nats:
        frontend = DynamoFrontend(settings, nats_url=nats.url, discovery_dir=discovery,
                                  log_path=tmp / "logs" / "frontend.log")  # fmt: skip
        try:
            asyncio.run(start_workers(settings, model_path, nats.url, discovery,
                                      tmp / "logs", started))  # fmt: skip
            frontend.start()
            frontend.wait_ready_sync(READY_TIMEOUT_S)
            startup = time.perf_counter() - t0
            return run_levels(frontend.url, prompts, args, bar), startup
        finally:
            frontend.stop()
            for process in started:
                process.stop()


# -- (b) our ingress over Dynamo ---------------------------------------------------------------


def service_config(tmp: Path) -> Any:
    from cluster.serve.config import ServeConfig

    return ServeConfig.model_validate({
        "backend": "dynamo", "topology": TOPOLOGY, "model_name": MODEL,
        "ledger_path": str(tmp / "ledger.sqlite"), "dynamo": dict(MOCKER),
        "controller": CONTROLLER,
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


def router_overhead(router: Any, instances: dict[str, int], tokens: Sequence[list[int]],
                    calls: int) -> dict[str, Any]:  # fmt: skip
    """Sequential calls from the driver, as the Dynamo path makes them per request: ``policy``,
    ``shadow_route`` (real instance ids, a new request id), ``finish_prefill``, ``complete``."""
    import ray

    prefill = [i for k, i in sorted(instances.items()) if k.startswith("prefill/")]
    decode = [i for k, i in sorted(instances.items()) if k.startswith("decode/")]
    names = ("policy", "shadow_route", "finish_prefill", "complete")
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in range(calls + 5):  # the first 5 warm the path up, not counted
        rid = f"bench-overhead-{uuid.uuid4().hex}"
        steps = (
            (router.policy, ()),
            (router.shadow_route, (rid, tokens[n % len(tokens)], "bench-overhead",
                                   prefill[n % len(prefill)], decode[n % len(decode)])),
            (router.finish_prefill, (rid,)),
            (router.complete, (rid,)),
        )  # fmt: skip
        for name, (method, call_args) in zip(names, steps, strict=True):
            t0 = time.perf_counter()
            ray.get(method.remote(*call_args), timeout=30)
            if n >= 5:
                times[name].append(time.perf_counter() - t0)
    means = {f"{name}_ms": round(1e3 * float(np.mean(v)), 3) for name, v in times.items()}
    per_request = [a + b for a, b in zip(times["policy"], times["shadow_route"], strict=True)]
    return {
        "calls": calls, **means,
        "per_request_ms": round(1e3 * float(np.mean(per_request)), 3),
        "per_request_p99_ms": round(1e3 * float(np.percentile(per_request, 99)), 3),
        "all_router_calls_ms": round(sum(means.values()), 3),
    }  # fmt: skip


def run_ingress(tmp: Path, prompts: Sequence[Any], tokens: Sequence[list[int]],
                args: argparse.Namespace, bar: Any) -> tuple[Levels, float, dict]:  # fmt: skip
    import ray

    from cluster.dynamo.service import DynamoService
    from cluster.nats_server import free_port

    svc = DynamoService(service_config(tmp))
    t0 = time.perf_counter()
    try:
        svc.start(host="127.0.0.1", port=free_port())
        startup = time.perf_counter() - t0
        assert svc.url is not None
        router = svc.handles.router
        before = ray.get(router.stats.remote(), timeout=30)["policy"]
        results = run_levels(svc.url + "/v1", prompts, args, bar)
        stats = ray.get(router.stats.remote(), timeout=30)
        extra = {
            "policy_before": before, "policy_after": stats["policy"],
            "agreement": agreement(stats["dynamo"]["agreement"]),
            "overhead": router_overhead(router, stats["dynamo"]["instances"], tokens,
                                        args.overhead_calls),
        }  # fmt: skip
        bar.update(1)
        return results, startup, extra
    finally:
        svc.stop()


# -- the verdict and main ----------------------------------------------------------------------


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else round(num / den, 4)


def compare(frontend: dict[str, Any], ingress: dict[str, Any]) -> dict[str, Any]:
    return {
        "rps": _ratio(ingress["rps"], frontend["rps"]),
        "ttft_p50": _ratio(ingress["ttft_p50_ms"], frontend["ttft_p50_ms"]),
        "ttft_p99": _ratio(ingress["ttft_p99_ms"], frontend["ttft_p99_ms"]),
    }


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """Per level: ingress requests/s over frontend's >= 0.8 (a level without a ratio misses)."""
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
    parser.add_argument("--overhead-calls", type=int, default=None,
                        help="timed router call rounds (default 200; --reduced 20)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    add_output_flags(parser)
    args = parser.parse_args(argv)
    reduced = args.reduced
    args.levels = REDUCED_LEVELS if reduced else LEVELS
    args.seconds = args.seconds if args.seconds is not None else (6.0 if reduced else 20.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if reduced else 3.0)
    if args.overhead_calls is None:
        args.overhead_calls = 20 if reduced else 200
    if not 0 <= args.warmup < args.seconds <= 600:
        parser.error("need 0 <= --warmup < --seconds <= 600")
    if not 1 <= args.max_tokens <= 4096 or not 1 <= args.overhead_calls <= 100_000:
        parser.error("--max-tokens must be in [1, 4096], --overhead-calls in [1, 100000]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cluster.dynamo import DynamoSettings, require_dynamo
    from cluster.model_dir import ChatTokenizer, default_model_dir
    from cluster.progress import progress_bar

    require_dynamo()
    model_path = str(default_model_dir())
    settings = DynamoSettings.model_validate(MOCKER)
    prompts = make_prompts(PROMPTS_PER_LEVEL * len(args.levels), args.seed)
    tokenizer = ChatTokenizer.from_dir(Path(model_path))
    tokens = [tokenizer.encode_chat(m) for m in prompts[:64]]
    tmp = Path(tempfile.mkdtemp(prefix="bench-dynamo-"))
    bar = progress_bar(total=2 * len(args.levels) + 1, progress=args.progress, quiet=args.quiet,
                       desc="dynamo bench")  # fmt: skip
    try:
        # Ray prints some cluster messages on stdout: only the JSON goes there.
        with contextlib.redirect_stdout(sys.stderr):
            frontend, frontend_start = run_frontend(settings, model_path, tmp, prompts, args, bar)
            ingress, ingress_start, extra = run_ingress(tmp, prompts, tokens, args, bar)
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    points = [
        {"clients": c, "frontend": frontend[c], "ingress": ingress[c],
         "ingress_over_frontend": compare(frontend[c], ingress[c])}
        for c in args.levels
    ]  # fmt: skip
    report: dict[str, Any] = {
        "reduced": args.reduced,
        "config": {
            "topology": TOPOLOGY, "model": MODEL, "mocker": MOCKER, "controller": CONTROLLER,
            "levels": list(args.levels), "seconds": args.seconds, "warmup_s": args.warmup,
            "max_tokens": args.max_tokens, "system_prompts": SYSTEM_PROMPTS,
            "prompt_tokens_mean": round(float(np.mean([len(t) for t in tokens])), 1),
            "client": "openai.AsyncOpenAI, chat.completions, stream=True", "cpus": os.cpu_count(),
        },
        "startup_s": {"frontend": round(frontend_start, 2), "ingress": round(ingress_start, 2)},
        "points": points,
        "agreement_tau0": extra["agreement"],
        "policy": {"before": extra["policy_before"], "after": extra["policy_after"]},
        "router_overhead": extra["overhead"],
    }  # fmt: skip
    if 1 in args.levels:
        f1, i1 = frontend[1]["ttft_p50_ms"], ingress[1]["ttft_p50_ms"]
        report["ttft_p50_added_ms_at_1"] = None if f1 is None or i1 is None else round(i1 - f1, 2)
    judged = judge(report)
    report["notes"] = notes(judged["met"], extra)
    return emit("dynamo", judged, report, args.quiet)


def notes(met: bool, extra: dict[str, Any]) -> list[str]:
    tau = (extra["policy_before"]["tau"], extra["policy_after"]["tau"])
    out = [
        "(a) and (b) ran one after the other in this process on the same host; the load client "
        "(openai, one asyncio loop) shares the CPUs with the servers in both.",
        f"controller thresholds {CONTROLLER['theta1_s']}/{CONTROLLER['theta2_s']} s keep tau = 0 "
        f"for the agreement count (router tau before/after the load: {tau[0]}/{tau[1]}); "
        "agreement counts include the warm-up requests.",
        "router_overhead: sequential Ray calls from the driver (policy + shadow_route per request; "
        "finish_prefill and complete beside them); the auction's calls are not in it.",
    ]
    if not met:
        out.append(
            "target missed: (b) adds the Ray Serve HTTP proxy and ingress replica, the auction "
            "and router actor calls and NATS events to every request, on the same few cores as "
            "the mockers, Dynamo's routers and the load client."
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
