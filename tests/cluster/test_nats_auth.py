"""The bus's credentials and permissions as data (cluster.nats_auth); the real server's
enforcement is tests/integration/test_nats_permissions.py."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from cluster.events import KINDS
from cluster.nats_auth import (
    CA_FILE,
    CREDENTIALS_ENV,
    MAX_SECRET_BYTES,
    ROLE_PERMISSIONS,
    ROLES,
    authorization_block,
    connect_options,
    dynamo_auth_env,
    exported_env,
    generate_credentials,
    read_credentials,
)
from tests.tls_certs import write_ca_and_server_cert


def test_generated_credentials_are_private_and_distinct(tmp_path: Path) -> None:
    root = generate_credentials(tmp_path / "creds")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    passwords = set()
    for role in ROLES:
        for name in ("user", "password"):
            assert stat.S_IMODE((root / role / name).stat().st_mode) == 0o600
        cred = read_credentials(root, role)
        assert cred.user == role and len(cred.password) >= 40
        passwords.add(cred.password)
        assert cred.password not in repr(cred)
    assert len(passwords) == len(ROLES)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "missing"),
        ("", "one token"),
        ("two words", "one token"),
        ('a"quote', "one token"),
        ("x" * (MAX_SECRET_BYTES + 1), "more than"),
    ],
)
def test_a_bad_secret_file_is_refused_naming_its_path(
    tmp_path: Path, content: str | None, message: str
) -> None:
    generate_credentials(tmp_path)
    path = tmp_path / "ingress" / "password"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises((ValueError, FileNotFoundError), match=message) as err:
        read_credentials(tmp_path, "ingress")
    assert str(path) in str(err.value)


def test_an_unknown_role_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown NATS role 'wizard'"):
        read_credentials(generate_credentials(tmp_path), "wizard")


def test_roles_publish_disjoint_event_kinds_except_the_routers_routes() -> None:
    # Who may say each kind: one role (the router actor repeats the ingress's routes).
    sayers: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for role, perms in ROLE_PERMISSIONS.items():
        for subject in perms.publish:
            if subject.startswith("disagg.*."):
                sayers[subject.rsplit(".", 1)[-1]].add(role)
    assert sayers == {
        "route": {"ingress", "router"}, "complete": {"ingress"}, "regime": {"controller"},
        "auction": {"auction"}, "first_token": {"ingress"}, "pools": {"controller"},
        "load": {"ingress"}, "engine_load": {"worker"},
    }  # fmt: skip


def test_the_authorization_block_names_every_role_once(tmp_path: Path) -> None:
    block = authorization_block(generate_credentials(tmp_path))
    for role in ROLES:
        assert block.count(f'user: "{role}"') == 1
        assert read_credentials(tmp_path, role).password in block
    assert block.count("permissions") == len(ROLES)


def test_without_a_directory_nothing_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CREDENTIALS_ENV, raising=False)
    assert connect_options("ingress") == {}
    assert exported_env() == {}
    assert dynamo_auth_env("nats://h:4222") == {"NATS_SERVER": "nats://h:4222"}


def test_a_process_finds_its_roles_credentials_and_passes_on_only_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = generate_credentials(tmp_path / "creds")
    monkeypatch.setenv(CREDENTIALS_ENV, str(root))
    ingress = read_credentials(root, "ingress")
    assert connect_options("ingress") == {"user": "ingress", "password": ingress.password}
    assert connect_options(None) == {}
    assert exported_env() == {CREDENTIALS_ENV: str(root)}
    env = dynamo_auth_env("nats://h:4222")
    assert env["NATS_AUTH_USERNAME"] == "dynamo" and env["NATS_SERVER"] == "nats://h:4222"
    assert env["NATS_AUTH_PASSWORD"] == read_credentials(root, "dynamo").password


def test_a_ca_in_the_directory_turns_tls_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ssl

    root = generate_credentials(tmp_path / "creds")
    monkeypatch.setenv(CREDENTIALS_ENV, str(root))
    ca, _, _ = write_ca_and_server_cert(tmp_path / "tls")
    (root / CA_FILE).write_bytes(ca.read_bytes())
    options = connect_options("ingress")
    assert isinstance(options["tls"], ssl.SSLContext)
    assert options["tls"].verify_mode == ssl.CERT_REQUIRED
    env = dynamo_auth_env("nats://h:4222")
    assert env["NATS_SERVER"] == "tls://h:4222"
    assert env["NATS_TLS_CA_CERT_PATH"] == str(root / CA_FILE)
