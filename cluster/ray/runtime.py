"""Starting or joining Ray with the settings this project is tested with (docs/design.md §6 "Ray").

A local session gets simulated accelerators as a custom resource (``{"B200": n}``), so worker
actors are placed by the same resource requests that place them on real B200 nodes. Unix socket
paths over 107 bytes fail, hence the short temporary folder.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import ray

__all__ = ["LocalRay", "init_ray", "short_tmpdir"]

# Ray's object store needs at least ~75 MB; 200 MB fits a 2-core, small-memory machine and is
# far above what the service moves (token ids and small records, never tensors).
OBJECT_STORE_BYTES = 200 * 2**20


def short_tmpdir() -> str:
    """A fresh folder under /tmp with a short name (Ray's socket paths must stay < 108 bytes)."""
    return tempfile.mkdtemp(prefix="r", dir="/tmp")


@dataclass(frozen=True)
class LocalRay:
    """What :func:`init_ray` started: whether we own the session (and so must shut it down)."""

    owned: bool
    address: str
    tmpdir: str | None


# What each control-plane actor and ingress replica asks of ``ServeConfig.control_resource``,
# and what a local session declares of it: room for a million, so it places and never limits.
CONTROL_RESOURCE_UNIT = 0.001
CONTROL_RESOURCE_CAPACITY = 1000.0


def init_ray(
    address: str | None = None,
    *,
    accelerators: int = 0,
    accelerator: str = "B200",
    num_cpus: int | None = None,
    tmpdir: str | None = None,
    control_resource: str | None = None,
) -> LocalRay:
    """Join the cluster at ``address`` (``"auto"`` or ``ray://``/``host:port``), or start a local
    one declaring ``accelerators`` simulated ``accelerator`` units.

    Joining never changes the cluster's resources; a local session is started with the dashboard
    off, a small object store and usage stats off.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return LocalRay(False, ray.get_runtime_context().gcs_address, None)
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return LocalRay(False, address, None)
    tmp = tmpdir or short_tmpdir()
    resources = {accelerator: float(accelerators)} if accelerators > 0 else {}
    if control_resource is not None:  # the one local node may run everything
        resources[control_resource] = CONTROL_RESOURCE_CAPACITY
    ray.init(
        address="local",
        num_cpus=num_cpus if num_cpus is not None else max(2, os.cpu_count() or 2),
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        log_to_driver=False,
        _temp_dir=tmp,
        resources=resources or None,
    )
    return LocalRay(True, ray.get_runtime_context().gcs_address, tmp)
