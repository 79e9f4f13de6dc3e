"""Who may say what on the bus: one NATS user per role, its permissions, and where its secret lives.

docs/design.md "Security model". Every nats-server the project starts has one user per role
(:data:`ROLE_PERMISSIONS`); a process connects as the role it plays and can publish only the
subjects that role produces and receive only the kinds it reads. Without this, any process that
reaches the server can forge ``first_token`` events and flip the regime.

Receiving is enforced with deny rules under one wildcard: a consumer subscribes once to
``disagg.<ns>.*`` (NATS keeps one publisher's order within a subscription, so ``first_token``
stays ahead of ``complete``; see ``cluster.bus.EventBus.subscribe``) and the server withholds
every message on a denied subject from that subscription. A wildcard subscription is allowed
by ``disagg.*.*``; the deny list is the complement of what the role reads.

Secrets. A credentials directory holds, per role, ``<role>/password`` and optionally
``<role>/user`` (else the user is the role's name; the Helm chart projects its Secret's
``<role>-password`` keys this way), and optionally ``ca.crt``: TLS to the server, verified
against that CA. A process finds the directory in the environment variable
:data:`CREDENTIALS_ENV`, so a secret never travels in a URL, an actor argument or a command
line. :func:`generate_credentials` makes one per run for the embedded server
(``secrets.token_urlsafe``: 256 bits per password).
"""

from __future__ import annotations

import os
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.events import KINDS

CREDENTIALS_ENV = "DISAGG_NATS_CREDENTIALS"
CA_FILE = "ca.crt"
MAX_SECRET_BYTES = 1_024  # a user name or password file; anything larger is not ours

# The KV-event subjects (cluster.kv_wire.kv_subject) of every namespace and component.
KV_SUBJECTS = "namespace.*.component.*.endpoint.*.kv-events"


def _events(*kinds: str) -> tuple[str, ...]:
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown event kinds {sorted(unknown)}")
    return tuple(f"disagg.*.{kind}" for kind in kinds)


@dataclass(frozen=True)
class Permissions:
    """One role's rights, in nats-server's terms: subjects it may publish (less
    ``publish_deny``); subjects it may subscribe to, less those whose messages the server
    withholds (``subscribe_deny``). An empty allow list allows nothing."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()


def _reader(*kinds: str, kv: bool = False, publish: tuple[str, ...] = ()) -> Permissions:
    """A role that reads ``kinds`` through the one ``disagg.<ns>.*`` subscription."""
    others = tuple(k for k in KINDS if k not in kinds)
    subscribe = ("disagg.*.*",) if kinds else ()
    return Permissions(
        publish=publish,
        subscribe=subscribe + ((KV_SUBJECTS,) if kv else ()),
        subscribe_deny=_events(*others) if kinds else (),
    )


# What each role publishes and reads (docs/design.md §5 lists the subjects).
ROLE_PERMISSIONS: Mapping[str, Permissions] = {
    # Engines: their KV events and load snapshots; they read nothing from the bus.
    "worker": Permissions(publish=(KV_SUBJECTS, *_events("engine_load")), subscribe=()),
    # Ingress replicas: request events and load reports out; peers' loads, engines' snapshots,
    # the controller's policy and pools, and the engines' KV events in.
    "ingress": _reader(
        "load",
        "engine_load",
        "regime",
        "pools",
        kv=True,
        publish=_events("route", "first_token", "complete", "load"),
    ),
    # The controller: TTFTs, arrivals and ends (who still waits), and the engines' snapshots
    # that corroborate a long TTFT, in; the regime (with the policy) and re-splits out.
    "controller": _reader(
        "first_token", "route", "complete", "engine_load", publish=_events("regime", "pools")
    ),
    # The PoA estimator reads every kind and says nothing.
    "poa": _reader(*KINDS),
    # The auction announces its batches.
    "auction": Permissions(publish=_events("auction"), subscribe=()),
    # The router actor (off the request path): KV events and load reports in, its routes out.
    "router": _reader("load", kv=True, publish=_events("route")),
    # Dashboards and tools: read everything, publish nothing.
    "observer": _reader(*KINDS, kv=True),
    # Dynamo's own processes (frontend, workers): their subjects, never ours. What Dynamo uses
    # (KV events, inboxes) is its business; ``disagg.>`` is ours, and so is JetStream's API:
    # with it a stream over ``disagg.>`` would read every event, and a push consumer could
    # deliver into ``regime`` or ``pools`` under the server's name (nats-server #8274). Dynamo
    # 1.6.1 as we run it (NATS event plane, TCP requests) needs none of it.
    "dynamo": Permissions(
        publish=(">",),
        subscribe=(">",),
        publish_deny=("disagg.>", "$JS.API.>"),
        subscribe_deny=("disagg.>",),
    ),
}
ROLES = tuple(ROLE_PERMISSIONS)


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def __repr__(self) -> str:  # a record that may reach a log must not carry the secret
        return f"Credentials(user={self.user!r}, password='***')"


def _check_role(role: str) -> None:
    if role not in ROLE_PERMISSIONS:
        raise ValueError(f"unknown NATS role {role!r}; known: {', '.join(ROLES)}")


def generate_credentials(directory: str | Path) -> Path:
    """Write fresh credentials for every role under ``directory`` (created 0700, files 0600)."""
    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    for role in ROLES:
        _write_secret(root / role / "user", role)
        _write_secret(root / role / "password", secrets.token_urlsafe(32))
    return root


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)


def _read_secret(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"NATS credentials: {path} is missing") from None
    if len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"NATS credentials: {path} holds more than {MAX_SECRET_BYTES} bytes")
    value = data.decode().strip()
    if not value or any(c.isspace() or c in "\"'\\" for c in value):
        raise ValueError(f"NATS credentials: {path} must hold one token (no spaces, no quotes)")
    return value


def read_credentials(directory: str | Path, role: str) -> Credentials:
    """The credentials of ``role`` in ``directory`` (the user defaults to the role's name); a
    clear error naming the file if the password is missing or either is malformed."""
    _check_role(role)
    root = Path(directory) / role
    user = _read_secret(root / "user") if (root / "user").exists() else role
    return Credentials(user, _read_secret(root / "password"))


def credentials_directory() -> Path | None:
    """The directory named by :data:`CREDENTIALS_ENV`, or None (a server without auth)."""
    value = os.environ.get(CREDENTIALS_ENV, "").strip()
    return Path(value) if value else None


def credentials_for(role: str | None) -> Credentials | None:
    """This process's credentials for ``role`` (None: no directory configured, or no role)."""
    directory = credentials_directory()
    if role is None or directory is None:
        return None
    return read_credentials(directory, role)


def tls_context() -> ssl.SSLContext | None:
    """TLS to the server, verified against the directory's ``ca.crt``; None if there is none."""
    directory = credentials_directory()
    if directory is None or not (directory / CA_FILE).exists():
        return None
    return ssl.create_default_context(cafile=str(directory / CA_FILE))


def connect_options(role: str | None) -> dict[str, Any]:
    """nats-py ``connect`` keywords for ``role``: its user and password, and TLS when the
    directory holds a CA; empty without a credentials directory."""
    options: dict[str, Any] = {}  # Any: nats-py's keywords, each of its own type
    credentials = credentials_for(role)
    if credentials is not None:
        options.update(user=credentials.user, password=credentials.password)
    tls = tls_context()
    if tls is not None:
        options["tls"] = tls
    return options


def _quoted(subjects: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{s}"' for s in subjects) + "]"


def _rule(allow: tuple[str, ...], deny: tuple[str, ...]) -> str:
    if not allow:
        return 'deny: [">"]'
    return f"allow: {_quoted(allow)}" + (f", deny: {_quoted(deny)}" if deny else "")


def authorization_block(directory: str | Path) -> str:
    """nats-server's ``authorization`` block for the roles in ``directory``.

    Passwords appear in clear: the block lives in the server's config file (0600, in the
    server's private store); bcrypt would hide them from whoever reads that file, who can read
    the credentials directory anyway."""
    users = {}
    for role in ROLES:
        cred = read_credentials(directory, role)
        users[role] = f'"{cred.user}"', f'"{cred.password}"'
    return _authorization(users)


def chart_authorization() -> str:
    """The same block for the Helm chart's nats-server: user names are the roles, each
    password the server's environment variable ``NATS_<ROLE>_PASSWORD`` (from the chart's
    Secret), so the ConfigMap holds no secret. ``helm/disaggctl/files/nats-authorization.conf``
    is this text (tests/helm checks they agree)."""
    return _authorization({role: (f'"{role}"', f"${chart_password_env(role)}") for role in ROLES})


def chart_password_env(role: str) -> str:
    _check_role(role)
    return f"NATS_{role.upper()}_PASSWORD"


def _authorization(users: Mapping[str, tuple[str, str]]) -> str:
    lines = []
    for role, (user, password) in users.items():
        perms = ROLE_PERMISSIONS[role]
        lines.append(
            f"    {{user: {user}, password: {password}, permissions: {{\n"
            f"      publish: {{{_rule(perms.publish, perms.publish_deny)}}}\n"
            f"      subscribe: {{{_rule(perms.subscribe, perms.subscribe_deny)}}}\n"
            f"    }}}}"
        )
    return "authorization {\n  users: [\n" + ",\n".join(lines) + "\n  ]\n}\n"


def exported_env() -> dict[str, str]:
    """The variables another process (a Ray actor, a Dynamo process) needs to find this
    process's credentials: the directory's name, never a secret."""
    directory = credentials_directory()
    return {} if directory is None else {CREDENTIALS_ENV: str(directory)}


def dynamo_auth_env(nats_url: str) -> dict[str, str]:
    """Dynamo's own NATS variables (``NATS_AUTH_*``, ``NATS_TLS_CA_CERT_PATH``) for the
    ``dynamo`` role, plus ``NATS_SERVER``; Dynamo wants a ``tls://`` URL when TLS is on."""
    directory = credentials_directory()
    env = {"NATS_SERVER": nats_url}
    if directory is None:
        return env
    credentials = read_credentials(directory, "dynamo")
    env["NATS_AUTH_USERNAME"] = credentials.user
    env["NATS_AUTH_PASSWORD"] = credentials.password
    if (directory / CA_FILE).exists():
        env["NATS_TLS_CA_CERT_PATH"] = str(directory / CA_FILE)
        env["NATS_SERVER"] = "tls://" + nats_url.split("://", 1)[-1]
    return env


def server_config(directory: str | Path, store_dir: str, listen: str = "0.0.0.0:4222") -> str:
    """A whole nats-server config for a Ray cluster's head (``deploy/ray/cluster.yaml``):
    JetStream in ``store_dir``, the roles of ``directory``, no monitoring port (it lists who is
    connected), and TLS when the directory holds a server certificate (``server.crt`` and
    ``server.key`` beside ``ca.crt``)."""
    root = Path(directory)
    text = f'listen: "{listen}"\njetstream {{ store_dir: "{store_dir}" }}\n'
    if (root / "server.crt").is_file() and (root / "server.key").is_file():
        text += f'tls {{ cert_file: "{root / "server.crt"}", key_file: "{root / "server.key"}" }}\n'
    return text + authorization_block(root)


USAGE = """usage: python -m cluster.nats_auth --chart
       python -m cluster.nats_auth --generate DIR          (fresh credentials, kept if present)
       python -m cluster.nats_auth --server-config DIR STORE  (a nats-server config, to stdout)"""


def main(argv: list[str]) -> int:
    import sys

    match argv:
        case ["--chart"]:
            sys.stdout.write(chart_authorization())
        case ["--generate", directory]:
            root = Path(directory).expanduser()
            if all((root / role / "password").is_file() for role in ROLES):
                print(f"{root}: credentials already there, kept")
            else:
                print(f"{generate_credentials(root)}: credentials for {', '.join(ROLES)}")
        case ["--server-config", directory, store]:
            sys.stdout.write(server_config(Path(directory).expanduser(), store))
        case _:
            print(USAGE, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
