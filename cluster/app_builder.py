"""``serve deploy`` on a Ray cluster: the application builder (docs/design.md "Serve runtime").

``deploy/ray/serve.yaml`` names ``import_path: cluster.app_builder:build`` and ``args``: the
fields of a :class:`cluster.config.ServeConfig` plus ``users_file`` (a users YAML, see
``cluster/serve/users.py``; omitted or null: no users, every request anonymous). Serve imports
this module on the cluster, calls ``build(args)`` inside a Ray task and deploys the application
it returns. ``build``:

1. validates the args (a :class:`cluster.models.ConfigError` naming the field) and requires
   ``nats_url``: on a cluster the actors run on several nodes and outlive the deploy, so the bus
   must be a NATS server of its own; the embedded ``nats-server`` of ``disaggctl serve`` lives
   and dies with one process and is never started here;
2. joins Ray (already joined inside Serve's build task; ``address="auto"`` from a driver);
3. starts the actors through :meth:`cluster.service.Service.start_actors` with
   ``lifetime="detached"``: named ``<namespace>-<role>[-<id>]`` in the Ray namespace
   ``disaggctl``, each worker on a detached placement group holding its TP share of the
   ``accelerator_resource``; actors that already run under those names are reused
   (``ray.get_actor``), so a redeploy keeps the engines, their KV caches and the ledger;
4. returns :meth:`cluster.service.Service.ingress_application`, the OpenAI ingress over them.

``serve shutdown`` removes the ingress, not the detached actors (they are not Serve's):
:func:`teardown` (``python -m cluster.app_builder --teardown``) removes them and their
placement groups. Tear down before deploying another profile or topology, or the reused actors
keep the old one.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.config import ServeConfig
from cluster.models import ConfigError, validate_model

if TYPE_CHECKING:
    from ray.serve import Application

__all__ = ["USERS_FILE_KEY", "build", "parse_args", "teardown"]

USERS_FILE_KEY = "users_file"
SOURCE = "serve deploy args"
NATS_REQUIRED = (
    f"{SOURCE}: nats_url is required on a Ray cluster (e.g. nats_url: nats://nats.internal:4222, "
    "a NATS server with JetStream that every node reaches); the embedded nats-server of "
    "`disaggctl serve` is not started by `serve deploy`"
)


def parse_args(args: Mapping[str, object] | None) -> tuple[ServeConfig, str | None]:
    """The service configuration and the users file named by ``args``; checks the file
    exists on this node. Raises :class:`ConfigError` (a ValueError) naming the bad field."""
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise ConfigError(f"{SOURCE}: must be a mapping, got {type(args).__name__}")
    fields = dict(args)
    users_file = fields.pop(USERS_FILE_KEY, None)
    if users_file is not None and not isinstance(users_file, str):
        raise ConfigError(f"{SOURCE}: {USERS_FILE_KEY}: must be a path or null")
    config = validate_model(ServeConfig, fields, SOURCE)
    if config.nats_url is None:
        raise ConfigError(NATS_REQUIRED)
    if config.direct_port is not None:
        # The flag belongs to the Serve controller, which the cluster started, not this builder.
        raise ConfigError(
            f"{SOURCE}: direct_port: serve deploy cannot turn on direct ingress; set "
            "RAY_SERVE_ENABLE_DIRECT_INGRESS on the cluster instead"
        )
    if users_file is not None and not Path(users_file).expanduser().is_file():
        raise ConfigError(f"{SOURCE}: {USERS_FILE_KEY}: {users_file} is not a file on this node")
    return config, users_file


def build(args: dict[str, object]) -> Application:
    """Serve's application builder: start (or reuse) the detached actors, return the ingress."""
    config, users_file = parse_args(args)  # before Ray: a bad config starts nothing
    import ray

    from cluster.model_dir import prepare_model_dir
    from cluster.ray.runtime import init_ray
    from cluster.serve.users import Users
    from cluster.service import Service

    users = Users.load(
        None if users_file is None else Path(users_file).expanduser(),
        allow_anonymous=config.allow_anonymous,
    )
    if not ray.is_initialized():
        init_ray("auto")
    # None: every node (worker or ingress replica) builds the tiny default model directory
    # itself; a configured one must be at that path on every node (a shared file system).
    model_dir = str(prepare_model_dir(Path(config.model_dir))) if config.model_dir else None
    service = Service(config, users=users)
    service.start_actors(model_dir, lifetime="detached")
    return service.ingress_application(model_dir)


def teardown(namespace: str = "disagg", *, address: str | None = "auto") -> list[str]:
    """Kill the detached actors of ``namespace`` (``<namespace>-...`` in the Ray namespace
    ``disaggctl``) and remove their placement groups; the names of the actors removed."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    from cluster.ray.runtime import init_ray
    from cluster.service import RAY_NAMESPACE

    if not ray.is_initialized():
        init_ray(address)
    prefix = f"{namespace}-"
    names = sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == RAY_NAMESPACE and a["name"].startswith(prefix)
    )
    for name in names:
        with contextlib.suppress(Exception):  # it may be gone already, or never ready
            handle = ray.get_actor(name, namespace=RAY_NAMESPACE)
            with contextlib.suppress(Exception):
                ray.get(handle.shutdown.remote(), timeout=5)
            ray.kill(handle, no_restart=True)
    for pg_id, info in ray.util.placement_group_table().items():
        if str(info.get("name", "")).startswith(prefix) and info.get("state") != "REMOVED":
            with contextlib.suppress(Exception):
                remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Remove the detached actors that `serve deploy` of disaggctl started."
    )
    parser.add_argument("--teardown", action="store_true", required=True)
    parser.add_argument("--namespace", default="disagg", help="the config's namespace")
    parser.add_argument("--address", default="auto", help="the Ray cluster (default: auto)")
    args = parser.parse_args(argv)
    removed = teardown(args.namespace, address=args.address)
    print(f"removed {len(removed)} actors: {', '.join(removed) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
