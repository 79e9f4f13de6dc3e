"""Dynamo's planner as the benchmarks run it, in Dynamo's replay and in our simulator
(docs/design.md §6; ``bench.controller``).

In Dynamo's replay, ``dynamo.replay.run_trace_replay(..., planner_config=…)`` builds the planner
and passes it to the replay as its scaling policy. In ours, :func:`planner_policy` builds the
same object the same way (``dynamo.replay.planner.planner_replay_adapter``: the same config, the
engines' capabilities from the same mocker arguments) and ``cluster.sim.scaling`` drives it from
our cluster's snapshots: one planner, two simulators.

The planner imports two modules of NVIDIA's ``aisimulate`` packages, which the registry does not
serve: :class:`_Placeholder` (installed here, never in the product) resolves every name in them
to a class that refuses to be built. Its throughput and latency targets never call them; its
other imports come with ``make planner``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Dynamo's planner under its targets that need no more than its defaults: throughput (the
# default) and latency scale on static queue and KV thresholds. 'sla' needs NVIDIA's
# aisimulate_core (not served); 'load' needs the operator's own queue and KV thresholds, which
# choosing here would be tuning the anchor.
PLANNER_TARGETS = {"dynamo planner": "throughput", "dynamo planner (latency)": "latency"}
MAX_MODEL_LEN = 131_072  # the planner's prefill thresholds are multiples of it


class _Placeholder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import-time stand-ins for ``aisimulate`` and ``aisimulate_core`` (module docstring):
    every name resolves to a class that refuses to be built. Appended last on ``sys.meta_path``,
    so a real install wins."""

    ROOTS = ("aisimulate", "aisimulate_core")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in self.ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        class Module(types.ModuleType):
            def __getattr__(self, attr: str) -> Any:
                if attr.startswith("__"):
                    raise AttributeError(attr)

                def refuse(*_: Any, **__: Any) -> None:
                    raise RuntimeError(f"{spec.name}.{attr} is a placeholder (bench)")

                return type(attr, (), {"__init__": refuse})

        return Module(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def planner_missing() -> str | None:
    """Why the planner cannot run here, or None; installs the placeholders when it can."""
    if importlib.util.find_spec("sklearn") is None:  # the first of the planner's imports
        return "Dynamo's planner needs `make planner`"
    if not any(isinstance(f, _Placeholder) for f in sys.meta_path):
        sys.meta_path.append(_Placeholder())
    return None


def engine_args(profile: Any, folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mocker's prefill and decode arguments for ``profile``: its engines' tables, and a
    start (a new worker, or one changing role) after the profile's role switch."""
    from cluster.backends.dynamo.replay import engines_of

    prefill, decode = engines_of(profile, folder)
    prefill["max_model_len"] = decode["max_model_len"] = MAX_MODEL_LEN
    start = {"startup_time": profile.role_switch_s}
    return {"engine": prefill, **start}, {"engine": decode, **start}


def planner_config(target: str, workers: int, folder: Path) -> dict[str, Any]:
    """Disaggregated, ``target`` (throughput or latency), held to ``workers`` workers; its
    HTML report goes to ``folder``."""
    return {
        "mode": "disagg", "optimization_target": target, "max_gpu_budget": workers,
        "report_output_dir": str(folder),
    }  # fmt: skip


@contextmanager
def planner_policy(target: str, workers: int, profile: Any, folder: Path) -> Iterator[Any]:
    """Dynamo's planner as a replay scaling policy, for our simulator (module docstring)."""
    os.environ.setdefault("DYN_LOG", "warn")
    from dynamo.replay.planner import planner_replay_adapter

    prefill, decode = engine_args(profile, folder)
    config = json.dumps(planner_config(target, workers, folder))
    with planner_replay_adapter(None, prefill, decode, config) as adapter:
        yield adapter


def planner_moves(details: Any) -> int:
    """Scaling decisions the planner made (each target it set for a pool)."""
    return len(getattr(details, "scaling_events", None) or [])
