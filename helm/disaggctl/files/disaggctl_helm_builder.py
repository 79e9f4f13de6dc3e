"""The Helm chart's Serve application builder: reads the service config from the chart's
ConfigMap and hands over to the project's builder, ``cluster.app_builder:build`` (which
starts or reuses the actors and returns the ingress).

It exists so that no secret travels in the RayService: ``serveConfigV2`` names only file paths,
the config (no secrets) comes from a ConfigMap, and each NATS role's password is a file in the
directory that ``DISAGG_NATS_CREDENTIALS`` names in every Ray container (cluster/nats_auth.py)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import yaml

# The kubelet refreshes a mounted ConfigMap within its sync period (a minute by default) plus
# its cache's TTL: after an upgrade the new serveConfigV2 can arrive before the new file.
CONFIG_WAIT_S = 180.0


def read_config(path: str, sha256: str | None, wait_s: float = CONFIG_WAIT_S) -> bytes:
    """The config file's bytes, once they are the ones ``sha256`` names (None: as they are)."""
    deadline = time.monotonic() + wait_s
    while True:
        with open(path, "rb") as f:
            data = f.read()
        found = hashlib.sha256(data).hexdigest()
        if sha256 is None or found == sha256:
            return data
        if time.monotonic() >= deadline:
            raise ValueError(f"{path}: still not the config this deployment names after "
                             f"{wait_s:g} s (sha256 {found}, expected {sha256})")
        time.sleep(2.0)


def service_args(args: dict[str, Any], wait_s: float = CONFIG_WAIT_S) -> dict[str, Any]:
    """The project builder's args: the config file's fields and ``users_file``."""
    args = dict(args or {})
    path = args.pop("config_file")
    fields = yaml.safe_load(read_config(path, args.pop("config_sha256", None), wait_s)) or {}
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: must be a YAML mapping")
    fields.update(args)  # users_file
    return fields


def build(args: dict[str, Any]) -> Any:
    from cluster.app_builder import build as project_build

    return project_build(service_args(args))
