"""Fixtures shared by the cluster tests: one embedded NATS server per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.nats_server import NatsServer


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    with NatsServer() as server:
        yield server.url
