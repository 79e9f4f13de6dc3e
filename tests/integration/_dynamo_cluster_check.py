"""The body of tests/integration/test_dynamo_cluster.py, run as its own process (it needs a Ray
session of its own, as ``_ray_cluster_check.py`` does): the multi-host rehearsal on one machine.

A fake three-node Ray cluster (``ray.cluster_utils.Cluster``, each node ``{"B200": 8}``) serves
with real Dynamo engines (``backend: dynamo``, ``dynamo.mocker`` 1P/2D): each worker actor runs
its mocker in a working directory of its own, on ports of its own, listening on the node's
address (``bind: node``); the processes find each other through etcd (``discovery: etcd``, the
one the service starts), not a shared folder; NATS has a user per role ([15]); two users bid
against each other with every request auctioned, so money moves. Then:

- requests are answered, and every worker's instance is registered in etcd;
- a non-head node hosting a decode worker is lost with long requests in flight: every process
  it started is SIGKILLed at once, as when a host goes (:func:`lose_host`), and the node is
  removed (``cluster.remove_node``); the requests that follow are watched until a run of
  batches succeeds;
- the lost worker's actor is restarted by Ray on a surviving node, starts a new mocker
  (``DynamoWorkerActor.restore``), which registers in etcd with a new instance id and serves
  requests again;
- money: what the clients were told they paid is what the ledger captured (a request cut after
  its first token pays its quote), no hold is left open once the leases expire, and the
  ledger's journal replays.

Prints one JSON object on its last stdout line (``RESULT {...}``); the test makes the
assertions. Importing this module does nothing (pytest's doctest collection imports it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.integration import cluster_check
from tests.integration.cluster_check import ClusterCheck

NODES = 3
TOPOLOGY = "1P/2D"
RECOVERY_BOUND_S = 60.0
RESTART_BOUND_S = 90.0
RUN_OF_SUCCESSES = 3
LONG_TOKENS = 600  # decode of a long request: about 6 s on the mocker at speed-up 1 (10 ms a token)
LEASE_TTL_S = 1.0
KEYS = {"alice": "sk-rehearsal-alice-0123456789", "bob": "sk-rehearsal-bob-0123456789"}
BUDGET = 1000.0


def _request(client: Any, url: str, user: str, k: int, bid: float, max_tokens: int = 8
             ) -> dict[str, Any]:  # fmt: skip
    body = {
        "model": "disagg-tiny", "max_tokens": max_tokens, "bid": bid,
        "messages": [{"role": "user", "content": f"{k} Tell me about lost nodes, take {k}."}],
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {KEYS[user]}"}
    t0 = time.monotonic()
    try:
        resp = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    except Exception as exc:  # the replica or proxy on a removed node, a reset connection
        return {"status": -1, "user": user, "detail": repr(exc)[:200]}
    out: dict[str, Any] = {"status": resp.status_code, "user": user,
                           "took_s": round(time.monotonic() - t0, 2)}  # fmt: skip
    if resp.status_code == 200:
        disagg = resp.json()["disagg"]
        out.update(payment=disagg["payment"], decode_worker=disagg["decode_worker"])
    else:
        out["detail"] = resp.text[:200]
    return out


def _batch(pool: Any, client: Any, url: str, ks: range, max_tokens: int = 8
           ) -> list[dict[str, Any]]:  # fmt: skip
    """Requests ``ks`` at once, alternating alice (bid 1.0) and bob (bid 0.6): both bid in
    each auction batch, so VCG prices are not all zero."""
    def one(k: int) -> dict[str, Any]:
        user, bid = ("alice", 1.0) if k % 2 else ("bob", 0.6)
        return _request(client, url, user, k, bid, max_tokens)

    return list(pool.map(one, ks))


def _etcd_instances(url: str) -> list[str]:
    """Every key in etcd (the v3 JSON gateway) that names a Dynamo instance, read as the
    ``dynamo`` user (the service's etcd admits nobody else: cluster/backends/dynamo/etcd_auth)."""
    import httpx

    from cluster.backends.dynamo.etcd_auth import etcd_credentials

    user = etcd_credentials()
    headers = {}
    if user is not None:
        login = httpx.post(f"{url}/v3/auth/authenticate", timeout=5.0,
                           json={"name": user.user, "password": user.password})  # fmt: skip
        headers["Authorization"] = login.json()["token"]
    dynamos = {"key": base64.b64encode(b"v1/").decode(),
               "range_end": base64.b64encode(b"v10").decode(), "keys_only": True}  # fmt: skip
    body = httpx.post(f"{url}/v3/kv/range", json=dynamos, headers=headers, timeout=5.0).json()
    if "error" in body:
        raise RuntimeError(f"etcd refused the listing: {body['error']}")
    keys = [base64.b64decode(kv["key"]).decode(errors="replace") for kv in body.get("kvs", [])]
    return sorted(k for k in keys if "instances" in k)


def _actor_node(ray: Any, name: str) -> dict[str, Any]:
    """The named actor's state, node and restarts in the GCS actor table (newest entry)."""
    from ray._private.state import actors

    rows = [a for a in actors().values() if a["Name"] == name]
    if not rows:
        return {"state": "MISSING"}
    a = max(rows, key=lambda a: a["NumRestarts"])
    return {"state": a["State"], "node": a["Address"]["NodeID"], "restarts": a["NumRestarts"]}


def _children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def lose_host(cluster: Any, node: Any) -> int:
    """A host lost: the node's raylet and everything it started (its workers, hence our actors,
    hence their watchdogs' engines) SIGKILLed together, then the node removed from the fake
    cluster. ``remove_node`` alone stops the raylet and leaves its workers to notice, which takes
    seconds in which a Dynamo engine keeps streaming. How many processes were killed."""
    raylet = node.all_processes["raylet"][0].process.pid
    pids = _children(raylet)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cluster.remove_node(node, allow_graceful=False)
    return len(pids)


def _serve_replica_nodes() -> list[str]:
    """The nodes of the live ingress replicas (Ray Serve's replica actors)."""
    from ray._private.state import actors

    return sorted(a["Address"]["NodeID"] for a in actors().values()
                  if a["ActorClassName"].startswith("ServeReplica") and a["State"] == "ALIVE")


def rehearse(c: ClusterCheck, args: argparse.Namespace) -> None:
    import httpx
    import ray

    from cluster.config import ServeConfig
    from cluster.ledger.sqlite import Ledger
    from cluster.serve.users import Users
    from cluster.service import Service

    result, mark = c.result, c.mark
    told: list[dict[str, Any]] = []  # every request's outcome, for the books
    nodes = c.start_cluster(NODES)
    node_ids = [n.node_id for n in nodes]
    cluster = c.cluster

    config = ServeConfig.model_validate({
        "backend": "dynamo", "topology": TOPOLOGY, "namespace": "rh",
        "ledger_path": args.ledger, "metrics_port": 0, "allow_anonymous": False,
        "worker_max_restarts": 3, "ingress_replicas": 2,
        "dynamo": {"discovery": "etcd", "bind": "node", "speedup_ratio": 1.0},
        # Every request auctioned (money moves); the leases short, so a lost replica's
        # holds come back within seconds.
        "auction": {"queue_threshold": 0, "batch_size": 8, "batch_window_ms": 20},
        "admission": {"lease_ttl_s": LEASE_TTL_S},
        "controller": {"resplit": {"enabled": False}},
    })  # fmt: skip
    users = Users.from_keys({u: (k, BUDGET) for u, k in KEYS.items()},
                            allow_anonymous=False)  # fmt: skip
    c.service = service = Service(config, users=users)
    service.start(address=cluster.address, port=args.port)
    mark("service")
    nats = service.nats
    assert nats is not None  # the embedded server: a user per role, passwords in files ([15])
    result["nats_roles"] = sorted(p.name for p in nats.credentials_dir.iterdir()
                                  if (p / "password").is_file())  # fmt: skip
    result["nats_url_has_secret"] = "@" in (service.nats_url or "")
    engines = service.engines
    etcd_url = engines.discovery.location  # type: ignore[attr-defined]
    result["discovery"] = engines.discovery.model_dump()  # type: ignore[attr-defined]
    result["driver_node"] = ray.get_runtime_context().get_node_id()
    h = service.handles
    names = {**{w: f"rh-prefill-{w}" for w in h.prefill},
             **{w: f"rh-decode-{w}" for w in h.decode}}  # fmt: skip
    workers = {**h.prefill, **h.decode}

    def processes() -> dict[str, Any]:
        out = {}
        for wid, handle in workers.items():
            info = ray.get(handle.info.remote(), timeout=30)
            out[str(wid)] = {"name": names[wid], **_actor_node(ray, names[wid]),
                             "pid": info.pid, "instance": info.instance_id,
                             "alive": info.alive, "log": info.log}  # fmt: skip
        return out

    result["before"] = processes()
    result["etcd_before"] = _etcd_instances(etcd_url)
    url = service.url
    client = httpx.Client(timeout=httpx.Timeout(60.0), limits=httpx.Limits(max_connections=32))
    pool = ThreadPoolExecutor(8)
    first = _batch(pool, client, url, range(8))
    told += first
    result["requests_before"] = [r["status"] for r in first]
    result["refused_before"] = [r.get("detail") for r in first if r["status"] != 200][:3]
    mark("requests_before")

    # The victim: a decode worker's node that is neither the head nor the driver's.
    candidates = [(wid, w["node"]) for wid, w in result["before"].items()
                  if int(wid) in h.decode and w["node"] not in
                  (result["head"], result["driver_node"])]  # fmt: skip
    if not candidates:
        result["error"] = "no decode worker on a removable node"
        return
    victim_wid, victim_node = candidates[0]
    replicas = _serve_replica_nodes()
    result["victim"] = {"worker": int(victim_wid), "node": victim_node,
                        "also_on_it": [w for w, v in result["before"].items()
                                       if v["node"] == victim_node and w != victim_wid],
                        "ingress_replicas_on_it": replicas.count(victim_node),
                        "ingress_replicas": len(replicas)}  # fmt: skip

    in_flight = pool.submit(_batch, pool, client, url, range(50, 56), LONG_TOKENS)
    time.sleep(0.5)
    t_remove = time.monotonic()
    result["killed_with_node"] = lose_host(cluster, nodes[node_ids.index(victim_node)])
    cut = in_flight.result(timeout=120)
    told += cut
    result["in_flight_at_removal"] = cut

    log: list[dict[str, Any]] = []
    run, k = 0, 100
    while time.monotonic() - t_remove < RECOVERY_BOUND_S and run < RUN_OF_SUCCESSES:
        t_req = time.monotonic()
        batch = _batch(pool, client, url, range(k, k + 4))
        told += batch
        k += 4
        ok = all(r["status"] == 200 for r in batch)
        run = run + 1 if ok else 0
        log.append({"t": round(t_req - t_remove, 2), "statuses": [r["status"] for r in batch],
                    **({} if ok else {"details": [r.get("detail") for r in batch
                                                  if r["status"] != 200][:2]})})  # fmt: skip
        if not ok:
            time.sleep(0.5)
    result["after_removal"] = log
    result["recovered"] = run >= RUN_OF_SUCCESSES
    result["recovered_at_s"] = round(time.monotonic() - t_remove, 2)
    mark("recovery")

    # The lost worker: its actor restarted elsewhere, its new mocker registered in etcd.
    victim = workers[int(victim_wid)]
    fate: dict[str, Any] = {}
    while time.monotonic() - t_remove < RESTART_BOUND_S:
        try:
            info = ray.get(victim.info.remote(), timeout=5.0)
            fate = {"alive": info.alive, "pid": info.pid, "instance": info.instance_id,
                    "failed": info.failed, **_actor_node(ray, names[int(victim_wid)])}  # fmt: skip
            if info.alive and info.instance_id is not None:
                break
        except Exception as exc:
            fate = {"error": repr(exc)[:300]}
        time.sleep(1.0)
    fate["back_at_s"] = round(time.monotonic() - t_remove, 2)
    result["victim_after"] = fate
    result["etcd_after"] = _etcd_instances(etcd_url)
    mark("victim_back")

    again: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:  # until the restarted worker takes some
        batch = _batch(pool, client, url, range(k, k + 8), 32)
        k += 8
        again += batch
        if int(victim_wid) in {r.get("decode_worker") for r in batch}:
            break
    told += again
    result["requests_after_restart"] = [r["status"] for r in again]
    result["decode_used_after"] = sorted({r["decode_worker"] for r in again
                                          if r["status"] == 200})  # fmt: skip
    client.close()
    pool.shutdown()
    mark("requests_after_restart")

    time.sleep(3 * LEASE_TTL_S)  # a lost replica's lease expires, its holds return
    with Ledger(args.ledger) as ledger:
        result["books"] = {
            u: {"spent": ledger.account(u).spent,
                "told": round(sum(r.get("payment", 0.0) for r in told
                                  if r["user"] == u and r["status"] == 200), 6),
                "cut": sum(1 for r in told if r["user"] == u and r["status"] != 200)}
            for u in KEYS
        }  # fmt: skip
        result["open_holds"] = len(ledger.holds(state="open"))
        result["replayed"] = {u: a.spent for u, a in ledger.replay().items()}
    result["answered"] = sum(1 for r in told if r["status"] == 200)
    result["failed"] = {str(s): sum(1 for r in told if r["status"] == s)
                        for s in sorted({r["status"] for r in told} - {200})}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(cluster_check.main(rehearse))
