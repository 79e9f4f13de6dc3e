"""The body of tests/integration/test_ray_cluster.py, run as its own process (it needs its own
Ray session: the test session already has one, see conftest.py ``ray_session``).

A fake three-node Ray cluster (``ray.cluster_utils.Cluster``, each node ``{"B200": 8}``), the
service joined to it (``Service(config).start(address=cluster.address)``), then:

- placement: every worker actor sits on the node of its placement group's single bundle of
  ``profile.tp`` B200 units, so its TP group is on one node; no node holds more than it has;
- requests succeed over HTTP;
- a non-head node hosting a decode worker is removed (``cluster.remove_node``): the requests
  that follow are watched until a run of them succeeds, within a bound; what happened to the
  lost worker (restarted elsewhere? its placement group re-placed?) and to the other actors is
  recorded.

Prints one JSON object on its last stdout line; the test makes the assertions. Run:
``python tests/integration/_ray_cluster_check.py --tmpdir /tmp/rXXXX --port P --ledger F``.
Importing this module does nothing (pytest's doctest collection imports it).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.integration import cluster_check
from tests.integration.cluster_check import ClusterCheck

NODES = 3
TOPOLOGY = "1P/2D"
PROFILE = "b200-llama70b-fp8-tp4"
RECOVERY_BOUND_S = 45.0
RUN_OF_SUCCESSES = 3
CONTROL = "disagg_control"
IN_FLIGHT_TOKENS = 160  # ~0.7 s of decode at speedup 2


def _request(client: Any, url: str, k: int, max_tokens: int = 8
             ) -> tuple[int, dict[str, Any] | str]:  # fmt: skip
    body = {
        "model": "disagg-tiny",
        "messages": [{"role": "user", "content": f"{k} Tell me about node failures, take {k}."}],
        "max_tokens": max_tokens,
    }
    try:
        resp = client.post(f"{url}/v1/chat/completions", json=body)
    except Exception as exc:  # the proxy on a removed node, a reset connection, ...
        return -1, repr(exc)[:200]
    if resp.status_code != 200:
        return resp.status_code, resp.text[:200]
    return 200, resp.json()["disagg"]


def _batch(pool: Any, client: Any, url: str, ks: range, max_tokens: int = 8
           ) -> list[tuple[int, dict[str, Any] | str]]:  # fmt: skip
    """Requests ``ks`` at once (threads), so the router spreads them over the workers."""
    return list(pool.map(lambda k: _request(client, url, k, max_tokens), ks))


def _workers_of(results: list[tuple[int, dict[str, Any] | str]]) -> list[int]:
    return sorted({d["decode_worker"] for s, d in results if s == 200 and isinstance(d, dict)})


def _placement(ray: Any, handles: dict[int, Any], pgs: dict[str, Any], names: dict[int, str],
               timeout: float = 30.0) -> dict[str, Any]:  # fmt: skip
    from ray.util import placement_group_table

    out = {}
    for wid, handle in handles.items():
        info = ray.get(handle.ready.remote(), timeout=timeout)
        pg = pgs[names[wid]]
        table = placement_group_table(pg)
        out[str(wid)] = {
            "name": names[wid],
            "actor_node": info.node_id,
            "pid": info.pid,
            "bundles": {str(k): v for k, v in table["bundles"].items()},
            "bundle_nodes": {str(k): v for k, v in table["bundles_to_node_id"].items()},
            "pg_state": table["state"],
        }
    return out


def _actor_nodes(ray: Any) -> list[dict[str, Any]]:
    """Every actor's class, name, node, state and restarts, from the GCS actor table (the
    state API needs the dashboard, which this cluster does not run). Best effort."""
    try:
        from ray._private.state import actors

        return sorted(
            (
                {
                    "class": a["ActorClassName"],
                    "name": a["Name"],
                    "state": a["State"],
                    "node": a["Address"]["NodeID"],
                    "restarts": a["NumRestarts"],
                }
                for a in actors().values()
            ),
            key=lambda a: (a["class"], a["name"]),
        )
    except Exception as exc:
        return [{"error": repr(exc)[:200]}]


def rehearse(c: ClusterCheck, args: argparse.Namespace) -> None:
    import httpx
    import ray

    from cluster.config import ServeConfig
    from cluster.service import Service

    result, mark = c.result, c.mark
    # As the Helm chart's head: it alone declares the control resource, so the control plane
    # and the ingress replica run there and never beside a worker ([21] 5).
    nodes = c.start_cluster(NODES, head_resources={CONTROL: 1000.0})
    node_ids = [n.node_id for n in nodes]
    cluster = c.cluster

    config = ServeConfig(
        profile=PROFILE, topology=TOPOLOGY, speedup=2.0, namespace="rc",
        ledger_path=args.ledger, worker_max_restarts=3, metrics_port=0, control_resource=CONTROL,
    )  # fmt: skip
    c.service = service = Service(config)
    service.start(address=cluster.address, port=args.port)
    mark("service")
    h = service.handles
    result["driver_node"] = ray.get_runtime_context().get_node_id()
    pgs = {pg_name: pg for pg_name, pg in
           zip([*(f"rc-prefill-{w}" for w in h.prefill), *(f"rc-decode-{w}" for w in h.decode)],
               h.placement_groups, strict=True)}  # fmt: skip
    names = {**{w: f"rc-prefill-{w}" for w in h.prefill},
             **{w: f"rc-decode-{w}" for w in h.decode}}  # fmt: skip
    workers = {**h.prefill, **h.decode}
    result["tp"] = service.profile.tp
    result["before"] = _placement(ray, workers, pgs, names)
    control = {}
    for role in ("router", "auction", "poa", "controller"):
        info = ray.get(getattr(h, role).ready.remote(), timeout=30)
        control[role] = info.node_id
    result["control_nodes"] = control
    result["actors_before"] = _actor_nodes(ray)
    result["node_resources"] = {
        n["NodeID"]: n["Resources"].get("B200") for n in ray.nodes() if n["Alive"]
    }

    url = service.url
    client = httpx.Client(timeout=httpx.Timeout(20.0), limits=httpx.Limits(max_connections=32))
    pool = ThreadPoolExecutor(8)
    first = _batch(pool, client, url, range(8))
    result["requests_before"] = [s for s, _ in first]
    result["decode_used_before"] = _workers_of(first)
    mark("requests_before")

    # The victim: a decode worker's node that is neither the head nor the driver's; among
    # those, the one sharing its node with the fewest other actors (the ingress replica,
    # the Serve proxy, the control plane), so the loss is above all a decode worker's.
    def others_on(node: str, wid: int) -> list[str]:
        return sorted(
            [f"worker-{w}" for w, v in result["before"].items()
             if v["actor_node"] == node and int(w) != wid]
            + [role for role, n in control.items() if n == node]
            + [a["class"] for a in result["actors_before"] if a.get("node") == node
               and a.get("state") == "ALIVE"
               and str(a.get("class", "")).startswith(("Serve", "Proxy"))]
        )  # fmt: skip

    candidates = [
        (len(others_on(node, wid)), wid, node)
        for wid in h.decode
        if (node := result["before"][str(wid)]["actor_node"])
        not in (result["head"], result["driver_node"])
    ]
    if not candidates:
        result["victim"] = {"worker": None, "node": None}
        result["error"] = "no decode worker on a removable node"
        return
    _, victim_wid, victim_node = min(candidates)
    result["victim"] = {
        "worker": victim_wid,
        "node": victim_node,
        "also_on_it": others_on(victim_node, victim_wid),
    }
    node_obj = nodes[node_ids.index(victim_node)]

    # Long requests in flight on both decode workers when the node goes.
    in_flight = pool.submit(_batch, pool, client, url, range(50, 56), IN_FLIGHT_TOKENS)
    time.sleep(0.4)
    t_remove = time.monotonic()
    cluster.remove_node(node_obj)
    result["remove_s"] = round(time.monotonic() - t_remove, 2)
    cut = in_flight.result(timeout=60)
    result["in_flight_at_removal"] = [
        {"status": s, **({"decode_worker": d["decode_worker"]} if isinstance(d, dict)
                         else {"detail": d})}
        for s, d in cut
    ]  # fmt: skip

    # Requests after the loss, in batches of 4 at once, until RUN_OF_SUCCESSES batches in a
    # row all succeed, within the bound.
    log: list[dict[str, Any]] = []
    run = 0
    k = 100
    while time.monotonic() - t_remove < RECOVERY_BOUND_S and run < RUN_OF_SUCCESSES:
        t_req = time.monotonic()
        batch = _batch(pool, client, url, range(k, k + 4))
        k += 4
        statuses = [s for s, _ in batch]
        entry: dict[str, Any] = {"t": round(t_req - t_remove, 2), "statuses": statuses,
                                 "took_s": round(time.monotonic() - t_req, 2),
                                 "decode_workers": _workers_of(batch)}  # fmt: skip
        if all(s == 200 for s in statuses):
            run += 1
        else:
            entry["details"] = [d for s, d in batch if s != 200][:2]
            run = 0
            time.sleep(0.5)
        log.append(entry)
    result["after_removal"] = log
    result["recovered"] = run >= RUN_OF_SUCCESSES
    result["recovered_at_s"] = (
        round(time.monotonic() - t_remove, 2) if result["recovered"] else None
    )
    mark("recovery")

    # What became of the lost worker: restarted elsewhere (its placement group re-placed)?
    deadline = time.monotonic() + 30.0
    fate: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            fate = _placement(ray, {victim_wid: h.decode[victim_wid]}, pgs, names,
                              timeout=5.0)[str(victim_wid)]  # fmt: skip
            break
        except Exception as exc:
            fate = {"error": repr(exc)[:300]}
            time.sleep(1.0)
    result["victim_after"] = fate
    mark("victim_after")
    # Once the worker is back, do requests reach it again?
    again = _batch(pool, client, url, range(1000, 1008), IN_FLIGHT_TOKENS)
    again += _batch(pool, client, url, range(1010, 1018), IN_FLIGHT_TOKENS)
    result["requests_after_restart"] = [s for s, _ in again]
    result["decode_used_after"] = _workers_of(again)
    with_stats = ray.get(h.router.stats.remote(), timeout=10)
    result["router_stats"] = {"workers": dict(with_stats.workers),
                              "policy": dataclasses.asdict(with_stats.policy)}  # fmt: skip
    result["after"] = _placement(
        ray, {w: x for w, x in workers.items() if w != victim_wid}, pgs, names, timeout=10
    )
    result["actors_after"] = _actor_nodes(ray)
    # The router actor restarting under requests (a lost node can take it down with it, as
    # it can any control actor): requests that meet it restarting should get 503, not 500.
    racing = pool.submit(_batch, pool, client, url, range(2000, 2006), 16)
    time.sleep(0.02)
    ray.kill(h.router, no_restart=False)
    raced = racing.result(timeout=60)
    result["router_restart"] = [
        {"status": s, **({} if isinstance(d, dict) else {"detail": d})} for s, d in raced
    ]
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        try:
            ray.get(h.router.ready.remote(), timeout=5)
            break
        except Exception:
            time.sleep(0.5)
    result["after_router_restart"] = [
        s for s, _ in _batch(pool, client, url, range(2100, 2104))
    ]
    mark("router_restart")
    client.close()
    pool.shutdown()


if __name__ == "__main__":
    raise SystemExit(cluster_check.main(rehearse))
