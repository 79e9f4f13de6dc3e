"""The Helm chart (helm/disaggctl), checked offline (docs/design.md §7): ``helm lint --strict``;
``helm template`` with the defaults and each example; built-in kinds (and the Ray pod templates)
against Kubernetes 1.30 to 1.33's schemas (kubernetes-validate); the RayService against KubeRay's
CRD schema; the rendered manifests against the project itself (ServeConfig, the builder, the
metric registry, the profiles' TP, the Dynamo engines' commands); what an upgrade does; and bad
values refused with the schema's message."""

from __future__ import annotations

import base64
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from cluster import app_builder
from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.install import DYNAMO_VERSION
from cluster.backends.dynamo.settings import DynamoSettings, worker_command
from cluster.backends.dynamo.worker_spec import DynamoWorkerSpec, dynamo_worker_settings
from cluster.backends.registry import engine_spec
from cluster.config import ServeConfig
from cluster.dataplane.settings import AdmissionSettings, RoutingSettings
from cluster.models import validate_model
from cluster.nats_auth import ROLES, chart_authorization, chart_password_env
from cluster.ray.auction_settings import AuctionSettingsModel
from cluster.ray.controller_pools import ResplitSection
from cluster.ray.controller_settings import ControllerSettings
from cluster.serve.limits import LimitSettings
from cluster.serve.users import UsersFile
from cluster.sim.profile import available_profiles, load_profile
from cluster.worker_spec import WorkerSpec
from telemetry.metrics import REGISTRY
from tests.helm.chart import CHART, EXAMPLES, LOOK_ONLY, NAMESPACE, RELEASE, ROOT, run_helm

CRDS = Path(__file__).resolve().parents[3] / "shared" / "kuberay-crds"
K8S_VERSIONS = ("1.30.0", "1.31.0", "1.32.0", "1.33.0")
FULLNAME = f"{RELEASE}-disaggctl"
B200_EXAMPLES = [e for e in EXAMPLES if e.name.startswith("b200-")]
# Every rendering checked below: the defaults, each example, and the other branches.
CASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "defaults": ((), ()),
    **{e.stem: ((str(e),), ()) for e in EXAMPLES},
    "sim-on-gpus": ((), ("accelerator.gpu=true",)),
    "external-nats": ((), ("nats.enabled=false", "nats.external.url=nats://nats.ops:4222",
                          "nats.auth.existingSecret=nats-client",
                          "networkPolicy.extraEgress[0].ports[0].port=4222")),
    "api-gateway": ((), ("networkPolicy.apiFrom[0].namespaceSelector.matchLabels.gw=yes",)),
    "nats-tls": ((), ("backend=dynamo", "nats.tls.enabled=true", "nats.tls.secretName=nats-tls")),
    "monitoring": ((), ("monitoring.serviceMonitor.enabled=true",
                        "monitoring.prometheusRule.enabled=true")),
    "external-ledger": ((), ("ledger.postgresql.external.url="
                             "postgresql://disaggctl@db.ops:5432/ledger?sslmode=verify-full",
                             "ledger.postgresql.external.caSecret=db-ca",
                             "ledger.postgresql.existingSecret=db-password",
                             "networkPolicy.extraEgress[0].ports[0].port=5432")),
    "sqlite-ledger": ((), ("ledger.backend=sqlite",)),
}  # fmt: skip


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def ray_groups(docs: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any], dict[str, str]]]:
    """(group, replicas, pod template, rayStartParams) of the head (1) and each worker group."""
    cluster = one(docs, "RayService")["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    out = [("head", 1, head["template"], head["rayStartParams"])]
    for g in cluster["workerGroupSpecs"]:
        out.append((g["groupName"], g["replicas"], g["template"], g["rayStartParams"]))
    return out


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, _, template, _ in ray_groups(docs):
        yield f"RayService/{name}", template
    for kind in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
        for d in by_kind(docs, kind):
            yield f"{kind}/{d['metadata']['name']}", d["spec"]["template"]


def service_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    data = one(docs, "ConfigMap", f"{FULLNAME}-config")["data"]["service.yaml"]
    cfg = yaml.safe_load(data)
    assert isinstance(cfg, dict)
    return cfg


def serve_app(docs: list[dict[str, Any]]) -> dict[str, Any]:
    serve = yaml.safe_load(one(docs, "RayService")["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    return app


def gpus(container: dict[str, Any]) -> int:
    limits = container.get("resources", {}).get("limits", {})
    return int(limits.get("nvidia.com/gpu", 0))


def ray_resources(params: dict[str, str]) -> dict[str, float]:
    """rayStartParams.resources: JSON inside a JSON string, as KubeRay takes it."""
    raw = params.get("resources")
    return {} if raw is None else json.loads(json.loads(raw))


# ---- helm lint and template ----------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [None, *EXAMPLES], ids=lambda v: "defaults" if v is None else v.stem
)
def test_helm_lint_strict(helm: str, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART), *LOOK_ONLY]
    args += [] if values is None else ["-f", str(values)]
    out = run_helm(helm, *args)
    assert out.returncode == 0, out.stdout + out.stderr


def test_there_are_the_four_examples() -> None:
    assert {e.stem for e in EXAMPLES} == {
        "sim-laptop", "b200-llama70b-1p5d", "b200-nemotron340b-1p2d", "dynamo-mocker-cpu"
    }  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_template_renders_every_part(render: Any, case: str) -> None:
    docs = render(*CASES[case])
    kinds = {d["kind"] for d in docs}
    assert {"RayService", "ConfigMap", "NetworkPolicy"} <= kinds
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    if case == "external-nats":
        assert ("StatefulSet", f"{FULLNAME}-nats") not in names
    else:
        assert ("StatefulSet", f"{FULLNAME}-nats") in names
        assert ("Secret", f"{FULLNAME}-nats-credentials") in names
    for d in docs:
        assert d["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == RELEASE, d


# ---- Kubernetes and KubeRay schemas ---------------------------------------------------------


@pytest.mark.parametrize("k8s", K8S_VERSIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_builtin_kinds_pass_kubernetes_validate_strict(render: Any, case: str, k8s: str) -> None:
    docs = render(*CASES[case])
    builtin = [d for d in docs if d["apiVersion"] in ("v1", "apps/v1", "networking.k8s.io/v1")]
    assert builtin
    # The Ray pods too: KubeRay turns each group's template into a Pod.
    pods = [
        {"apiVersion": "v1", "kind": "Pod", "spec": t["spec"],
         "metadata": {**t.get("metadata", {}), "name": n.lower().replace("/", "-")}}
        for n, t in pod_templates(docs)
        if n.startswith("RayService/")
    ]  # fmt: skip
    for d in builtin + pods:
        try:
            kubernetes_validate.validate(d, k8s, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{d['kind']}/{d['metadata']['name']}: {e.message} at {list(e.path)}")
    other = {d["kind"] for d in docs} - {d["kind"] for d in builtin}
    assert other <= {"RayService", "ServiceMonitor", "PrometheusRule"}


def strict_schema(schema: Any) -> Any:
    """The CRD schema with unknown fields refused (what `kubectl apply --validate=strict` does):
    every object with properties and no additionalProperties / preserve-unknown-fields gets
    additionalProperties: false."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):  # fmt: skip
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def rayservice_schema() -> dict[str, Any]:
    path = CRDS / "ray.io_rayservices.yaml"
    if not path.is_file():
        pytest.skip(f"KubeRay CRDs not found at {CRDS} (docs/design.md §7)")
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict_schema(v1["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("case", list(CASES))
def test_rayservice_matches_the_kuberay_crd(render: Any, rayservice_schema: Any, case: str) -> None:
    rs = one(render(*CASES[case]), "RayService")
    assert rs["apiVersion"] == "ray.io/v1"
    errors = sorted(jsonschema.Draft7Validator(rayservice_schema).iter_errors(rs), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def test_the_strict_crd_check_catches_a_typo(render: Any, rayservice_schema: Any) -> None:
    rs = json.loads(json.dumps(one(render(), "RayService")))
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replica"] = 3
    assert not jsonschema.Draft7Validator(rayservice_schema).is_valid(rs)


# ---- the rendered manifests against the project ---------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_service_config_is_a_valid_serveconfig(render: Any, case: str) -> None:
    docs = render(*CASES[case])
    cfg = validate_model(ServeConfig, service_config(docs), f"{case}: service.yaml")
    assert cfg.nats_url is not None and "@" not in cfg.nats_url  # no credentials in a ConfigMap
    if cfg.ledger_url is None:  # SQLite, on the head's volume
        assert cfg.ledger_path.startswith("/var/lib/disaggctl/ledger/")
    else:  # PostgreSQL: a URL without a password (ServeConfig refuses one), the chart's server
        assert cfg.ledger_url.startswith("postgresql://disaggctl@")
    app = serve_app(docs)
    assert app["import_path"] == "disaggctl_helm_builder:build"
    assert app["args"]["config_file"] == "/etc/disaggctl/config/service.yaml"


def test_topology_and_tp_size_the_worker_groups(render: Any) -> None:
    for case in CASES:
        docs = render(*CASES[case])
        cfg = validate_model(ServeConfig, service_config(docs), case)
        tp = load_profile(cfg.profile).tp
        p, d = (int(x) for x in re.findall(r"\d+", cfg.topology))
        groups = {g: (n, params) for g, n, _, params in ray_groups(docs)}
        assert groups["prefill"][0] == p and groups["decode"][0] == d, case
        for role in ("prefill", "decode"):
            assert ray_resources(groups[role][1]) == {cfg.accelerator_resource: tp}, (case, role)
        # The head: no accelerator, the control resource only.
        assert ray_resources(groups["head"][1]) == {cfg.control_resource: 1000}


@pytest.mark.parametrize("example", B200_EXAMPLES, ids=lambda e: e.stem)
def test_b200_gpu_counts_are_topology_times_tp(render: Any, example: Path) -> None:
    docs = render((str(example),))
    cfg = validate_model(ServeConfig, service_config(docs), example.name)
    tp = load_profile(cfg.profile).tp
    p, d = (int(x) for x in re.findall(r"\d+", cfg.topology))
    total = 0
    for group, replicas, template, params in ray_groups(docs):
        spec = template["spec"]
        per_pod = sum(gpus(c) for c in spec["containers"])
        if group == "head":
            assert per_pod == 0
            continue
        assert per_pod == tp, group
        assert spec["nodeSelector"] and spec["tolerations"], group
        total += replicas * per_pod
        # dynamo: the worker actor starts the engine in the Ray container, so Ray hands that
        # container's GPUs to the actor (CUDA_VISIBLE_DEVICES), TP of them
        (ray,) = spec["containers"]
        assert gpus(ray) == tp and params["num-gpus"] == str(tp), group
    assert total == (p + d) * tp
    assert {"b200-llama70b-1p5d": 24, "b200-nemotron340b-1p2d": 24}[example.stem] == total
    # The ledger: the chart's PostgreSQL on its own block storage, its password on the head only.
    (claim,) = one(docs, "StatefulSet", f"{FULLNAME}-ledger")["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    for group, _, template, _ in ray_groups(docs):
        env = {e["name"] for c in template["spec"]["containers"] for e in c.get("env", [])}
        volumes = {v["name"] for v in template["spec"]["volumes"]}
        assert "PGPASSWORD" not in env, group  # in no environment, a Serve replica's included
        assert ("DISAGG_LEDGER_PASSWORD_FILE" in env) == (group == "head"), group
        assert ("ledger-password" in volumes) == (group == "head"), group


def test_sim_on_gpus_gives_the_ray_containers_the_gpus(render: Any) -> None:
    docs = render(*CASES["sim-on-gpus"])
    assert service_config(docs)["request_gpus"] is True
    for group, _, template, params in ray_groups(docs):
        (ray,) = template["spec"]["containers"]
        want = 0 if group == "head" else 4
        assert gpus(ray) == want and params.get("num-gpus", "0") == str(want), group


DYNAMO_EXAMPLES = [e for e in EXAMPLES if "backend: dynamo" in e.read_text(encoding="utf-8")]


@pytest.mark.parametrize("example", DYNAMO_EXAMPLES, ids=lambda e: e.stem)
def test_the_worker_actors_start_dynamos_engines_found_through_the_charts_etcd(
    render: Any, example: Path
) -> None:
    docs = render((str(example),))
    cfg = validate_model(ServeConfig, service_config(docs), example.name)
    assert cfg.backend == "dynamo" and cfg.dynamo.model_name == cfg.model_name
    d = cfg.dynamo
    assert (d.discovery, d.bind) == ("etcd", "node")  # across pods, on the pods' addresses
    assert d.etcd_endpoints == f"http://{FULLNAME}-etcd.{NAMESPACE}.svc:2379"
    etcd = one(docs, "Service", f"{FULLNAME}-etcd")["spec"]
    assert etcd["ports"] == [{"name": "client", "port": 2379, "targetPort": "client"}]
    containers = one(docs, "StatefulSet", f"{FULLNAME}-etcd")["spec"]["template"]["spec"][
        "containers"]  # fmt: skip
    (server,) = [c for c in containers if c["name"] == "etcd"]
    assert f"--advertise-client-urls={d.etcd_endpoints}" in server["command"]
    # What each worker actor runs: cluster/backends/dynamo/worker_spec.py and
    # cluster/backends/dynamo/settings.py
    # turn the rendered config into the engine's command, TP from the profile.
    tp = load_profile(cfg.profile).tp
    spec = WorkerSpec(profile=cfg.profile, tp=tp, speedup=1.0, epoch_wall=1.0, seed=0,
                      nats_url=cfg.nats_url, namespace=cfg.namespace,
                      engine=engine_spec("dynamo", DynamoWorkerSpec(
                          settings=d.model_dump(), discovery=Discovery.etcd(d.etcd_endpoints or ""),
                          log_dir="/tmp/logs").model_dump()))  # fmt: skip
    settings = DynamoSettings.model_validate(dynamo_worker_settings(spec))
    for role in ("prefill", "decode"):
        argv = worker_command(settings, role, d.model_path or "/tmp/tiny")
        assert argv[argv.index("--disaggregation-mode") + 1] == role
        if d.engine == "vllm":
            assert argv[1:3] == ["-m", "dynamo.vllm"] and cfg.request_gpus
            assert argv[argv.index("--tensor-parallel-size") + 1] == str(tp)
            assert argv[argv.index("--model") + 1].startswith("/models/")
        else:
            assert argv[1:3] == ["-m", "dynamo.mocker"] and not cfg.request_gpus
    if d.engine == "vllm":  # the ingress tokenizes with the model's own tokenizer
        assert cfg.model_dir == d.model_path
    for group, _, template, _ in ray_groups(docs):
        (ray,) = template["spec"]["containers"]  # no engine container: the actor runs it
        mounts = {m["name"]: m for m in ray["volumeMounts"]}
        # The workers' engines load the model; the head's ingress and builder its tokenizer.
        assert ("model-cache" in mounts) == (group != "head" or d.engine == "vllm"), group
        if group == "head" and d.engine == "vllm":
            assert mounts["model-cache"]["readOnly"] is True


def test_a_vllm_model_outside_the_cache_is_refused(helm: str) -> None:
    out = run_helm(helm, "template", RELEASE, str(CHART), *LOOK_ONLY, "--set", "backend=dynamo",
                   "--set", "dynamo.model=/weights/llama")  # fmt: skip
    assert out.returncode != 0 and "dynamo.model" in out.stderr, out.stderr


def test_etcd_is_reached_by_the_ray_pods_only(render: Any) -> None:
    docs = render((str(CHART / "examples" / "dynamo-mocker-cpu.yaml"),))
    etcd = one(docs, "NetworkPolicy", f"{FULLNAME}-etcd")["spec"]
    (rule,) = etcd["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ray"
    assert rule["ports"] == [{"port": 2379, "protocol": "TCP"}] and etcd["egress"] == []
    ray = one(docs, "NetworkPolicy", f"{FULLNAME}-ray")["spec"]
    to_etcd = [r for r in ray["egress"] if {"port": 2379, "protocol": "TCP"} in r.get("ports", [])]
    (rule,) = to_etcd
    assert rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "etcd"
    sim = {(d["kind"], d["metadata"]["name"]) for d in render()}
    assert ("StatefulSet", f"{FULLNAME}-etcd") not in sim  # backend: sim runs no etcd


def test_the_chart_knows_every_profiles_tp(render: Any) -> None:
    for name in available_profiles():
        docs = render((), (f"config.profile={name}", "config.topology=1P/1D"))
        (_, _, _, params) = ray_groups(docs)[1]
        assert ray_resources(params) == {"B200": load_profile(name).tp}, name


def _family_names() -> set[str]:
    names: set[str] = set()
    for family in REGISTRY.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum", ""),
                    "gauge": ("",), "summary": ("_count", "_sum", "")}[family.type]  # fmt: skip
        names |= {family.name + s for s in suffixes}
    return names


def _metrics_in(text: str) -> set[str]:
    return set(re.findall(r"\bdisagg_[a-z0-9_]+\b", text))


def test_dashboard_metrics_exist_and_cover_the_panels(render: Any) -> None:
    docs = render()
    board = json.loads(one(docs, "ConfigMap", f"{FULLNAME}-dashboard")["data"]["disaggctl.json"])
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = _metrics_in("\n".join(exprs))
    unknown = used - _family_names()
    assert not unknown, f"not in telemetry.metrics.REGISTRY: {sorted(unknown)}"
    wanted = {
        "disagg_poa_hat", "disagg_poa_routing", "disagg_poa_capacity", "disagg_regime",
        "disagg_router_temperature", "disagg_router_overlap_weight", "disagg_pool_workers",
        "disagg_ttft_seconds_bucket", "disagg_itl_seconds_bucket", "disagg_auction_queue_depth",
        "disagg_auction_revenue_total",
    }  # fmt: skip
    assert wanted <= used, sorted(wanted - used)
    assert any("histogram_quantile(0.99" in e and "disagg_ttft_seconds_bucket" in e for e in exprs)
    assert any("histogram_quantile(0.99" in e and "disagg_itl_seconds_bucket" in e for e in exprs)
    assert all(e.count("(") == e.count(")") for e in exprs)


def test_alert_rules(render: Any) -> None:
    docs = render(*CASES["monitoring"])
    (group,) = one(docs, "PrometheusRule")["spec"]["groups"]
    rules = {r["alert"]: r for r in group["rules"]}
    assert set(rules) == {
        "DisaggSaturated", "DisaggPoaHigh", "DisaggEventsDropped", "DisaggResplitStuck"
    }  # fmt: skip
    for rule in rules.values():
        unknown = _metrics_in(rule["expr"]) - _family_names()
        assert not unknown, (rule["alert"], unknown)
        assert rule["expr"].count("(") == rule["expr"].count(")")
    assert re.search(r"disagg_regime\{[^}]*\}\) == 2$", rules["DisaggSaturated"]["expr"])
    assert rules["DisaggSaturated"]["for"] == "5m"
    assert rules["DisaggPoaHigh"]["expr"].endswith("> 1.5")
    assert "rate(disagg_events_dropped_total{" in rules["DisaggEventsDropped"]["expr"]
    assert rules["DisaggEventsDropped"]["expr"].endswith("[5m])) > 0")
    assert rules["DisaggResplitStuck"]["expr"].endswith(" == 1")
    assert rules["DisaggResplitStuck"]["for"] == "10m"
    monitor = one(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    # Not the Serve port: the metrics server on the Ray head, on its own port.
    metrics = one(docs, "Service", f"{FULLNAME}-metrics")
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert metrics["metadata"]["labels"].items() >= selected.items()
    (port,) = metrics["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == "disagg-metrics"
    assert metrics["spec"]["selector"]["disaggctl.io/ray-node"] == "head"
    config = service_config(docs)
    assert (config["metrics_host"], config["metrics_port"]) == ("0.0.0.0", port["port"])
    head = ray_groups(docs)[0][2]["spec"]["containers"][0]
    assert {"name": "disagg-metrics", "containerPort": port["port"]} in head["ports"]
    # The metrics port is open to the monitoring peers only, never to the API's clients.
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-ray")
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        if port["port"] in ports:
            assert rule["from"] and 8080 in ports, rule


def test_no_secret_outside_secrets(render: Any) -> None:
    example = CHART / "examples" / "sim-laptop.yaml"
    docs = render((str(example),))
    secrets = by_kind(docs, "Secret")
    values: set[str] = set()
    for s in secrets:
        values |= {base64.b64decode(v).decode() for v in s.get("data", {}).values()}
        values |= set(s.get("stringData", {}).values())
    passwords = one(docs, "Secret", f"{FULLNAME}-nats-credentials")["data"]
    assert set(passwords) == {f"{role}-password" for role in ROLES}
    users = yaml.safe_load(one(docs, "Secret", f"{FULLNAME}-users")["stringData"]["users.yaml"])
    validate_model(UsersFile, users, "users.yaml")  # the shape cluster/serve/users.py reads
    hashes = {u["key_sha256"] for u in users["users"]}
    for d in docs:
        if d["kind"] == "Secret":
            continue
        text = json.dumps(d)
        assert not any(v in text for v in values), f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "ConfigMap":
            assert not hashes & set(re.findall(r"[0-9a-f]{64}", text))


@pytest.mark.parametrize("case", list(CASES))
def test_every_container_runs_non_root_without_privileges(render: Any, case: str) -> None:
    docs = render(*CASES[case])
    templates = list(pod_templates(docs))
    assert len(templates) >= 3
    for where, template in templates:
        spec = template["spec"]
        pod = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, where
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = {**pod, **c.get("securityContext", {})}
            name = f"{where}/{c['name']}"
            assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) > 0, name
            assert sc.get("allowPrivilegeEscalation") is False, name
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
            assert not sc.get("privileged"), name
            # vLLM writes under its install (the Ray workers that run it, backend: dynamo with
            # engine: vllm); every other root filesystem is read-only
            vllm = (
                where not in ("RayService/head",)
                and where.startswith("RayService/")
                and (service_config(docs).get("dynamo", {}).get("engine") == "vllm")
            )
            assert sc.get("readOnlyRootFilesystem") is (not vllm), name
            assert c.get("resources", {}).get("limits") and c["resources"].get("requests"), name


def test_network_policies_fence_nats_and_the_ray_pods(render: Any) -> None:
    docs = render()
    nats = one(docs, "NetworkPolicy", f"{FULLNAME}-nats")["spec"]
    client = [r for r in nats["ingress"] if {"port": 4222, "protocol": "TCP"} in r["ports"]]
    (rule,) = client
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ray"
    ray = one(docs, "NetworkPolicy", f"{FULLNAME}-ray")["spec"]
    assert ray["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ray"
    for r in ray["ingress"]:
        ports = {p["port"] for p in r.get("ports", [])}
        if "from" not in r:  # open to anyone: only the Serve port
            assert ports == {8000}
        assert r.get("ports") or r["from"][0]["podSelector"]["matchLabels"][
            "app.kubernetes.io/component"] == "ray"  # fmt: skip
    # every Ray pod carries the labels the policies select
    for _, _, template, _ in ray_groups(docs):
        assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "ray"


@pytest.mark.parametrize("case", ["defaults", "api-gateway", "nats-tls"])
def test_default_deny_then_the_listed_flows(render: Any, case: str) -> None:
    docs = render(*CASES[case])
    deny = one(docs, "NetworkPolicy", f"{FULLNAME}-default-deny")["spec"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny
    assert "egress" not in deny
    assert deny["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == RELEASE
    for name in ("nats", "ray"):
        spec = one(docs, "NetworkPolicy", f"{FULLNAME}-{name}")["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"], name
        dns = [r for r in spec["egress"] if {"port": 53, "protocol": "UDP"} in r.get("ports", [])]
        assert len(dns) == 1, name
    ray = one(docs, "NetworkPolicy", f"{FULLNAME}-ray")["spec"]
    api = [r for r in ray["ingress"] if {"port": 8000, "protocol": "TCP"} in r.get("ports", [])
           and len(r["ports"]) == 1]  # fmt: skip
    if case == "api-gateway":  # the API only from the gateway's namespace
        (rule,) = api
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"gw": "yes"}}}]
    else:  # no gateway configured: no one but a port-forward (the operator's rule aside)
        assert api == []
    egress_ports = {p["port"] for r in ray["egress"] for p in r.get("ports", [])}
    assert {4222, 53} <= egress_ports
    assert (2379 in egress_ports) == (case == "nats-tls")  # backend: dynamo, its etcd
    assert all(r.get("from") for r in ray["ingress"]), "an ingress rule open to anyone"


@pytest.mark.parametrize("case", ["defaults", "external-ledger", "sqlite-ledger"])
def test_the_ledger_is_reached_from_the_head_only(render: Any, case: str) -> None:
    docs = render(*CASES[case])
    names = {d["metadata"]["name"] for d in by_kind(docs, "NetworkPolicy")}
    ray = one(docs, "NetworkPolicy", f"{FULLNAME}-ray")["spec"]
    to_ledger = [r for r in ray["egress"] if 5432 in {p["port"] for p in r.get("ports", [])}]
    if case != "defaults":  # no server of the chart's: no policy for it, no StatefulSet
        assert f"{FULLNAME}-ledger" not in names
        assert not [d for d in by_kind(docs, "StatefulSet") if "ledger" in d["metadata"]["name"]]
        assert len(to_ledger) == (case == "external-ledger")  # extraEgress, the operator's
        return
    spec = one(docs, "NetworkPolicy", f"{FULLNAME}-ledger")["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["egress"] == []
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 5432, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"]["ray.io/node-type"] == "head"
    (egress,) = to_ledger
    assert egress["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ledger"
    server = one(docs, "StatefulSet", f"{FULLNAME}-ledger")["spec"]["template"]["spec"]
    (pg,) = server["containers"]
    env = {e["name"]: e for e in pg["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-ledger", "key": "admin-password"}  # fmt: skip
    assert env["LEDGER_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "password"
    assert env["POSTGRES_USER"]["value"] != env["LEDGER_USER"]["value"]
    assert env["POSTGRES_HOST_AUTH_METHOD"]["value"] == "scram-sha-256"
    assert pg["securityContext"]["readOnlyRootFilesystem"] is True
    secret = one(docs, "Secret", f"{FULLNAME}-ledger")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["password"])) == 48
    assert len(base64.b64decode(secret["data"]["admin-password"])) == 48
    assert secret["data"]["password"] != secret["data"]["admin-password"]


def test_an_external_ledger_mounts_its_ca_on_the_head(render: Any) -> None:
    docs = render(*CASES["external-ledger"])
    assert service_config(docs)["ledger_url"].startswith("postgresql://disaggctl@db.ops:5432/")
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-ledger")]
    for group, _, template, _ in ray_groups(docs):
        (ray,) = [c for c in template["spec"]["containers"] if c["name"].startswith("ray-")]
        mounts = {m["name"]: m["mountPath"] for m in ray["volumeMounts"]}
        env = {e["name"]: e for e in ray["env"]}
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert "PGPASSWORD" not in env
        if group == "head":
            assert mounts["ledger-ca"] == "/etc/disaggctl/ledger-ca"
            password = volumes["ledger-password"]["secret"]
            assert password["secretName"] == "db-password"
            assert password["items"] == [{"key": "password", "path": "password"}]
            path = f"{mounts['ledger-password']}/password"
            assert env["DISAGG_LEDGER_PASSWORD_FILE"]["value"] == path
        else:
            assert "ledger-ca" not in mounts and "ledger-password" not in volumes


def test_an_external_nats_needs_an_egress_rule(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), *LOOK_ONLY,
                      "--set", "nats.enabled=false",
                      "--set", "nats.external.url=nats://nats.ops:4222",
                      "--set", "nats.auth.existingSecret=s")  # fmt: skip
    assert result.returncode != 0 and "networkPolicy.extraEgress" in result.stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("ledger.backend=sqlite", "ledger.persistence.enabled=false", "users.existingSecret=u"),
         "emptyDir ledger"),
        (("ledger.backend=sqlite", "ledger.persistence.accessModes={ReadWriteMany}"),
         "network file system"),
        (("ledger.postgresql.external.url=postgresql://l@db/l",),
         "ledger.postgresql.existingSecret"),
        (("ledger.postgresql.external.url=postgresql://l@db/l",
          "ledger.postgresql.existingSecret=s"), "networkPolicy.extraEgress"),
        (("ledger.postgresql.external.url=postgresql://l:hunter2@db/l",
          "ledger.postgresql.existingSecret=s"), "external.url"),  # a password in the URL
    ],
)  # fmt: skip
def test_a_ledger_that_could_lose_money_is_refused(
    helm: str, sets: tuple[str, ...], message: str
) -> None:
    args = [a for s in sets for a in ("--set", s)]
    result = run_helm(helm, "template", RELEASE, str(CHART), *LOOK_ONLY, *args)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "hunter2" not in result.stderr


def test_every_empty_dir_has_a_size_limit(render: Any) -> None:
    for case in ("defaults", "nats-tls"):
        for where, template in pod_templates(render(*CASES[case])):
            for volume in template["spec"].get("volumes", []):
                if "emptyDir" in volume:
                    assert volume["emptyDir"].get("sizeLimit"), (case, where, volume["name"])


# ---- the chart's Serve builder --------------------------------------------------------------


def _builder(docs: list[dict[str, Any]], tmp_path: Path) -> ModuleType:
    source = one(docs, "ConfigMap", f"{FULLNAME}-builder")["data"]["disaggctl_helm_builder.py"]
    path = tmp_path / "disaggctl_helm_builder.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("disaggctl_helm_builder_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_builder_hands_the_projects_builder_a_valid_config(
    render: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render((str(CHART / "examples" / "sim-laptop.yaml"),))
    builder = _builder(docs, tmp_path)
    config_file = tmp_path / "service.yaml"
    config_file.write_text(one(docs, "ConfigMap", f"{FULLNAME}-config")["data"]["service.yaml"])
    users_file = tmp_path / "users.yaml"
    users_file.write_text(one(docs, "Secret", f"{FULLNAME}-users")["stringData"]["users.yaml"])
    args = dict(serve_app(docs)["args"])
    assert args["users_file"] == "/etc/disaggctl/users/users.yaml"
    args |= {"config_file": str(config_file), "users_file": str(users_file)}
    fields = builder.service_args(args)
    config, users = app_builder.parse_args(fields)  # what cluster.app_builder:build checks
    assert config.nats_url == f"nats://{FULLNAME}-nats.{NAMESPACE}.svc:4222"
    assert users == str(users_file)
    # the real builder is what runs: build() delegates to cluster.app_builder.build
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(app_builder, "build", lambda a: seen.append(a) or "app")
    assert builder.build(args) == "app" and seen == [fields]


def test_the_nats_servers_permissions_are_the_projects(render: Any) -> None:
    # The chart's server reads files/nats-authorization.conf: cluster/nats_auth.py's roles and
    # permissions, each password from its Secret key through the server's environment.
    shipped = (CHART / "files" / "nats-authorization.conf").read_text(encoding="utf-8")
    assert shipped == chart_authorization(), "regenerate: python -m cluster.nats_auth --chart"
    docs = render()
    conf = one(docs, "ConfigMap", f"{FULLNAME}-nats")["data"]["nats.conf"]
    assert shipped.strip() in conf and "token:" not in conf
    (server,) = one(docs, "StatefulSet", f"{FULLNAME}-nats")["spec"]["template"]["spec"][
        "containers"]  # fmt: skip
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in server["env"]}
    for role in ROLES:
        assert env[chart_password_env(role)] == {
            "name": f"{FULLNAME}-nats-credentials", "key": f"{role}-password"}  # fmt: skip


@pytest.mark.parametrize("case", ["defaults", "nats-tls"])
def test_ray_pods_hold_their_roles_passwords(render: Any, case: str) -> None:
    docs = render(*CASES[case])
    tls = case == "nats-tls"  # and backend: dynamo, whose engines run in the Ray pods
    for group, _, template, _ in ray_groups(docs):
        spec = template["spec"]
        (ray,) = [c for c in spec["containers"] if c["name"].startswith("ray-")]
        env = {e["name"]: e.get("value") for e in ray["env"]}
        directory = env["DISAGG_NATS_CREDENTIALS"]
        mount = {m["name"]: m for m in ray["volumeMounts"]}["nats-credentials"]
        assert mount["mountPath"] == directory and mount["readOnly"]
        volume = {v["name"]: v for v in spec["volumes"]}["nats-credentials"]
        paths = {i["path"] for src in volume["projected"]["sources"]
                 for i in src["secret"]["items"]}  # fmt: skip
        # The head runs the control plane and the ingress (config.control_resource): their
        # roles; a worker pod, where a model's code runs, only the worker's. The dynamo role's
        # password only where Dynamo's processes run (backend: dynamo).
        roles = set(ROLES) - {"dynamo"} if group == "head" else {"worker"}
        ray_roles = {f"{r}/password" for r in roles | ({"dynamo"} if tls else set())}
        # With Dynamo, etcd's dynamo user too (cluster/backends/dynamo/etcd_auth.py).
        extra = {"ca.crt", "etcd/password"} if tls else set()
        assert paths == ray_roles | extra, group


def test_an_external_nats_needs_the_roles_secret(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), *LOOK_ONLY,
                      "--set", "nats.enabled=false",
                      "--set", "nats.external.url=nats://nats.ops:4222")  # fmt: skip
    assert result.returncode != 0 and "nats.auth.existingSecret" in result.stderr


# ---- values.schema.json ---------------------------------------------------------------------


def _schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))


def test_schema_mirrors_the_projects_config_models() -> None:
    props = _schema()["properties"]
    config = props["config"]["properties"]
    # backend and dynamo come from the chart's own top-level values (templates/_helpers.tpl).
    chart_set = {"nats_url", "ledger_path", "ledger_url", "ledger_schema", "accelerator_resource",
                 "request_gpus", "metrics_host", "metrics_port", "backend", "dynamo",
                 "control_resource"}  # fmt: skip
    # direct_port turns on a flag of the Serve controller, which KubeRay starts: serve deploy
    # refuses it (cluster/app_builder.py), so the chart does not offer it.
    not_in_chart = {"direct_port"}
    assert set(config) == set(ServeConfig.model_fields) - chart_set - not_in_chart
    assert set(config["auction"]["properties"]) == set(AuctionSettingsModel.model_fields)
    assert set(config["routing"]["properties"]) == set(RoutingSettings.model_fields)
    assert set(config["admission"]["properties"]) == set(AdmissionSettings.model_fields)
    assert set(config["limits"]["properties"]) == set(LimitSettings.model_fields)
    controller = config["controller"]["properties"]
    assert set(controller) == set(ControllerSettings.model_fields)
    assert set(controller["resplit"]["properties"]) == set(ResplitSection.model_fields)


def test_defaults_and_examples_satisfy_the_schema() -> None:
    validator = jsonschema.Draft7Validator(_schema())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    validator.validate(defaults)
    assert _schema()["additionalProperties"] is False
    for example in EXAMPLES:
        validator.validate(yaml.safe_load(example.read_text(encoding="utf-8")))


def test_by_default_one_key_cannot_hold_every_slot() -> None:
    """[21] 3: the chart's defaults limit each key's rate and concurrency (0 would be no
    limit), and its body deadline, as the service reads them."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    limits = LimitSettings.model_validate(defaults["config"]["limits"])
    assert limits.user_rate > 0 and limits.user_concurrency > 0
    assert limits.anonymous_rate > 0 and limits.anonymous_concurrency > 0
    assert 0 < limits.body_timeout_s <= 60


BAD_VALUES = {
    "unknown top-level key": (("colour=blue",), "additional properties 'colour' not allowed"),
    "wrong type": (("config.speedup=fast",), "at '/config/speedup': got string, want number"),
    "unknown backend": (("backend=tpu",), "at '/backend': value must be one of 'sim', 'dynamo'"),
    "bad topology": (("config.topology=five",), "at '/config/topology'"),
    "unknown config key": (("config.thetaa=1",), "additional properties 'thetaa' not allowed"),
    "a key, not its hash": (
        ("users.list[0].name=a", "users.list[0].key_sha256=sk-plain", "users.list[0].budget=1"),
        "at '/users/list/0/key_sha256'",
    ),
    "root": (("podSecurityContext.runAsNonRoot=false",), "at '/podSecurityContext/runAsNonRoot'"),
    "no NATS at all": (("nats.enabled=false",), "at '/nats/external/url'"),
    "negative GPUs per worker": (("workers.tp=0",), "at '/workers/tp'"),
    "the operator from any namespace": (("networkPolicy.operator.namespace=",),
                                        "at '/networkPolicy/operator/namespace'"),
    "the ledger's client as its superuser": (("ledger.postgresql.adminUser=disaggctl",),
                                             "ledger.postgresql.adminUser"),
    "generated secrets, unknown mode": (("generatedSecrets.offline=sometimes",),
                                        "at '/generatedSecrets/offline'"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_values_are_refused_with_the_schemas_message(helm: str, case: str) -> None:
    sets, message = BAD_VALUES[case]
    args = ["template", RELEASE, str(CHART), *LOOK_ONLY]
    for s in sets:
        args += ["--set", s]
    out = run_helm(helm, *args)
    assert out.returncode != 0, f"{case}: accepted"
    assert message in out.stderr, out.stderr


# ---- upgrades (README "Upgrades") -----------------------------------------------------------


def kuberay_upgrade(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """What KubeRay's RayService controller does between two renders: a new Ray cluster when
    ``rayClusterConfig`` changes (it compares the spec's hash), the Serve application updated
    in place when only ``serveConfigV2`` does, nothing otherwise."""
    old, new = one(before, "RayService")["spec"], one(after, "RayService")["spec"]
    if old["rayClusterConfig"] != new["rayClusterConfig"]:
        return "new cluster"
    return "in place" if old["serveConfigV2"] != new["serveConfigV2"] else "nothing"


# What only the ingress reads, so a redeploy over the running actors takes it up.
IN_PLACE = {
    "ingress_replicas": "config.ingress_replicas=3",
    "max_ongoing_requests": "config.max_ongoing_requests=500",
    "limits": "config.limits.user_rate=20",
    "allow_anonymous": "config.allow_anonymous=true",
}


def _user(name: str) -> tuple[str, ...]:
    return (f"users.list[0].name={name}", "users.list[0].key_sha256=" + "b" * 64,
            "users.list[0].budget=5")  # fmt: skip


# What the actors are started with, or the pods run: (values before, values after).
NEW_CLUSTER: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "auction": ((), ("config.auction.batch_size=16",)),
    "controller": ((), ("config.controller.theta1_s=2",)),
    "topology": ((), ("config.topology=2P/4D",)),
    "users": (_user("alice"), _user("bob")),
    "image": ((), ("image.tag=0.2.1",)),
    "dynamo engine": ((), ("dynamo.engine=vllm", "dynamo.model=/models/m")),
    "ray head": ((), ("ray.head.numCpus=8",)),
}


@pytest.mark.parametrize("key", list(NEW_CLUSTER))
def test_what_the_actors_start_with_makes_a_new_cluster(render: Any, key: str) -> None:
    example = (str(CHART / "examples" / "dynamo-mocker-cpu.yaml"),)
    before, after = NEW_CLUSTER[key]
    assert kuberay_upgrade(render(example, before), render(example, after)) == "new cluster"


def test_a_new_chart_version_alone_changes_nothing(helm: str, tmp_path: Path) -> None:
    # The chart's version is in the resources' labels, never in the Ray pods' templates: an
    # upgrade to the next chart version with the same values leaves the cluster running.
    import shutil

    previous = tmp_path / "disaggctl"
    shutil.copytree(CHART, previous)
    chart_yaml = previous / "Chart.yaml"
    chart_yaml.write_text(
        re.sub(r"(?m)^version: .*$", "version: 0.0.9", chart_yaml.read_text(encoding="utf-8")),
        encoding="utf-8",
    )

    def docs(chart: Path) -> list[dict[str, Any]]:
        out = run_helm(helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE,
                       *LOOK_ONLY)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    before, after = docs(previous), docs(CHART)
    assert one(before, "RayService")["metadata"] != one(after, "RayService")["metadata"]
    assert kuberay_upgrade(before, after) == "nothing"


def test_the_builder_waits_for_the_config_the_deployment_names(render: Any, tmp_path: Path) -> None:
    docs = render()
    builder = _builder(docs, tmp_path)
    args = dict(serve_app(docs)["args"])
    new = one(docs, "ConfigMap", f"{FULLNAME}-config")["data"]["service.yaml"]
    config_file = tmp_path / "service.yaml"
    config_file.write_text("profile: an-older-config\n")  # the kubelet has not synced yet
    args["config_file"] = str(config_file)
    with pytest.raises(ValueError, match="still not the config"):
        builder.service_args(dict(args), wait_s=0.0)
    config_file.write_text(new)
    fields = builder.service_args(dict(args), wait_s=0.0)
    assert fields["profile"] == service_config(docs)["profile"]


def test_the_image_pins_the_projects_versions() -> None:
    dockerfile = (CHART.parent / "Dockerfile").read_text(encoding="utf-8")
    pins = dict(re.findall(r"(?m)^ARG ([A-Z_]+)=(\S+)$", dockerfile))
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    ray = re.search(r'"ray\[[a-z,]+\]==([0-9.]+)"', pyproject)
    assert ray is not None and pins["RAY_VERSION"] == ray.group(1)
    assert pins["DYNAMO_VERSION"] == DYNAMO_VERSION
    assert pins["RAY_IMAGE"].startswith(f"rayproject/ray:{ray.group(1)}-py311")
    assert "VLLM_VERSION" in pins


# ---- [21] the edges: the operator's namespace, NATS monitoring, offline renders, PostgreSQL --


def test_only_the_operators_pods_in_its_namespace_reach_the_job_api(render: Any) -> None:
    spec = one(render(), "NetworkPolicy", f"{FULLNAME}-ray")["spec"]
    for rule in spec["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        if 8265 in ports:
            (peer,) = rule["from"]
            assert peer["namespaceSelector"] == {
                "matchLabels": {"kubernetes.io/metadata.name": "default"}}  # fmt: skip
            assert peer["podSelector"]["matchLabels"] == {
                "app.kubernetes.io/name": "kuberay-operator"}  # fmt: skip
    for doc in by_kind(render(), "NetworkPolicy"):  # no rule admits "any namespace" + a label
        for rule in doc["spec"].get("ingress", []):
            if {p["port"] for p in rule.get("ports", [])} & {8265, 6379, 52365}:
                assert all(peer.get("namespaceSelector") for peer in rule["from"])


def test_nats_monitoring_stays_on_the_pods_loopback_unless_exposed(render: Any) -> None:
    for sets, exposed in (((), False), (("nats.monitoring.expose=true",), True)):
        docs = render((), sets)
        conf = one(docs, "ConfigMap", f"{FULLNAME}-nats")["data"]["nats.conf"]
        assert ('http: "0.0.0.0:8222"' in conf) == exposed
        assert ('http: "127.0.0.1:8222"' in conf) == (not exposed)
        ports = {p["port"] for p in one(docs, "Service", f"{FULLNAME}-nats")["spec"]["ports"]}
        assert (8222 in ports) == exposed
        policy = one(docs, "NetworkPolicy", f"{FULLNAME}-nats")["spec"]["ingress"]
        assert any(p["port"] == 8222 for r in policy for p in r["ports"]) == exposed
        (server,) = one(docs, "StatefulSet", f"{FULLNAME}-nats")["spec"]["template"]["spec"][
            "containers"]  # fmt: skip
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert server[probe]["exec"]["command"][-1].startswith("http://127.0.0.1:8222/")


def test_an_offline_render_does_not_make_passwords_that_change_every_render(helm: str) -> None:
    base = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    refused = run_helm(helm, *base)
    assert refused.returncode != 0
    assert "does not reach the cluster" in refused.stderr
    assert "existingSecret" in refused.stderr
    # Secrets made once beforehand: nothing to generate, the render is the cluster's to apply.
    given = run_helm(helm, *base, "--set", "ledger.postgresql.existingSecret=ledger-pw",
                     "--set", "nats.auth.existingSecret=nats-pw")  # fmt: skip
    assert given.returncode == 0, given.stderr
    docs = [d for d in yaml.safe_load_all(given.stdout) if d]
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith(
        ("-ledger", "-nats-credentials"))]  # fmt: skip
    # Looked at only: two renders, two sets of passwords (what the refusal prevents).
    first, second = (run_helm(helm, *base, *LOOK_ONLY).stdout for _ in range(2))
    assert first != second


def test_the_ledgers_server_makes_a_client_that_is_not_its_superuser(render: Any) -> None:
    docs = render()
    init = one(docs, "ConfigMap", f"{FULLNAME}-ledger-init")["data"]
    assert init["ledger-roles.psql"] == (CHART / "files" / "ledger-roles.psql").read_text()
    assert "-f /docker-entrypoint-initdb.d/ledger-roles.psql" in init["ledger-roles.sh"]
    server = one(docs, "StatefulSet", f"{FULLNAME}-ledger")["spec"]["template"]["spec"]
    (pg,) = server["containers"]
    mounts = {m["name"]: m["mountPath"] for m in pg["volumeMounts"]}
    assert mounts["init"] == "/docker-entrypoint-initdb.d"
    env = {e["name"]: e for e in pg["env"]}
    assert env["LEDGER_USER"]["value"] == service_config(docs)["ledger_url"].split("//")[1].split(
        "@")[0]  # fmt: skip
    assert env["LEDGER_SCHEMA"]["value"] == service_config(docs)["ledger_schema"]


def test_etcd_admits_only_the_dynamo_user_and_roots_password_stays_in_its_pod(
    render: Any,
) -> None:
    docs = render(*CASES["dynamo-mocker-cpu"])
    secret = one(docs, "Secret", f"{FULLNAME}-etcd")
    assert set(secret["data"]) == {"root-password", "password"}
    etcd = one(docs, "StatefulSet", f"{FULLNAME}-etcd")["spec"]["template"]["spec"]
    (auth,) = [c for c in etcd["containers"] if c["name"] == "auth"]
    assert auth["command"][:3] == ["python", "-m", "cluster.backends.dynamo.etcd_auth"]
    (volume,) = [v for v in etcd["volumes"] if v["name"] == "auth"]
    assert {i["key"] for i in volume["secret"]["items"]} == {"root-password", "password"}
    for group, _, template, _ in ray_groups(docs):
        (creds,) = [v for v in template["spec"]["volumes"] if v["name"] == "nats-credentials"]
        items = [
            item
            for source in creds["projected"]["sources"]
            if source["secret"]["name"] == f"{FULLNAME}-etcd"
            for item in source["secret"]["items"]
        ]
        assert items == [{"key": "password", "path": "etcd/password"}], group  # never root's
    sim = render()
    assert not [d for d in by_kind(sim, "Secret") if d["metadata"]["name"].endswith("-etcd")]


def test_the_control_plane_and_the_ingress_run_on_the_head_only(render: Any) -> None:
    """[21] 5: the head declares the control resource the service asks for, so no control-plane
    actor or ingress replica lands in a worker pod, whose credentials are the worker's only."""
    docs = render()
    resource = service_config(docs)["control_resource"]
    for group, _, _, params in ray_groups(docs):
        assert (resource in ray_resources(params)) == (group == "head"), group
