"""The service on a (fake) three-node Ray cluster: TP groups on one node, and a lost node
(docs/design.md "Serve runtime": one placement group of one bundle per worker, so a TP group
never spans nodes; a worker that dies is restarted by Ray and the path retries elsewhere).

The body runs in a subprocess, ``_ray_cluster_check.py``: it needs a Ray session of its own
(``ray.cluster_utils.Cluster``, three nodes of ``{"B200": 8}``), and this test session already
has one (conftest.py ``ray_session``). The subprocess runs in its own session with its own Ray
temp folder; whatever of it outlives it is found by that folder or session and killed by pid
(never ``ray stop``, which would kill other sessions' Ray).

Checked, on Llama-3.1-70B FP8 (TP 4) 1P/2D:
- each worker's placement group is one bundle of ``tp`` B200 on one node, and the actor runs on
  that node; no node gives out more B200 than it has, so the three workers span ≥ 2 nodes;
- requests succeed; then a non-head node hosting a decode worker (the one sharing its node with
  the fewest other actors) is removed while long requests are in flight: those on the lost
  worker fail with 503 (never the app's 500, never a hang), the others finish, except that a
  request whose Serve replica or proxy was on that node may be lost by Serve (500 or a closed
  connection: one ingress replica is the default); the service recovers within a bound (a run
  of request batches all succeed); the lost decode worker is restarted on a surviving node (its
  placement group re-placed, room allowing: 3 × 8 B200 for 3 × 4) and serves requests again;
- the router actor restarting (``ray.kill`` with restart) under requests: those that meet it
  get 503 (retry), never 500; the requests after it succeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cluster.nats_server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).with_name("_ray_cluster_check.py")
NODE_B200 = 8
HELPER_TIMEOUT_S = 150
RECOVERY_BOUND_S = 45.0


def _processes_naming(text: str, session: int) -> list[tuple[int, str]]:
    """Live processes whose command line names ``text`` or that belong to ``session``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and (text in cmd or int(fields[3]) == session):
            out.append((int(name), cmd[:140]))
    return out


def _kind(x: dict[str, Any]) -> str:
    """What became of one request: ok, a 503 naming a worker, the app's 500, Serve's loss."""
    status, detail = x["status"], str(x.get("detail", ""))
    if status == 200:
        return "ok"
    if status == 503 and " worker " in detail:
        return "worker-503"
    if status == 500 and '"internal_error"' in detail:
        return "app-500"  # the ingress app's own 500 (cluster/serve/errors.py)
    if status == -1 or (status == 500 and detail.startswith("Internal Server Error")):
        return "serve-lost"  # Ray Serve's proxy: its replica died, or the connection did
    return f"other-{status}"


def run_cluster_helper(
    tmp_path: Path, helper: Path = HELPER, timeout_s: float = HELPER_TIMEOUT_S,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """Run a cluster check (``helper``) in a Ray session of its own; its RESULT, with what
    outlived it (``left_behind``, then killed) and its exit status."""
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths < 108 bytes
    env = {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # never join another Ray
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": ray_tmp,
        "PYTHONPATH": str(REPO),
    }
    cmd = [sys.executable, str(helper), "--tmpdir", ray_tmp, "--port", str(free_port()),
           "--ledger", str(tmp_path / "ledger.sqlite"), *extra]  # fmt: skip
    out_path, err_path = tmp_path / "helper.out", tmp_path / "helper.err"
    left: list[tuple[int, str]] = []
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(REPO), start_new_session=True)  # fmt: skip
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        deadline = time.monotonic() + 15.0
        while (left := _processes_naming(ray_tmp + "/", proc.pid)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.25)
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    stdout = out_path.read_text(errors="replace")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, (
        f"the helper printed no RESULT (exit {proc.returncode}); stderr tail:\n"
        + err_path.read_text(errors="replace")[-4000:]
    )
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    result["left_behind"] = left
    result["helper_exit"] = proc.returncode
    return result


def test_tp_groups_stay_on_one_node_and_a_lost_node_is_survived(tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = run_cluster_helper(tmp_path)
    r["test_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps({k: v for k, v in r.items() if k not in ("actors_before",)}, indent=1))
    # Nothing left behind (checked first: it must hold whatever else fails).
    assert not r["left_behind"], f"processes outlived the cluster: {r['left_behind']}"
    assert r["helper_exit"] == 0, r
    assert "stop_error" not in r and "shutdown_error" not in r, r
    assert r.get("ok"), f"the cluster check failed: {r.get('error')}\n{r.get('traceback', '')}"
    tp = r["tp"]
    assert tp == 4

    # -- placement: one bundle of tp units per worker, on the actor's own node -----------------
    per_node: Counter[str] = Counter()
    for wid, w in r["before"].items():
        assert w["bundles"] == {"0": {"B200": float(tp)}}, (wid, w)
        assert w["bundle_nodes"]["0"] == w["actor_node"], (
            f"worker {wid} runs on {w['actor_node']} but its TP bundle is on {w['bundle_nodes']}"
        )
        assert w["actor_node"] in r["nodes"], w
        per_node[w["actor_node"]] += tp
    assert all(n <= NODE_B200 for n in per_node.values()), per_node
    assert len(per_node) >= -(-tp * len(r["before"]) // NODE_B200), per_node
    assert r["requests_before"] == [200] * len(r["requests_before"]), r["requests_before"]
    # The head alone declares the control resource: the control plane and the ingress replica
    # run there, never beside a worker (whose pod holds only the worker's credentials).
    assert set(r["control_nodes"].values()) == {r["head"]}, r["control_nodes"]
    replicas = [a for a in r["actors_before"] if str(a.get("class", "")).startswith(
        "ServeReplica") and a.get("state") == "ALIVE"]  # fmt: skip
    assert replicas and {a["node"] for a in replicas} == {r["head"]}, replicas

    # -- a node hosting a decode worker is lost -------------------------------------------------
    victim = r["victim"]
    assert victim["worker"] is not None, (
        "placement put every decode worker on the head node (the driver's), so none could be "
        f"removed: {r['before']}"
    )
    # In flight when the node went: 200, or 503 naming the lost worker; a request whose
    # ingress replica or HTTP proxy was on that node may also be lost by Ray Serve itself (its
    # plain-text 500, or the connection closed): one replica is the configured default.
    serve_lost = any(c.startswith(("Serve", "Proxy")) for c in victim["also_on_it"])
    kinds = Counter(_kind(x) for x in r["in_flight_at_removal"])
    assert "app-500" not in kinds, (
        f"requests in flight when the node went (with {victim['also_on_it']}) got the app's "
        "500 'internal error': the router actor died with the node, and cluster/serve/path.py "
        "ActorRequestPath._serve/_prefill call router.route/finish_prefill without catching "
        f"Ray actor failures (see the router-restart check): {r['in_flight_at_removal']}"
    )
    allowed = {"ok", "worker-503"} | ({"serve-lost"} if serve_lost else set())
    assert set(kinds) <= allowed, (kinds, victim, r["in_flight_at_removal"])
    assert r["recovered"], f"no recovery within {RECOVERY_BOUND_S} s: {r['after_removal']}"
    assert r["recovered_at_s"] <= RECOVERY_BOUND_S

    fate = r["victim_after"]
    assert "error" not in fate, f"the lost decode worker never came back: {fate}"
    survivors = set(r["nodes"]) - {victim["node"]}
    assert fate["actor_node"] in survivors, fate
    assert fate["bundle_nodes"]["0"] == fate["actor_node"], fate
    assert fate["bundles"] == {"0": {"B200": float(tp)}}, fate
    assert fate["pid"] != r["before"][str(victim["worker"])]["pid"]
    for wid, w in r["after"].items():  # the others stay put, unless they lived on that node
        was = r["before"][wid]["actor_node"]
        assert w["actor_node"] == was if was != victim["node"] else w["actor_node"] in survivors
        assert w["bundle_nodes"]["0"] == w["actor_node"], (wid, w)
    assert r["requests_after_restart"] == [200] * len(r["requests_after_restart"])
    assert victim["worker"] in r["decode_used_after"], (
        f"the restarted decode worker {victim['worker']} got no request: {r['decode_used_after']}"
    )

    # -- the router actor restarting under requests -----------------------------------------
    raced = Counter(x["status"] for x in r["router_restart"])
    assert r["after_router_restart"] == [200] * len(r["after_router_restart"]), r
    assert set(raced) <= {200, 503}, (
        f"requests that met the router actor restarting got {dict(raced)}: a Ray actor failure "
        "of the router (ActorUnavailableError from router.route in cluster/serve/path.py "
        "ActorRequestPath._serve; likewise router.finish_prefill in _prefill) escapes the path "
        "as a 500 'internal error', where the auction's is a 503 'restarting; retry shortly'. "
        f"Details: {r['router_restart'][:2]}"
    )
