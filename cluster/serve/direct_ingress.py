"""Direct ingress: each ingress replica serves HTTP itself, beside Serve's proxy.

Through Serve's HTTP proxy a request crosses one more process (proxy → replica, a Ray streaming
call) before our code sees it. Ray Serve 2.60's direct ingress lets the ingress replica run its
own HTTP server on a port the Serve controller allocates from
``[RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT, …_MAX_HTTP_PORT)``; the proxy still runs on the head
node and keeps serving the API port. Measured with ``python -m bench.dynamo`` (docs/design.md
"Serve runtime"): at 32 clients our ingress carried 0.75× the requests/s of Dynamo's frontend
through the proxy and 0.95× on the replica's own port, in the same hour.

The service asks for it with ``ServeConfig.direct_port`` = P: the controller allocates from
``[P, P + replicas)``, so replica ports are P, P + 1, … on one node. The flag must reach two
processes: the Serve controller (``serve.start(controller_options=…)``, applied only when this
service starts Serve) and each replica (its ``runtime_env``). A client that wants the shorter
path talks to a replica's port; several replicas need the client, or a load balancer, to spread
requests over their ports (the proxy's port keeps spreading them as before).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from cluster.models import ConfigError

__all__ = [
    "REPLICA_ENV",
    "controller_env",
    "direct_urls",
    "serve_proxies",
    "start_serve",
    "wait_answering",
]

ENABLE = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
# Serve keeps a stopping direct-ingress replica serving for at least this long (default 30 s),
# so that a load balancer polling the replicas' ports can take it out first. The service runs
# none; a client on a replica's port sees the port close, as it sees the proxy's.
DRAINING = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}
REPLICA_ENV = {ENABLE: "1", **DRAINING}  # what a replica reads when it starts


def controller_env(first_port: int, replicas: int) -> dict[str, str]:
    """The Serve controller's environment: direct ingress on, replica ports from
    ``[first_port, first_port + replicas)`` (Serve's upper bound is exclusive)."""
    if replicas < 1 or not 1024 <= first_port <= 65_536 - replicas:
        raise ValueError(f"direct ports [{first_port}, {first_port + replicas}) out of range")
    return {
        **REPLICA_ENV,
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(first_port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(first_port + replicas),
    }


def start_serve(host: str, port: int, direct_port: int | None, replicas: int) -> None:
    """Start Serve with its proxy on ``host:port`` and, given ``direct_port``, direct ingress on
    the replicas' ports (refused when they would include the proxy's)."""
    from ray import serve

    if direct_port is not None and direct_port <= port < direct_port + replicas:
        raise ConfigError(f"direct_port: the replicas' ports include the API port {port}")
    env = None if direct_port is None else controller_env(direct_port, replicas)
    serve.start(
        http_options={"host": host, "port": port},
        controller_options=None if env is None else {"runtime_env": {"env_vars": env}},
    )


def serve_proxies() -> int:
    """How many HTTP proxies Serve runs (one per node with Serve's default location)."""
    from ray import serve

    return max(1, len(serve.status().proxies))


def direct_urls(host: str, first_port: int, replicas: int) -> list[str]:
    """Each replica's own base URL (one node: Serve hands the lowest free port out first)."""
    return [f"http://{host}:{first_port + i}" for i in range(replicas)]


def wait_answering(urls: list[str], timeout_s: float, streak: int = 1) -> None:
    """Block until every URL answers ``GET /v1/models`` with 200 or 401 (a replica that asks
    for a key answers too) ``streak`` times in a row, each on a new connection; a timeout names
    the silent ones and the likely cause."""
    deadline = time.monotonic() + timeout_s
    answered = dict.fromkeys(urls, 0)
    while True:
        for u in urls:
            answered[u] = answered[u] + 1 if _answers(u) else 0
        silent = [u for u, n in answered.items() if n < streak]
        if not silent:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no answer on {', '.join(silent)} after {timeout_s:.0f} s (the port taken by "
                "another process, or, for a replica's own port, Serve already running in this "
                "Ray session without direct ingress: its controller options apply only when "
                "Serve starts)"
            )
        if any(answered[u] == 0 for u in silent):
            time.sleep(0.2)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2.0) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (urllib.error.URLError, OSError):
        return False
