"""``disaggctl serve`` and ``disaggctl status``: the live service (docs/design.md "Serve runtime").

``serve`` starts (or joins) Ray, deploys every actor and the OpenAI-compatible ingress, prints the
URLs, and runs until Ctrl-C or SIGTERM, then takes everything down. With no users file it makes
one demo user and prints its key (the key itself is never stored; only its SHA-256 is).

``status`` reads the service's ``/metrics`` on its metrics port (``metrics_port``, 9464 by
default; the names of docs/design.md §5) and prints regime,
τ, ω, poa_hat and its factors, smoothed TTFT P99, queue depth and revenue; ``--watch`` repeats.
"""

from __future__ import annotations

import argparse
import math
import secrets
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, Field

from cluster.backends.registry import backend_names
from cluster.models import StrictModel
from disaggctl.options import from_args

if TYPE_CHECKING:  # imported where used: `disaggctl --help` stays quick
    from cluster.config import ServeConfig

__all__ = ["add_parser", "read_status"]

DEMO_USER = "demo"
DEMO_BUDGET = 100.0


def _optional_file(path: str | None) -> str | None:
    if path is not None and not Path(path).is_file():
        raise ValueError("must name an existing file")
    return path


class ServeOptions(StrictModel):
    config: Annotated[str | None, AfterValidator(_optional_file)] = None
    users: Annotated[str | None, AfterValidator(_optional_file)] = None
    host: str = Field(default="127.0.0.1", min_length=1, max_length=253)
    port: int = Field(default=8000, ge=1, le=65535)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    address: str | None = Field(default=None, max_length=512)
    quiet: bool = False
    backend: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    # Per-identity limits (cluster/serve/limits.py); None: the config's.
    user_rate: float | None = None
    user_concurrency: int | None = None
    anonymous_rate: float | None = None
    anonymous_concurrency: int | None = None


LIMIT_FLAGS = ("user_rate", "user_concurrency", "anonymous_rate", "anonymous_concurrency")
METRICS_URL = "http://127.0.0.1:9464/metrics"  # ServeConfig's metrics_host and metrics_port


class StatusOptions(StrictModel):
    url: str = Field(default=METRICS_URL, pattern=r"^https?://[^\s]{1,500}$")
    watch: bool = False
    interval: float = Field(default=2.0, ge=0.2, le=3600.0)
    count: int | None = Field(default=None, ge=1, le=1_000_000)


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter],
) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the live service (Ray actors + OpenAI-compatible HTTP)",
        description=__doc__,
        formatter_class=formatter,
    )
    serve.add_argument("--config", help="service configuration YAML (default: embedded default)")
    serve.add_argument(
        "--users",
        help="users YAML: users: [{name, key_sha256, budget}] "
        "(default: one demo user, its key printed)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address the HTTP ingress binds")
    serve.add_argument("--port", type=int, default=8000, help="port of the HTTP ingress")
    serve.add_argument(
        "--metrics-port", type=int,
        help="port of /metrics, apart from the API (default: the config's metrics_port, 9464; "
        "0: any free port)",
    )  # fmt: skip
    serve.add_argument(
        "--address", help="Ray cluster to join, e.g. auto (default: start a local Ray)"
    )
    serve.add_argument("--quiet", action="store_true", help="print only the URLs and the key")
    serve.add_argument(
        "--backend",
        choices=backend_names(),
        help="workers: simulated engines, or Dynamo processes (mocker on CPU, vllm on GPUs; "
        "needs `make dynamo`) routed by Dynamo's KvRouter (default: the config's, else sim)",
    )
    limits = serve.add_argument_group(
        "per-identity limits",
        "429 with Retry-After past them; 0: no limit (default: the "
        "config's limits section; service-wide, each ingress replica enforces its share)",
    )
    limits.add_argument("--user-rate", type=float, help="requests per second, each user")
    limits.add_argument("--user-concurrency", type=int, help="requests at once, each user")
    limits.add_argument(
        "--anonymous-rate", type=float, help="requests per second, all anonymous traffic together"
    )
    limits.add_argument(
        "--anonymous-concurrency", type=int, help="requests at once, all anonymous traffic together"
    )
    serve.set_defaults(func=_serve)

    status = sub.add_parser(
        "status",
        help="regime, tau, omega, PoA, TTFT P99, queue and revenue of a running service",
        formatter_class=formatter,
    )
    status.add_argument(
        "--url",
        default=METRICS_URL,
        help="the service's metrics URL (its metrics_port, not the API's)",
    )
    status.add_argument("--watch", action="store_true", help="repeat every --interval seconds")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between readings")
    status.add_argument("--count", type=int, help="with --watch: stop after this many readings")
    status.set_defaults(func=_status)


# ---- serve -------------------------------------------------------------------------------------


def _demo_users() -> tuple[Any, str]:
    from cluster.serve.users import Users

    key = "sk-disagg-" + secrets.token_urlsafe(24)
    return Users.from_keys({DEMO_USER: (key, DEMO_BUDGET)}), key


def with_limit_flags(config: ServeConfig, o: ServeOptions) -> ServeConfig:
    """``config`` with the ``--user-rate`` … flags given, validated as its ``limits`` section
    (an error names ``limits.<field>``)."""
    from cluster.config import ServeConfig
    from cluster.models import validate_model

    flags = {k: v for k in LIMIT_FLAGS if (v := getattr(o, k)) is not None}
    if not flags:
        return config
    limits = {**config.limits.model_dump(), **flags}
    return validate_model(ServeConfig, {**config.model_dump(), "limits": limits}, "flags")


def _serve(args: argparse.Namespace) -> int:
    from cluster.config import ServeConfig, load_config
    from cluster.models import validate_model
    from cluster.serve.users import Users
    from cluster.service import Service

    o = from_args(ServeOptions, args)
    config = load_config(o.config)  # a bad file fails here, before anything starts
    if o.backend is not None:
        config = validate_model(
            ServeConfig, {**config.model_dump(), "backend": o.backend}, "--backend"
        )
    if o.metrics_port is not None:
        config = config.model_copy(update={"metrics_port": o.metrics_port})
    config = with_limit_flags(config, o)
    if o.users is not None:
        users, demo_key = Users.load(o.users), None
    else:
        users, demo_key = _demo_users()
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    # Its engines: those config.backend names, which check their install before anything starts.
    service = Service(config, users=users)
    try:
        if not o.quiet:
            dynamo = config.backend == "dynamo"
            what = f"Dynamo {config.dynamo.engine}" if dynamo else config.profile
            print(f"starting {what} {config.topology} ...", file=sys.stderr)
        service.start(host=o.host, port=o.port, address=o.address)
        # Ray installs its own SIGTERM handler when it starts; ours must be the one that runs,
        # so that SIGTERM stops the service cleanly like Ctrl-C does.
        for s in previous:
            signal.signal(s, _on_signal)
        print(f"serving {config.model_name} at {service.url}/v1  (metrics: {service.metrics_url})")
        if service.tokenizer_repo is not None and not o.quiet:
            from cluster.hub_cache import default_hf_home

            print(
                f"its tokenizer for offline tools: HF_HOME={default_hf_home()} HF_HUB_OFFLINE=1, "
                f"--tokenizer {service.tokenizer_repo}"
            )
        if service.direct_urls:  # direct_port: each replica's own port, no proxy hop
            own = ", ".join(f"{u}/v1" for u in service.direct_urls)
            print(f"each ingress replica also at: {own}")
        if demo_key is not None:
            print(
                f"demo user {DEMO_USER!r}, budget {DEMO_BUDGET:g}: Authorization: Bearer {demo_key}"
            )
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
        if not o.quiet:
            print("stopping ...", file=sys.stderr)
    finally:
        service.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


# ---- status ------------------------------------------------------------------------------------

_GAUGES = {
    "regime": "disagg_regime",
    "tau": "disagg_router_temperature",
    "omega": "disagg_router_overlap_weight",
    "poa_hat": "disagg_poa_hat",
    "poa_routing": "disagg_poa_routing",
    "poa_capacity": "disagg_poa_capacity",
    "ttft_p99_smoothed_s": "disagg_ttft_p99_smoothed_seconds",
    "queue_depth": "disagg_auction_queue_depth",
    "revenue": "disagg_auction_revenue_total",
    "resplits": "disagg_resplits_total",
    "resplit_in_progress": "disagg_resplit_in_progress",
    "oldest_wait_s": "disagg_oldest_wait_seconds",
}
_REGIMES = {0: "below", 1: "transition", 2: "saturated"}


def parse_status(text: str) -> dict[str, Any]:
    """The status figures from a ``/metrics`` text (unlabelled samples; missing ones are None)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, float] = {}
    pools: dict[str, int] = {}  # disagg_pool_workers{role}: the re-split lever's pools
    requests = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                samples[sample.name] = sample.value
            elif sample.name == "disagg_requests_total":
                requests += sample.value
            elif sample.name == "disagg_pool_workers" and sample.labels.get("role"):
                pools[sample.labels["role"]] = int(sample.value)
    out: dict[str, Any] = {k: samples.get(v) for k, v in _GAUGES.items()}
    out["prefill_workers"], out["decode_workers"] = pools.get("prefill"), pools.get("decode")
    if out["regime"] is not None:
        out["regime"] = _REGIMES.get(int(out["regime"]), str(out["regime"]))
    out["requests"] = requests
    return out


def read_status(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The status at ``url``: the metrics server's ``/metrics`` (a bare host:port gets it)."""
    if urllib.parse.urlsplit(url).path in ("", "/"):
        url = f"{url.rstrip('/')}/metrics"
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return parse_status(resp.read().decode())


def format_status(s: Mapping[str, Any]) -> str:
    def num(key: str, fmt: str = ".3g") -> str:
        value = s.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return format(value, fmt)

    return (
        f"regime {s.get('regime') or '-'}  tau {num('tau')}  omega {num('omega')}  "
        f"poa_hat {num('poa_hat')} "
        f"(routing {num('poa_routing')} x capacity {num('poa_capacity')})  "
        f"ttft_p99 {num('ttft_p99_smoothed_s')} s  queue {num('queue_depth', '.0f')}  "
        f"revenue {num('revenue', '.2f')}  requests {num('requests', '.0f')}"
        f"  pools {num('prefill_workers', 'd')}P/{num('decode_workers', 'd')}D"
        + ("  (re-splitting)" if s.get("resplit_in_progress") else "")
    )


def _status(args: argparse.Namespace, sleep: Callable[[float], None] = time.sleep) -> int:
    o = from_args(StatusOptions, args)
    readings = 0
    while True:
        try:
            print(format_status(read_status(o.url)), flush=True)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ValueError(f"no service at {o.url} ({reason})") from None
        readings += 1
        if not o.watch or (o.count is not None and readings >= o.count):
            return 0
        sleep(o.interval)
