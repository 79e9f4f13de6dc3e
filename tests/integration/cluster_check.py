"""The frame of a cluster check that runs as its own process (``_ray_cluster_check.py``,
``_dynamo_cluster_check.py``): its own Ray temp folder, a fake multi-node Ray cluster
(``ray.cluster_utils.Cluster``, each node ``{"B200": 8}``), and a teardown that stops the service
and the cluster whatever happened, then prints the result as one JSON line (``RESULT {...}``),
which the test reads (``test_ray_cluster.run_cluster_helper``) and makes its assertions on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

NODE_B200 = 8
NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "resources": {"B200": NODE_B200},
                             "object_store_memory": 80 * 2**20}  # fmt: skip


class ClusterCheck:
    """``result`` is what the check found (``ok`` once its body ran through without setting
    ``error``); ``service`` and ``cluster``, once the body set them, are stopped at the end."""

    def __init__(self, tmpdir: str) -> None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Cluster writes <RAY_TMPDIR>/ray/ray_current_cluster: keep it in our folder, never in
        # the machine's /tmp/ray (where other sessions' ``address="auto"`` would find it).
        os.environ["RAY_TMPDIR"] = tmpdir
        os.makedirs(os.path.join(tmpdir, "ray"), exist_ok=True)
        self.tmpdir = tmpdir
        self.result: dict[str, Any] = {"ok": False, "timings": {}}
        self.service: Any = None
        self.cluster: Any = None
        self._t0 = time.monotonic()

    def mark(self, what: str) -> None:
        self.result["timings"][what] = round(time.monotonic() - self._t0, 1)

    def start_cluster(
        self, nodes: int, head_resources: dict[str, float] | None = None
    ) -> list[Any]:
        """A head and ``nodes - 1`` more, all up; their node objects (head first). The head
        also declares ``head_resources``."""
        from ray.cluster_utils import Cluster

        head_args = {**NODE_ARGS, "temp_dir": self.tmpdir, "include_dashboard": False}
        if head_resources:
            head_args["resources"] = {**NODE_ARGS["resources"], **head_resources}
        self.cluster = Cluster(initialize_head=True, head_node_args=head_args)
        found = [self.cluster.head_node]
        for _ in range(nodes - 1):
            found.append(self.cluster.add_node(**NODE_ARGS, temp_dir=self.tmpdir))
        self.cluster.wait_for_nodes()
        self.result.update(nodes=[n.node_id for n in found], head=self.cluster.head_node.node_id)
        self.mark("cluster")
        return found

    def run(self, body: Callable[[ClusterCheck], None]) -> int:
        try:
            body(self)
            self.result["ok"] = "error" not in self.result
        except Exception as exc:
            self.result["error"] = f"{exc!r}"[:500]
            self.result["traceback"] = traceback.format_exc()[-3000:]
        finally:
            self._teardown()
        return 0

    def _teardown(self) -> None:
        import ray

        t_stop = time.monotonic()
        if self.service is not None:
            try:
                self.service.stop()
            except Exception as exc:
                self.result["stop_error"] = repr(exc)[:300]
        try:
            if ray.is_initialized():
                ray.shutdown()
            if self.cluster is not None:
                self.cluster.shutdown()
        except Exception as exc:
            self.result["shutdown_error"] = repr(exc)[:300]
        self.result["stop_s"] = round(time.monotonic() - t_stop, 1)
        self.mark("total")
        sys.stdout.write("\nRESULT " + json.dumps(self.result, default=str) + "\n")
        sys.stdout.flush()


def main(body: Callable[[ClusterCheck, argparse.Namespace], None]) -> int:
    """A check script's entry point: ``--tmpdir`` (its Ray temp folder), ``--port`` (the API's)
    and ``--ledger`` (the ledger file); runs ``body(check, args)`` in the frame."""
    p = argparse.ArgumentParser()
    p.add_argument("--tmpdir", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ledger", required=True)
    args = p.parse_args()
    return ClusterCheck(args.tmpdir).run(lambda check: body(check, args))
