"""deploy/ray: the cluster launcher config and the Serve config parse and say what the README says
(three 8×B200 nodes, each declaring {"B200": 8}; an importable builder whose args are a
ServeConfig), and the builder refuses a config without an external NATS server before it
touches Ray. No Ray session is started here."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import app_builder
from cluster.config import ServeConfig
from cluster.models import ConfigError, validate_model

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "ray"
NODES = 3
GPUS_PER_NODE = 8


def _load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{name} is not a YAML mapping"
    return data


def _app_args() -> dict[str, Any]:
    (app,) = _load("serve.yaml")["applications"]
    return dict(app["args"])


def test_both_files_parse() -> None:
    assert _load("cluster.yaml")["cluster_name"]
    assert _load("serve.yaml")["applications"]


def test_cluster_yaml_has_three_b200_nodes_each_declaring_the_resource() -> None:
    config = _load("cluster.yaml")
    types = config["available_node_types"]
    head = config["head_node_type"]
    assert head in types
    for name, node in types.items():
        resources = node["resources"]
        assert resources.get("B200") == GPUS_PER_NODE, name
        assert resources.get("GPU") == GPUS_PER_NODE, name
    workers = [t for name, t in types.items() if name != head]
    # A fixed-size cluster: the head plus min_workers = max_workers of every worker type.
    assert all(t["min_workers"] == t["max_workers"] for t in workers)
    assert 1 + sum(t["min_workers"] for t in workers) == NODES
    assert config["max_workers"] == NODES - 1


def test_cluster_yaml_passes_ray_up_validation() -> None:
    """What ``ray up`` does first: fill in the provider's defaults, check the schema."""
    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(_load("cluster.yaml")))


def test_cluster_yaml_installs_the_project_and_starts_nats_on_the_head() -> None:
    config = _load("cluster.yaml")
    setup = " ".join(config["setup_commands"])
    assert "pip install" in setup and "disaggctl/src" in setup
    assert any("nats-server" in c for c in config["head_start_ray_commands"])
    # The head writes the config `disaggctl serve --config` reads there, with its NATS URL.
    assert any("nats_url: nats://" in c for c in config["head_setup_commands"])


def test_serve_yaml_passes_serve_validation() -> None:
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(_load("serve.yaml"))
    assert [a.import_path for a in schema.applications] == ["cluster.app_builder:build"]


def test_serve_yaml_import_path_imports_a_one_argument_builder() -> None:
    (app,) = _load("serve.yaml")["applications"]
    module, _, attr = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attr)
    assert builder is app_builder.build
    assert len(inspect.signature(builder).parameters) == 1  # what Serve requires of a builder


def test_serve_yaml_args_are_a_serve_config_plus_a_users_file() -> None:
    args = _app_args()
    assert app_builder.USERS_FILE_KEY in args
    fields = {k: v for k, v in args.items() if k != app_builder.USERS_FILE_KEY}
    config = validate_model(ServeConfig, fields, "serve.yaml")
    assert config.nats_url is not None and config.accelerator_resource == "B200"
    assert Path(config.ledger_path).is_absolute()  # opened on whichever node the auction runs
    # Only key holders: cluster.yaml mounts the users file at the path serve.yaml names.
    assert config.allow_anonymous is False
    mounts = _load("cluster.yaml")["file_mounts"]
    assert args["users_file"] == "/home/ubuntu/" + "disaggctl/users.yaml"
    assert "~/disaggctl/users.yaml" in mounts
    parsed, users_file = app_builder.parse_args({**args, "users_file": __file__})
    assert parsed == config and users_file == __file__


def test_cluster_yamls_nats_admits_only_the_roles() -> None:
    """The head's nats-server starts from the config ``cluster.nats_auth --server-config``
    writes (0600) from the mounted credentials, never open (``-a`` with no config), and every
    Ray process is told where the credentials are."""
    config = _load("cluster.yaml")
    assert config["file_mounts"]["~/disaggctl/nats-credentials"] == "~/.disaggctl/nats-credentials"
    head = config["head_start_ray_commands"]
    (write,) = [c for c in head if "--server-config" in c]
    assert "umask 077" in write and "~/disaggctl/nats-credentials" in write
    (start,) = [c for c in head if "nats-server" in c and "--server-config" not in c]
    assert "-c ~/disaggctl/nats.conf" in start and " -a " not in start
    for commands in (head, config["worker_start_ray_commands"]):
        (ray_start,) = [c for c in commands if "ray start" in c]
        assert "DISAGG_NATS_CREDENTIALS=$HOME/disaggctl/nats-credentials" in ray_start


def test_build_without_nats_url_raises_the_clear_error_before_ray() -> None:
    import ray

    args = _app_args()
    del args["nats_url"]
    with pytest.raises(ConfigError, match="nats_url is required on a Ray cluster"):
        app_builder.build(args)
    with pytest.raises(ConfigError, match="nats_url is required"):
        app_builder.build({})
    assert not ray.is_initialized()


def test_build_names_a_bad_field() -> None:
    with pytest.raises(ConfigError, match="topology"):
        app_builder.build({**_app_args(), "topology": "five"})
    with pytest.raises(ConfigError, match="users_file"):
        app_builder.build({**_app_args(), "users_file": "/nonexistent/users.yaml"})
    with pytest.raises(ConfigError, match="must be a mapping"):
        app_builder.parse_args(["profile"])  # type: ignore[arg-type]
    # Direct ingress is the Serve controller's flag: a builder the cluster runs cannot set it.
    with pytest.raises(ConfigError, match=r"direct_port.*RAY_SERVE_ENABLE_DIRECT_INGRESS"):
        app_builder.parse_args({**_app_args(), "direct_port": 8100})


@pytest.mark.parametrize(
    ("ledger", "reason"),
    [
        ({"ledger_url": "postgresql://ledger:hunter2@db/ledger"}, "PGPASSWORD"),
        ({"ledger_url": "mysql://db/ledger"}, "postgresql://"),
        ({"ledger_url": "postgresql://db/" + "x" * 3000}, "2048"),
        ({"ledger_schema": "Robert'); DROP TABLE"}, "pattern"),
    ],
)
def test_a_bad_ledger_location_is_refused_naming_the_field(
    ledger: dict[str, str], reason: str
) -> None:
    with pytest.raises(ConfigError, match=f"{next(iter(ledger))}.*{reason}") as info:
        validate_model(ServeConfig, ledger, "serve config")
    assert "hunter2" not in str(info.value)


def test_a_postgres_ledger_needs_no_path_and_keeps_its_schema() -> None:
    config = validate_model(
        ServeConfig,
        {"ledger_url": "postgresql://disaggctl@ledger:5432/disaggctl?sslmode=verify-full",
         "ledger_schema": "prod"},
        "serve config",
    )  # fmt: skip
    assert config.ledger_url is not None and config.ledger_schema == "prod"
