"""The Helm chart's Serve application builder: reads the service config from the chart's
ConfigMap and hands over to the project's builder, ``cluster.serve.app_builder:build`` (which
starts or reuses the actors and returns the ingress).

It exists so that no secret travels in the RayService: ``serveConfigV2`` names only file paths,
the config (no secrets) comes from a ConfigMap, and each NATS role's password is a file in the
directory that ``DISAGG_NATS_CREDENTIALS`` names in every Ray container (cluster/nats_auth.py)."""

from __future__ import annotations

from typing import Any

import yaml


def service_args(args: dict[str, Any]) -> dict[str, Any]:
    """The project builder's args: the config file's fields and ``users_file``."""
    args = dict(args or {})
    path = args.pop("config_file")
    with open(path, encoding="utf-8") as f:
        fields = yaml.safe_load(f) or {}
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: must be a YAML mapping")
    fields.update(args)  # users_file
    return fields


def build(args: dict[str, Any]) -> Any:
    from cluster.serve.app_builder import build as project_build

    return project_build(service_args(args))
