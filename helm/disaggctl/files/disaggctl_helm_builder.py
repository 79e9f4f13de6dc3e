"""The Helm chart's Serve application builder: reads the service config from the chart's
ConfigMap, adds the NATS token from the environment, and hands over to the project's builder,
``cluster.serve.app_builder:build`` (which starts or reuses the actors and returns the ingress).

It exists so that no secret travels in the RayService: ``serveConfigV2`` names only file paths,
the config (no secrets) comes from a ConfigMap and the token from a Secret, as the environment
variable ``DISAGG_NATS_TOKEN`` of every Ray container."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import yaml

TOKEN_ENV = "DISAGG_NATS_TOKEN"


def with_token(url: str, token: str | None) -> str:
    """``nats://host:4222`` + token → ``nats://<token>@host:4222`` (a URL that carries
    credentials already is left alone)."""
    if not token:
        return url
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f"{quote(token, safe='')}@{parts.netloc}"))


def service_args(args: dict[str, Any]) -> dict[str, Any]:
    """The project builder's args: the config file's fields, ``users_file``, the token."""
    args = dict(args or {})
    path = args.pop("config_file")
    with open(path, encoding="utf-8") as f:
        fields = yaml.safe_load(f) or {}
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: must be a YAML mapping")
    fields.update(args)  # users_file
    if fields.get("nats_url"):
        fields["nats_url"] = with_token(fields["nats_url"], os.environ.get(TOKEN_ENV))
    return fields


def build(args: dict[str, Any]) -> Any:
    from cluster.serve.app_builder import build as project_build

    return project_build(service_args(args))
