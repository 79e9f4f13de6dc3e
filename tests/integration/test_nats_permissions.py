"""Per-role permissions on a real nats-server (docs/design.md "Security model"; [15]).

Each role connects with its own credentials; the server lets it publish only what the role
produces and withholds from its one ``disagg.<ns>.*`` subscription every kind it does not read.
The expectations are written out here, from the design's list, not derived from the table."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from cluster.events import KINDS
from cluster.nats_auth import (
    CA_FILE,
    CREDENTIALS_ENV,
    ROLES,
    connect_options,
    generate_credentials,
)
from cluster.nats_server import NatsServer

pytestmark = pytest.mark.integration

NS = "perm"
KV = f"namespace.{NS}.component.backend.endpoint.generate.kv-events"

PUBLISHES = {
    "worker": {"engine_load", "kv"},
    "ingress": {"route", "first_token", "complete", "load"},
    "controller": {"regime", "pools"},
    "poa": set(),
    "auction": {"auction"},
    "router": {"route"},
    "observer": set(),
    "dynamo": {"kv"},
}
READS = {
    "worker": None,  # no subscription at all
    "ingress": {"load", "engine_load", "regime", "pools", "kv"},
    "controller": {"first_token", "route", "complete", "engine_load"},
    "poa": set(KINDS),
    "auction": None,
    "router": {"load", "kv"},
    "observer": {*KINDS, "kv"},
    "dynamo": {"kv"},
}


@pytest.fixture(scope="module")
def server() -> Iterator[NatsServer]:
    with NatsServer() as s:
        yield s


def _subject(kind: str) -> str:
    return KV if kind == "kv" else f"disagg.{NS}.{kind}"


async def _connect(url: str, role: str, errors: list[str]) -> Client:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    return await nats.connect(url, error_cb=on_error, allow_reconnect=False,
                              **connect_options(role))  # fmt: skip


def test_every_role_is_known_to_the_expectations() -> None:
    assert set(ROLES) == set(PUBLISHES) == set(READS)


def test_a_client_without_credentials_or_with_a_wrong_password_is_refused(
    server: NatsServer,
) -> None:
    async def main() -> list[str]:
        refusals = []
        for options in ({}, {"user": "ingress", "password": "not-the-password"}):
            with pytest.raises(nats.errors.Error) as refused:
                await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                                   **options)  # fmt: skip
            refusals.append(str(refused.value).lower())
        return refusals

    assert all("authorization violation" in r for r in asyncio.run(main()))


def test_each_role_publishes_only_what_it_produces(server: NatsServer) -> None:
    async def main() -> dict[str, set[str]]:
        errors: list[str] = []
        observer = await _connect(server.url, "observer", errors)
        seen: dict[str, set[str]] = {}
        current = [""]

        async def on_msg(msg: Msg) -> None:
            kind = "kv" if msg.subject == KV else msg.subject.rsplit(".", 1)[-1]
            seen.setdefault(current[0], set()).add(kind)

        await observer.subscribe(f"disagg.{NS}.*", cb=on_msg)
        await observer.subscribe(KV, cb=on_msg)
        await observer.flush()
        for role in ROLES:
            current[0] = role
            client = await _connect(server.url, role, errors)
            for kind in (*KINDS, "kv"):
                await client.publish(_subject(kind), b"{}")
            await client.flush()
            await observer.flush()
            await asyncio.sleep(0.05)  # the observer's callbacks run
            await client.close()
        await observer.close()
        assert not any("observer" in e for e in errors)
        return seen

    seen = asyncio.run(main())
    for role in ROLES:
        assert seen.get(role, set()) == PUBLISHES[role], role


def test_each_role_receives_only_the_kinds_it_reads(server: NatsServer) -> None:
    async def main() -> dict[str, set[str] | None]:
        publishers = {}
        errors: list[str] = []
        for role in ("ingress", "controller", "worker", "auction"):
            publishers[role] = await _connect(server.url, role, errors)
        got: dict[str, set[str] | None] = {}
        clients = []
        for role in ROLES:
            role_errors: list[str] = []
            client = await _connect(server.url, role, role_errors)
            clients.append(client)
            got[role] = set()

            def on_msg(role: str = role):  # type: ignore[no-untyped-def]
                async def handle(msg: Msg) -> None:
                    kind = "kv" if msg.subject == KV else msg.subject.rsplit(".", 1)[-1]
                    got[role].add(kind)  # type: ignore[union-attr]

                return handle

            await client.subscribe(f"disagg.{NS}.*", cb=on_msg())
            await client.subscribe(KV, cb=on_msg())
            await client.flush()
            await asyncio.sleep(0.05)
            refused = sum("permissions violation for subscription" in e for e in role_errors)
            if refused == 2:  # neither subscription allowed
                got[role] = None
        owner = {k: r for r, ks in PUBLISHES.items() if r in publishers for k in ks}
        for kind in (*KINDS, "kv"):
            await publishers[owner[kind]].publish(_subject(kind), b"{}")
        for client in publishers.values():
            await client.flush()
        await asyncio.sleep(0.3)
        for client in [*clients, *publishers.values()]:
            await client.close()
        return got

    got = asyncio.run(main())
    assert got == READS


def test_the_server_config_is_private_and_no_secret_is_on_its_command_line(
    server: NatsServer,
) -> None:
    assert server.pid is not None
    assert os.stat(server.config_path).st_mode & 0o077 == 0
    with open(f"/proc/{server.pid}/cmdline", "rb") as f:
        cmdline = f.read().decode()
    password = connect_options("ingress")["password"]
    assert password not in cmdline and password in server.config_path.read_text()
    assert server.url.startswith("nats://127.0.0.1:") and "@" not in server.url


def test_with_a_ca_in_the_credentials_the_bus_speaks_tls_and_plain_clients_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster.bus import EventBus
    from cluster.events import FirstTokenEvent
    from tests.tls_certs import write_ca_and_server_cert

    ca, cert, key = write_ca_and_server_cert(tmp_path / "tls")
    creds = generate_credentials(tmp_path / "creds")
    (creds / CA_FILE).write_bytes(ca.read_bytes())
    monkeypatch.setenv(CREDENTIALS_ENV, str(creds))
    route = FirstTokenEvent(request_id="r1", t=1.0, worker_id=3, ttft_s=0.2)

    async def main() -> tuple[list[object], list[dict[str, object]]]:
        with NatsServer(tls=(cert, key)) as server:
            # A client that does not trust the deployment's CA cannot even finish the handshake.
            with pytest.raises(ssl.SSLCertVerificationError):
                await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                                   **{k: v for k, v in connect_options("ingress").items()
                                      if k != "tls"})  # fmt: skip
            sub = EventBus(server.url, NS, role="observer")
            pub = EventBus(server.url, NS, role="ingress")
            received: list[object] = []
            for bus in (sub, pub):
                await bus.connect()
            await sub.subscribe(received.append, kinds=("first_token",))
            await sub.flush()
            await pub.publish(route)
            await pub.flush()
            # A bound on hanging, not a timing: a busy 2-core machine once took more than 2 s.
            for _ in range(1000):
                if received:
                    break
                await asyncio.sleep(0.02)
            # What each side saw, for the message if the event is missing.
            seen = [{"published": dict(b.published), "send_dropped": dict(b.send_dropped),
                     "received": dict(b.received), "dropped": dict(b.dropped),
                     "errors": b.errors, "disconnects": b.disconnects} for b in (sub, pub)]
            for bus in (sub, pub):
                await bus.close()
            return received, seen

    received, seen = asyncio.run(main())
    assert received == [route], seen


def test_no_role_reaches_jetstream_so_no_stream_can_read_or_forge_our_events(
    server: NatsServer,
) -> None:
    """[21] 6: as ``dynamo`` (which may publish any subject but ours) and as every other role,
    ``$JS.API.STREAM.CREATE`` over ``disagg.>`` is refused by the server, so no stream reads
    every event and no push consumer delivers into ``regime`` or ``pools``."""

    async def main() -> dict[str, list[str]]:
        refused: dict[str, list[str]] = {}
        for role in ROLES:
            errors: list[str] = []
            client = await _connect(server.url, role, errors)
            stream = b'{"name": "SNOOP", "subjects": ["disagg.>"]}'
            with pytest.raises(nats.errors.Error):  # no answer comes: the request never passed
                await client.request("$JS.API.STREAM.CREATE.SNOOP", stream, timeout=0.5)
            await client.flush()
            await asyncio.sleep(0.05)
            await client.close()
            refused[role] = errors
        return refused

    refused = asyncio.run(main())
    for role, errors in refused.items():
        assert any("permissions violation" in e for e in errors), (role, errors)
