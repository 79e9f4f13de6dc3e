"""What an ingress replica counts itself, as Prometheus text for the merged ``/metrics``
(docs/design.md §5): its unary actor calls on requests' paths, its last routing decision's
cost (it routes; the router actor no longer does) and its load view."""

from __future__ import annotations

import collections
from collections.abc import Mapping

__all__ = ["ACTOR_CALLS", "ENGINE_METHODS", "VIEW_REQUESTS", "actor_calls_text",
           "routing_cost_text", "view_requests_text"]  # fmt: skip

ACTOR_CALLS = "disagg_ingress_actor_calls_total"
# Calls to the engines themselves (plane "engine"): a prompt to prefill, a batch of orders for a
# decode worker's shared stream. Every other method (the auction's exchange) is the control
# plane's, which the data plane keeps off a request's path (plane "control").
ENGINE_METHODS = frozenset({"prefill", "submit"})
VIEW_REQUESTS = "disagg_ingress_view_requests"


def actor_calls_text(calls: collections.Counter[str]) -> str:
    """This replica's unary actor calls on requests' paths, by method."""
    lines = [
        f"# HELP {ACTOR_CALLS} Unary Ray actor calls this ingress replica made for requests, "
        "by plane (control, engine) and method",
        f"# TYPE {ACTOR_CALLS} counter",
    ]
    for method, n in sorted(calls.items()):
        plane = "engine" if method in ENGINE_METHODS else "control"
        lines.append(f'{ACTOR_CALLS}{{method="{method}",plane="{plane}"}} {n}')
    return "\n".join(lines) + "\n"


def routing_cost_text(cost: float) -> str:
    """``disagg_routing_cost``: the chosen worker's cost in this replica's last decision."""
    return (
        "# HELP disagg_routing_cost Cost of the chosen worker in the last decision\n"
        "# TYPE disagg_routing_cost gauge\n"
        f"disagg_routing_cost {cost!r}\n"
    )


def view_requests_text(replica: str, view: Mapping[str, Mapping[int, int]]) -> str:
    """``disagg_ingress_view_requests{replica, role, worker}``: the requests in flight on each
    worker in this replica's load view (its own and its peers' reports)."""
    lines = [
        f"# HELP {VIEW_REQUESTS} Requests in flight per worker in one ingress replica's load view",
        f"# TYPE {VIEW_REQUESTS} gauge",
    ]
    lines += [
        f'{VIEW_REQUESTS}{{replica="{replica}",role="{role}",worker="{w}"}} {n}'
        for role, loads in sorted(view.items())
        for w, n in sorted(loads.items())
    ]
    return "\n".join(lines) + "\n"
