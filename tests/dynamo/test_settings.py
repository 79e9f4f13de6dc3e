"""Unit tests of the Dynamo layer's pure parts: settings, argv, environment, metrics parsing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from auction.priority import NON_PAYING, PAYING
from cluster.backends.dynamo import install
from cluster.backends.dynamo.discovery import Discovery, listen_host
from cluster.backends.dynamo.install import DynamoMissingError, dynamo_available, require_dynamo
from cluster.backends.dynamo.process import (
    LOG_TAIL_BYTES,
    DynamoProcess,
    instance_id_from_metrics,
    parse_metrics,
    read_log_tail,
)
from cluster.backends.dynamo.routing import DynamoRoutes, DynamoWorkerFailed
from cluster.backends.dynamo.settings import (
    DynamoSettings,
    dynamo_env,
    frontend_command,
    worker_command,
)
from cluster.backends.dynamo.worker_actor import DynamoWorkerActor, dynamo_worker_name
from cluster.nats_auth import CREDENTIALS_ENV

METRICS = """\
# HELP dynamo_component_inflight_requests Number of requests currently being processed
# TYPE dynamo_component_inflight_requests gauge
dynamo_component_inflight_requests{dynamo_component="prefill",dynamo_endpoint="generate",\
dynamo_namespace="dynamo",worker_id="9c5d66d8a46083ca"} 3
dynamo_component_inflight_requests{dynamo_component="prefill",dynamo_endpoint="worker_kv_query_\
source_8d93e76bdaa1e",dynamo_namespace="dynamo",worker_id="9c5d66d8a46083ca"} 0
dynamo_uptime_seconds 12.5
broken line without a value {
"""

FOLDER = Discovery.folder("/d")


def test_the_mocker_command_is_exactly_what_design_lists() -> None:
    s = DynamoSettings()
    assert worker_command(s, "prefill", "/m") == [
        sys.executable, "-m", "dynamo.mocker", "--model-path", "/m", "--model-name", "disagg-tiny",
        "--block-size", "16", "--num-gpu-blocks-override", "512", "--speedup-ratio", "10.0",
        "--disaggregation-mode", "prefill",
    ]
    assert worker_command(s, "decode", "/m")[-2:] == ["--disaggregation-mode", "decode"]


def test_the_vllm_command_uses_vllm_flags_and_appends_extra_args() -> None:
    s = DynamoSettings(engine="vllm", vllm_args=("--tensor-parallel-size", "4"), block_size=32)
    assert worker_command(s, "decode", "/models/llama") == [
        sys.executable, "-m", "dynamo.vllm", "--model", "/models/llama",
        "--served-model-name", "disagg-tiny", "--block-size", "32",
        "--disaggregation-mode", "decode", "--scheduling-policy", "priority",
        "--tensor-parallel-size", "4",
    ]
    # The request's routing.priority counts only under vLLM's priority scheduler; a policy the
    # config names is left alone, and --max-num-seqs goes to either engine.
    own = DynamoSettings(engine="vllm", vllm_args=("--scheduling-policy=fcfs",), max_num_seqs=8)
    assert worker_command(own, "decode", "/m")[-3:] == [
        "--max-num-seqs", "8", "--scheduling-policy=fcfs",
    ]
    assert worker_command(DynamoSettings(max_num_seqs=2), "decode", "/m")[-2:] == [
        "--max-num-seqs", "2",
    ]


def test_other_component_names_are_passed_as_an_endpoint() -> None:
    s = DynamoSettings(namespace="ns1", prefill_component="pre", endpoint="gen")
    assert worker_command(s, "prefill", "/m")[-2:] == ["--endpoint", "dyn://ns1.pre.gen"]
    assert worker_command(s, "decode", "/m")[-2:] == ["--endpoint", "dyn://ns1.backend.gen"]
    assert s.component("prefill") == "pre" and s.component("decode") == "backend"


def test_the_frontend_command_binds_loopback() -> None:
    assert frontend_command(DynamoSettings(), 8123) == [
        sys.executable, "-m", "dynamo.frontend", "--router-mode", "kv",
        "--http-host", "127.0.0.1", "--http-port", "8123",
    ]
    with pytest.raises(ValueError, match="http_port"):
        frontend_command(DynamoSettings(), 0)
    with pytest.raises(ValueError, match="router_mode"):
        frontend_command(DynamoSettings(), 80, router_mode="; rm")


def test_the_environment_is_file_discovery_nats_events_tcp_requests_on_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CREDENTIALS_ENV)  # a bus without credentials: tests/cluster has the rest
    env = dynamo_env(DynamoSettings(namespace="n2"), nats_url="nats://127.0.0.1:4222",
                     discovery=FOLDER, system_port=9090)
    assert env == {
        "DYN_NAMESPACE": "n2", "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": "/d",
        "DYN_EVENT_PLANE": "nats", "DYN_REQUEST_PLANE": "tcp",
        "NATS_SERVER": "nats://127.0.0.1:4222", "HF_HUB_OFFLINE": "1",
        "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_SYSTEM_PORT": "9090",
    }
    no_port = dynamo_env(DynamoSettings(), nats_url="nats://h:1", discovery=FOLDER,
                         system_port=None)
    assert "DYN_SYSTEM_PORT" not in no_port
    with pytest.raises(ValueError, match="nats_url"):
        dynamo_env(DynamoSettings(), nats_url="http://x", discovery=FOLDER, system_port=None)
    with pytest.raises(ValueError, match="system_port"):
        dynamo_env(DynamoSettings(), nats_url="nats://h:1", discovery=FOLDER, system_port=40000)


def test_etcd_discovery_and_the_nodes_address_for_workers_on_several_hosts() -> None:
    settings = DynamoSettings(discovery="etcd", etcd_endpoints="http://10.0.0.5:2379", bind="node")
    etcd = Discovery.etcd(settings.etcd_endpoints or "")
    env = dynamo_env(settings, nats_url="nats://h:1", discovery=etcd, system_port=None,
                     host="10.0.0.7")  # fmt: skip
    assert env["DYN_DISCOVERY_BACKEND"] == "etcd" and "DYN_FILE_KV" not in env
    assert env["ETCD_ENDPOINTS"] == "http://10.0.0.5:2379"
    assert env["DYN_TCP_RPC_HOST"] == env["DYN_TCP_RESPONSE_STREAM_HOST"] == "10.0.0.7"
    assert env["DYN_SYSTEM_HOST"] == "127.0.0.1"  # only the owning actor reads it, here
    assert listen_host("loopback") == "127.0.0.1"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"etcd_endpoints": "http://e:2379"}, "etcd_endpoints"),  # needs discovery: etcd
        ({"discovery": "etcd", "etcd_endpoints": "e:2379"}, "etcd_endpoints"),
        ({"discovery": "etcd", "etcd_endpoints": "http://e:2379;rm"}, "etcd_endpoints"),
        ({"discovery": "consul"}, "discovery"),
        ({"bind": "0.0.0.0"}, "bind"),
    ],
)
def test_discovery_settings_are_refused_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        DynamoSettings.model_validate(fields)
    with pytest.raises(ValueError, match="location"):
        Discovery.etcd("/not/a/url")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("engine", "sglang"),
        ("namespace", "a.b"),
        ("namespace", ""),
        ("prefill_component", "x y"),
        ("endpoint", "*"),
        ("block_size", 0),
        ("block_size", 2048),
        ("block_size", "16"),
        ("num_gpu_blocks", 8),
        ("max_num_seqs", 0),
        ("speedup_ratio", 0.0),
        ("speedup_ratio", float("nan")),
        ("speedup_ratio", 1e6),
        ("vllm_args", tuple(["--x"] * 65)),
        ("vllm_args", ("a" * 513,)),
        ("model_name", "../x"),
        ("startup_timeout_s", -1.0),
        ("max_restarts", -1),
        ("restart_backoff_s", float("inf")),
        ("nope", 1),
    ],
)
def test_bad_settings_are_rejected_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as err:
        DynamoSettings.model_validate({field: value})
    assert field in str(err.value)


def test_settings_are_frozen_and_roles_are_checked() -> None:
    s = DynamoSettings()
    with pytest.raises(ValidationError):
        s.block_size = 32  # type: ignore[misc]
    with pytest.raises(ValueError, match="role"):
        worker_command(s, "encode", "/m")


def test_metrics_are_parsed_and_the_instance_id_is_the_hex_worker_id() -> None:
    samples = parse_metrics(METRICS)
    assert ("dynamo_uptime_seconds", {}, 12.5) in samples
    assert len(samples) == 3
    assert instance_id_from_metrics(METRICS, "prefill") == 11267274923407606730
    assert instance_id_from_metrics(METRICS, "backend") is None
    assert instance_id_from_metrics(METRICS, "prefill", endpoint="other") is None
    assert instance_id_from_metrics("", "prefill") is None


def test_the_log_tail_is_bounded_and_uncoloured(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_bytes(b"x" * (3 * LOG_TAIL_BYTES) + b"\n\x1b[32m INFO\x1b[0m last\n")
    assert read_log_tail(log, 1) == [" INFO last"]
    assert all(len(line) <= LOG_TAIL_BYTES for line in read_log_tail(log, 5))
    assert read_log_tail(tmp_path / "missing.log") == []


def test_a_missing_install_names_make_dynamo(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dynamo_available()
    monkeypatch.setattr(install.importlib.util, "find_spec", lambda name: None)
    assert not dynamo_available()
    with pytest.raises(DynamoMissingError, match="make dynamo") as err:
        require_dynamo()
    assert "--no-deps ai-dynamo==1.6.1" in str(err.value)
    assert "not installed" in str(err.value)


def test_the_worker_actor_validates_and_starts_nothing(tmp_path: Path) -> None:
    common: dict[str, Any] = {"nats_url": "nats://127.0.0.1:1", "discovery": FOLDER,
                              "log_dir": str(tmp_path)}
    actor = DynamoWorkerActor("decode", 2, {"namespace": "ns"}, **common)
    assert actor.process is None and actor.log_path == tmp_path / "ns-dynamo-decode-2.log"
    assert dynamo_worker_name("ns", "decode", 2) == "ns-dynamo-decode-2"
    with pytest.raises(ValueError, match="role"):
        DynamoWorkerActor("both", 0, {}, **common)
    with pytest.raises(ValueError, match="slot"):
        DynamoWorkerActor("prefill", -1, {}, **common)
    with pytest.raises(ValidationError, match="block_size"):
        DynamoWorkerActor("prefill", 0, {"block_size": 0}, **common)


def test_a_process_that_is_never_started_stops_quietly(tmp_path: Path) -> None:
    p = DynamoProcess(["true"], {}, tmp_path / "p.log", None)
    assert (p.pid, p.alive, p.returncode, p.exited) == (None, False, None, False)
    p.stop()
    p.kill()
    with pytest.raises(ValueError, match="argv"):
        DynamoProcess([], {}, tmp_path / "p.log", None)


def test_a_vllm_worker_gets_its_placements_tp_unless_the_config_sets_it() -> None:
    from cluster.backends.dynamo.worker_spec import DynamoWorkerSpec, dynamo_worker_settings
    from cluster.backends.registry import engine_spec
    from cluster.worker_spec import EngineSpec, WorkerSpec

    def spec(settings: dict) -> WorkerSpec:
        return WorkerSpec(
            profile="b200-llama70b-fp8-tp4", tp=4, speedup=1.0, epoch_wall=1.0, seed=0,
            nats_url="nats://127.0.0.1:4222", namespace="n",
            engine=engine_spec(
                "dynamo",
                DynamoWorkerSpec(settings=settings, discovery=FOLDER, log_dir="/l").model_dump(),
            ),
        )

    vllm = dynamo_worker_settings(spec(DynamoSettings(engine="vllm").model_dump()))
    assert vllm["vllm_args"] == ("--tensor-parallel-size", "4")
    command = worker_command(DynamoSettings.model_validate(vllm), "prefill", "/m")
    assert command[-2:] == ["--tensor-parallel-size", "4"]
    own = DynamoSettings(engine="vllm", vllm_args=("--tensor-parallel-size", "8")).model_dump()
    assert dynamo_worker_settings(spec(own))["vllm_args"] == ("--tensor-parallel-size", "8")
    mocker = dynamo_worker_settings(spec(DynamoSettings().model_dump()))
    assert mocker["vllm_args"] == ()
    with pytest.raises(ValueError, match="not a Dynamo service"):
        sim = spec(DynamoSettings().model_dump()).model_copy(update={"engine": EngineSpec()})
        dynamo_worker_settings(sim)


def test_a_request_carries_its_priority_for_the_engine_and_the_router_queue() -> None:
    routes = DynamoRoutes(DynamoSettings(), nats_url="nats://127.0.0.1:4222",
                          discovery=Discovery.folder("/nonexistent"),
                          model_name="disagg-tiny")  # fmt: skip
    paying = routes._request([1, 2], 7, {"router_temperature": 0.5}, PAYING, {"max_tokens": 1})
    free = routes._request([1, 2], 7, {}, NON_PAYING, {"max_tokens": 1})
    # vLLM serves the larger hint first (dynamo.vllm negates it); the router queue's tier is
    # unsigned, a higher one first.
    assert paying["routing"] == {"backend_instance_id": 7, "priority": 0, "strict_priority": 1}
    assert free["routing"] == {"backend_instance_id": 7, "priority": -1, "strict_priority": 0}
    assert paying["router_config_override"] == {"router_temperature": 0.5}


class _FlakyRouter:
    """A ``KvRouter`` whose worker set is empty for its first ``empty`` calls."""

    def __init__(self, empty: int, error: str = "no endpoints available to route work") -> None:
        self.empty, self.error, self.calls = empty, error, 0

    async def best_worker(self, tokens: list[int], override: dict[str, float],
                          request_id: str | None) -> tuple[int, int, int]:  # fmt: skip
        self.calls += 1
        if self.calls <= self.empty:
            raise RuntimeError(self.error)
        return 7, 0, 0


def _routes_over(router: _FlakyRouter) -> DynamoRoutes:
    routes = DynamoRoutes(DynamoSettings(), nats_url="nats://127.0.0.1:4222",
                          discovery=Discovery.folder("/nonexistent"),
                          model_name="disagg-tiny")  # fmt: skip
    routes.routers = {"decode": router}
    return routes


def test_a_choice_waits_out_a_briefly_empty_worker_set() -> None:
    router = _FlakyRouter(empty=3)
    worker = asyncio.run(_routes_over(router).choose("decode", [1, 2], {}, request_id="r"))
    assert (worker, router.calls) == (7, 4)


def test_a_pool_that_stays_empty_or_refuses_otherwise_is_reported_with_dynamos_words() -> None:
    empty = _FlakyRouter(empty=10**6)
    with pytest.raises(DynamoWorkerFailed, match="decode pool: no worker to route to "
                       r"\(no endpoints available"):  # fmt: skip
        asyncio.run(_routes_over(empty).choose("decode", [1, 2], {}))
    assert empty.calls > 1  # it waited NO_ENDPOINTS_GRACE_S before saying so
    other = _FlakyRouter(empty=1, error="all workers busy")
    with pytest.raises(DynamoWorkerFailed, match="all workers busy"):
        asyncio.run(_routes_over(other).choose("decode", [1, 2], {}))
    assert other.calls == 1  # not a transient emptiness: reported at once
