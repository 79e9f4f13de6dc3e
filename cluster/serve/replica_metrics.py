"""What an ingress replica counts itself, as Prometheus text for the merged ``/metrics``
(docs/design.md §5): its unary actor calls on requests' paths and its last routing decision's
cost (it routes; the router actor no longer does)."""

from __future__ import annotations

import collections

__all__ = ["ACTOR_CALLS", "actor_calls_text", "routing_cost_text"]

ACTOR_CALLS = "disagg_ingress_actor_calls_total"


def actor_calls_text(calls: collections.Counter[str]) -> str:
    """This replica's unary actor calls on requests' paths, by method."""
    lines = [
        f"# HELP {ACTOR_CALLS} Unary Ray actor calls this ingress replica made for requests.",
        f"# TYPE {ACTOR_CALLS} counter",
    ]
    lines += [f'{ACTOR_CALLS}{{method="{m}"}} {n}' for m, n in sorted(calls.items())]
    return "\n".join(lines) + "\n"


def routing_cost_text(cost: float) -> str:
    """``disagg_routing_cost``: the chosen worker's cost in this replica's last decision."""
    return (
        "# HELP disagg_routing_cost Cost of the chosen worker in the last decision\n"
        "# TYPE disagg_routing_cost gauge\n"
        f"disagg_routing_cost {cost!r}\n"
    )
