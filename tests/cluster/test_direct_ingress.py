"""Direct ingress's settings (cluster/serve/direct_ingress.py, ``ServeConfig.direct_port``): the
port range the Serve controller allocates from, the URLs the service reports, and the refusals
that name the field. The live path runs in tests/integration/test_service_direct_ingress.py."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from pydantic import ValidationError

from cluster.config import ServeConfig
from cluster.serve.direct_ingress import (
    REPLICA_ENV,
    controller_env,
    direct_urls,
    wait_answering,
)


def test_the_controller_allocates_one_port_per_replica_from_the_first() -> None:
    env = controller_env(8100, 3)
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    # Serve's upper bound is exclusive: three replicas, ports 8100-8102.
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] == "8100"
    assert env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] == "8103"
    assert REPLICA_ENV.items() <= env.items()  # the replicas read the same flags
    assert direct_urls("127.0.0.1", 8100, 3) == [
        "http://127.0.0.1:8100", "http://127.0.0.1:8101", "http://127.0.0.1:8102"
    ]  # fmt: skip
    for first, replicas in ((80, 1), (65_535, 2), (8100, 0)):
        with pytest.raises(ValueError, match="direct ports"):
            controller_env(first, replicas)


def test_the_config_refuses_ports_that_do_not_fit_naming_direct_port() -> None:
    assert ServeConfig().direct_port is None  # the proxy only, by default
    assert ServeConfig(direct_port=8100, ingress_replicas=4).direct_port == 8100
    bad = [
        {"direct_port": 80},
        {"direct_port": 65_535, "ingress_replicas": 2},
        {"direct_port": 9463, "ingress_replicas": 2, "metrics_port": 9464},
        {"direct_port": "8100"},  # strict: a port is a number
    ]
    for fields in bad:
        with pytest.raises(ValidationError, match="direct_port"):
            ServeConfig.model_validate(fields, strict=True)


class _Models(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/v1/models" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _serving(handler: type[BaseHTTPRequestHandler]) -> tuple[HTTPServer, threading.Thread]:
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.mark.parametrize("status", [200, 401])
def test_a_replica_that_answers_models_is_up_even_asking_for_a_key(status: int) -> None:
    server, thread = _serving(type("Handler", (_Models,), {"status": status}))
    try:
        wait_answering([f"http://127.0.0.1:{server.server_port}"], timeout_s=5.0)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Unrouted(_Models):
    """Serve's proxies sharing one port: every ``every``-th connection lands on one that has no
    route table yet (404); ``first`` 404s while none has one."""

    every = 0
    first = 0
    seen: list[int]

    def do_GET(self) -> None:
        self.seen.append(1)
        n = len(self.seen)
        unrouted = n <= self.first or (self.every > 0 and n % self.every == 0)
        self.send_response(404 if unrouted else 200)
        self.end_headers()


def test_a_streak_waits_for_answers_in_a_row_and_a_404_starts_it_again() -> None:
    seen: list[int] = []
    handler = type("Late", (_Unrouted,), {"first": 2, "seen": seen})
    server, thread = _serving(handler)
    try:
        wait_answering([f"http://127.0.0.1:{server.server_port}"], timeout_s=10.0, streak=4)
        assert len(seen) == 2 + 4  # two 404s, then the streak
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

    seen = []
    handler = type("OneOfThree", (_Unrouted,), {"every": 3, "seen": seen})
    server, thread = _serving(handler)
    try:
        with pytest.raises(RuntimeError, match="no answer"):
            wait_answering([f"http://127.0.0.1:{server.server_port}"], timeout_s=0.5, streak=3)
        assert len(seen) >= 3  # it asked again and again; never three answers in a row
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_silent_port_times_out_naming_it_and_the_likely_causes() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Models)
    port = server.server_port
    server.server_close()  # nobody listens there now
    with pytest.raises(RuntimeError, match=rf"127.0.0.1:{port}.*Serve already running"):
        wait_answering([f"http://127.0.0.1:{port}"], timeout_s=0.3)


def test_free_ports_finds_a_run_of_consecutive_free_ports() -> None:
    import socket

    from cluster.nats_server import free_ports

    first = free_ports(3)
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for s, port in zip((a, b, c), range(first, first + 3), strict=True):
            s.bind(("127.0.0.1", port))  # all three were free
