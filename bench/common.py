"""What every benchmark shares: the output flags, the target records and the verdict.

A bench measures, then a pure ``judge(report)`` turns the measurements into target records (built
here with :func:`at_most`, :func:`at_least` and :func:`holds`), and :func:`emit` prints the JSON
with the verdict on top and returns the exit status. The judgement stays apart from the timing
so that tests can feed it synthetic reports in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

__all__ = [
    "add_output_flags",
    "at_least",
    "at_most",
    "emit",
    "holds",
    "lower_service_priority",
    "strict_json",
    "verdict",
]

# The niceness a service started by this process runs at beside its load client (see below).
SERVICE_NICENESS = 10

Target = dict[str, Any]


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (default: a bar only when stderr is a terminal) and
    ``--quiet`` (no bar, no verdict line; the JSON on stdout is still printed, and warnings that
    the code under test logs still reach stderr: they say a result is suspect)."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw progress bars on stderr (default: only when stderr is a terminal)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars and no verdict line on stderr; the JSON is still printed",
    )


def at_most(measured: float | None, limit: float, **detail: Any) -> Target:
    """A ceiling. NaN or a missing measurement never meets it (a comparison with NaN is false)."""
    met = measured is not None and measured <= limit
    return {"target": f"<= {limit:g}", "measured": measured, "met": bool(met), **detail}


def at_least(measured: float | None, limit: float, **detail: Any) -> Target:
    """A floor, with the same treatment of NaN and missing measurements as :func:`at_most`."""
    met = measured is not None and measured >= limit
    return {"target": f">= {limit:g}", "measured": measured, "met": bool(met), **detail}


def holds(condition: bool, what: str, **detail: Any) -> Target:
    """A yes/no target (a correctness check, a regime reached)."""
    return {"target": what, "measured": bool(condition), "met": bool(condition), **detail}


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den to four places; None when either is missing or den is not positive (every
    bench's figures are rates, latencies and costs: a ratio over zero says nothing)."""
    return None if num is None or den is None or den <= 0 else round(num / den, 4)


def verdict(targets: Mapping[str, Target]) -> dict[str, Any]:
    """``met`` is true only if there is at least one target and every one is met: a bench that
    judged nothing must not read as a pass."""
    return {"met": bool(targets) and all(t["met"] for t in targets.values()), "targets": targets}


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by ``None``: Python's ``json`` would
    write them as ``NaN``/``Infinity``, which strict JSON parsers (jq, browsers) reject. A phase
    with no samples has a NaN mean; ``null`` says the same thing in valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def emit(name: str, judged: Mapping[str, Any], body: Mapping[str, Any], quiet: bool) -> int:
    """Print ``{"benchmark", "met", "targets", ...body}`` as JSON on stdout; name the missed
    targets on stderr unless ``quiet``; return the exit status (1 when a target is missed), so a
    script or CI job that ignores the JSON still sees the miss."""
    report = {"benchmark": name, "met": judged["met"], "targets": judged["targets"], **body}
    sys.stdout.write(json.dumps(strict_json(report), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()
    if judged["met"]:
        return 0
    if not quiet:
        missed = [
            f"{key} (measured {t['measured']}, target {t['target']})"
            for key, t in judged["targets"].items()
            if not t["met"]
        ] or ["no target was judged"]
        print(f"bench.{name}: target missed: " + "; ".join(missed), file=sys.stderr)
    return 1


def lower_service_priority(niceness: int = SERVICE_NICENESS) -> int:
    """Lower the scheduling priority of every process this one has started so far (the Ray
    session a ``Service`` started here, its NATS server) to ``niceness``; returns how many.

    A load generator belongs on a machine of its own: sharing two cores with the service it
    measures, its sends would wait on the service's CPU bursts and its lateness would be the
    service's, not its own. Lowering the service's priority (no privilege needed, unlike raising
    the client's) gives the client the CPU the moment a send is due; processes the service
    starts later inherit the niceness from their parents."""
    import psutil

    lowered = 0
    for child in psutil.Process().children(recursive=True):
        try:
            child.nice(max(child.nice(), niceness))
            lowered += 1
        except psutil.Error:  # gone already, or not ours
            continue
    return lowered
