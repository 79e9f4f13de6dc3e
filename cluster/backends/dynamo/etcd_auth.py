"""Who may write Dynamo's discovery: etcd with authentication (docs/design.md "Security model").

Without it any process that reaches etcd can register a fake Dynamo instance under
``v1/instances/…`` and receive prompts. With it, etcd admits two users:

- ``root``, whose password only the process that starts etcd knows (the service's driver for
  the embedded one, the bootstrap sidecar in the chart's etcd pod): it enables authentication,
  adds users and grants roles, and is never given to a Dynamo process;
- ``dynamo`` (the user of the credentials directory's ``etcd/`` folder): read and write on
  Dynamo's keys, the prefix ``v1/``, and nothing else. Every Dynamo process, engines and the
  ingress's routers alike, gets it as ``ETCD_AUTH_USERNAME``/``ETCD_AUTH_PASSWORD`` (Dynamo 1.6.1
  reads those). etcd grants by key range, so "an engine writes only its own instance" cannot be
  said to it: an engine's key is named by a lease id it gets at run time. What auth does give is
  that nothing without the password (another pod, a process on the host) can write at all.

The calls go to etcd's JSON gateway (``/v3/auth/…``), so no ``etcdctl`` is needed. Bootstrap is
idempotent: on an etcd whose auth is already on it logs in as root and sets the ``dynamo`` user's
password and grant again.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from cluster.nats_auth import Credentials, credentials_directory

__all__ = [
    "DYNAMO_PREFIX",
    "ETCD_FOLDER",
    "EtcdAuthError",
    "enable_auth",
    "ensure_etcd_credentials",
    "etcd_auth_env",
    "etcd_credentials",
]

ETCD_FOLDER = "etcd"  # inside the credentials directory: user (optional), password
DYNAMO_USER = "dynamo"
DYNAMO_PREFIX = "v1/"  # every key Dynamo 1.6.1 writes: v1/instances, v1/mdc, v1/event_channels…
MAX_SECRET_BYTES = 1_024


class EtcdAuthError(RuntimeError):
    """etcd refused a step of the bootstrap; the message names the step, never a password."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    """etcd's range_end for "every key starting with ``prefix``": its last byte plus one."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _read(path: Path) -> str:
    with path.open("rb") as f:
        raw = f.read(MAX_SECRET_BYTES + 1)
    value = raw.decode().strip()
    if not value or len(raw) > MAX_SECRET_BYTES or any(c.isspace() for c in value):
        raise ValueError(f"etcd credentials: {path} must hold one token of at most 1024 bytes")
    return value


def etcd_credentials(directory: Path | None = None) -> Credentials | None:
    """The ``dynamo`` user's credentials in ``directory`` (default: this process's credentials
    directory), or None when it has no ``etcd/password``."""
    root = directory if directory is not None else credentials_directory()
    if root is None or not (root / ETCD_FOLDER / "password").is_file():
        return None
    folder = root / ETCD_FOLDER
    user = _read(folder / "user") if (folder / "user").is_file() else DYNAMO_USER
    return Credentials(user, _read(folder / "password"))


def ensure_etcd_credentials(directory: Path) -> Credentials:
    """The directory's etcd credentials, made (0600, 256 bits) if it has none."""
    found = etcd_credentials(directory)
    if found is not None:
        return found
    folder = directory / ETCD_FOLDER
    folder.mkdir(mode=0o700, exist_ok=True)
    for name, value in (("user", DYNAMO_USER), ("password", secrets.token_urlsafe(32))):
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
    return Credentials(DYNAMO_USER, _read(folder / "password"))


def etcd_auth_env() -> dict[str, str]:
    """Dynamo's variables for this process's etcd credentials; empty without them."""
    found = etcd_credentials()
    if found is None:
        return {}
    return {"ETCD_AUTH_USERNAME": found.user, "ETCD_AUTH_PASSWORD": found.password}


class _Gateway:
    """etcd's JSON gateway at ``url``, with root's token once logged in."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.client = httpx.Client(base_url=url, timeout=timeout_s, trust_env=False)
        self.token: str | None = None

    # Any: etcd's JSON gateway answers a JSON object per call.
    def call(self, step: str, path: str, body: dict[str, Any], *, ok: tuple[str, ...] = ()) -> Any:
        headers = {} if self.token is None else {"Authorization": self.token}
        response = self.client.post(f"/v3/auth/{path}", json=body, headers=headers)
        payload = response.json() if response.content else {}
        if response.status_code != 200:
            message = str(payload.get("error") or payload.get("message") or response.text)
            if any(o in message for o in ok):
                return payload
            raise EtcdAuthError(f"etcd {step}: {response.status_code} {message[:200]}")
        return payload

    def close(self) -> None:
        self.client.close()


def enable_auth(
    url: str, root_password: str, user: Credentials, *, timeout_s: float = 10.0
) -> None:
    """Turn on authentication at ``url``: ``root`` (``root_password``) and ``user`` with read and
    write on :data:`DYNAMO_PREFIX` only. Idempotent (module docstring)."""
    gw = _Gateway(url, timeout_s)
    try:
        enabled = _auth_enabled(gw)
        if enabled:
            login = gw.call("log in as root", "authenticate",
                            {"name": "root", "password": root_password})  # fmt: skip
            gw.token = str(login["token"])
        else:
            gw.call("add root", "user/add", {"name": "root", "password": root_password},
                    ok=("already exists",))  # fmt: skip
            gw.call("add the root role", "role/add", {"name": "root"}, ok=("already exists",))
            gw.call("grant root", "user/grant", {"user": "root", "role": "root"})
        gw.call("add the dynamo role", "role/add", {"name": DYNAMO_USER}, ok=("already exists",))
        perm = {"permType": "READWRITE", "key": _b64(DYNAMO_PREFIX),
                "range_end": _b64(_prefix_end(DYNAMO_PREFIX))}  # fmt: skip
        gw.call("grant the dynamo role its keys", "role/grant", {"name": DYNAMO_USER, "perm": perm})
        added = gw.call("add the dynamo user", "user/add",
                        {"name": user.user, "password": user.password},
                        ok=("already exists",))  # fmt: skip
        if "error" in added or "message" in added:  # there already: its password, as given
            gw.call("set the dynamo user's password", "user/changepw",
                    {"name": user.user, "password": user.password})  # fmt: skip
        gw.call("grant the dynamo user its role", "user/grant",
                {"user": user.user, "role": DYNAMO_USER})  # fmt: skip
        if not enabled:
            gw.call("enable auth", "enable", {})
    finally:
        gw.close()


def _auth_enabled(gw: _Gateway) -> bool:
    """Whether auth is on: a read without a token is refused only then."""
    response = gw.client.post("/v3/kv/range", json={"key": _b64(DYNAMO_PREFIX)})
    return response.status_code != 200


def wait_for(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            try:
                if client.get(f"{url}/health").status_code in (200, 503):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise EtcdAuthError(f"etcd at {url} did not answer within {timeout_s} s")
            time.sleep(0.2)


def main(argv: list[str]) -> int:
    """``python -m cluster.backends.dynamo.etcd_auth URL ROOT_PASSWORD_FILE CREDENTIALS_DIR
    [--stay]``: the chart's bootstrap sidecar (``--stay``: then wait, so the pod stays up)."""
    args = [a for a in argv if a != "--stay"]
    if len(args) != 3:
        print(main.__doc__, file=sys.stderr)
        return 2
    url, root_file, directory = args
    user = etcd_credentials(Path(directory))
    if user is None:
        print(f"no {ETCD_FOLDER}/password in {directory}", file=sys.stderr)
        return 2
    wait_for(url, timeout_s=300.0)
    enable_auth(url, _read(Path(root_file)), user)
    print(f"etcd at {url}: authentication on; {user.user} may write {DYNAMO_PREFIX} only")
    sys.stdout.flush()
    while "--stay" in argv:
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
