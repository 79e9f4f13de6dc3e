"""Where a service's Dynamo processes find each other, and the address they listen on
(docs/design.md §6 "Dynamo": discovery across hosts).

Dynamo 1.6.1 registers every worker instance (its component, endpoint and TCP address) in a
discovery backend, which routers and frontends watch. Two of its backends serve this project:

- ``file``: a folder every process of the service shares (``DYN_FILE_KV``). One host only: a
  worker on another host writes to a folder nobody else reads.
- ``etcd``: an etcd cluster (``ETCD_ENDPOINTS``, comma-separated client URLs). Any number of
  hosts: the Helm chart runs one as a StatefulSet; on one machine the service starts one itself
  (``cluster/backends/dynamo/etcd_server.py``) when ``dynamo.etcd_endpoints`` is not set.

A worker announces the address it listens on (``DYN_TCP_RPC_HOST``, and the ingress's
``DYN_TCP_RESPONSE_STREAM_HOST`` where workers stream answers back). ``bind: loopback`` keeps
everything on 127.0.0.1; ``bind: node`` uses the Ray node's IP address, which processes on
other hosts can reach. The system port (``/health``, ``/metrics``) stays on loopback either
way: only the actor that owns the process reads it, on the same host.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from cluster.models import StrictModel

__all__ = ["ETCD_URLS_PATTERN", "LOOPBACK", "Discovery", "listen_host"]

LOOPBACK = "127.0.0.1"
_URL = r"https?://[A-Za-z0-9.-]{1,253}:[0-9]{1,5}"
# One or more client URLs, comma-separated, as etcd and ETCD_ENDPOINTS take them.
ETCD_URLS_PATTERN = rf"^{_URL}(,{_URL}){{0,15}}$"


class Discovery(StrictModel):
    """One service's discovery: ``backend`` "file" with ``location`` the shared folder, or
    "etcd" with ``location`` its client URLs."""

    backend: Literal["file", "etcd"]
    location: str = Field(min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _etcd_urls(self) -> Discovery:
        if self.backend == "etcd" and not re.fullmatch(ETCD_URLS_PATTERN, self.location):
            raise ValueError(
                f"location: etcd discovery takes client URLs (http://host:port, comma-"
                f"separated), got {self.location!r}"
            )
        return self

    @classmethod
    def folder(cls, path: str) -> Discovery:
        return cls(backend="file", location=path)

    @classmethod
    def etcd(cls, endpoints: str) -> Discovery:
        return cls(backend="etcd", location=endpoints)

    def env(self) -> dict[str, str]:
        """The variables that point a Dynamo process at it."""
        if self.backend == "file":
            return {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": self.location}
        return {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": self.location}


def listen_host(bind: Literal["loopback", "node"]) -> str:
    """The address a process started here listens on and announces: loopback, or this Ray
    node's IP address (``ray.util.get_node_ip_address``: what other nodes reach it by)."""
    if bind == "loopback":
        return LOOPBACK
    import ray.util

    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
