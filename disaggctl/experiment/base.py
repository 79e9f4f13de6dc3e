"""What every experiment module provides, and the settings a run hands it.

An experiment module (``disaggctl/experiment/<name>.py``) defines

- ``NAME``, ``TITLE`` and ``SECONDS_PER_UNIT`` (seconds one unit of its jobs took on the
  reference machine, for the duration estimate: see ``runner.estimate``);
- ``plan(settings) -> Plan``: the setup (every knob and its value) and the independent jobs;
- ``analyse(plan, results) -> dict``: the numbers (means ± standard errors over the trials), from
  the jobs' results in job order; plain data, written as the experiment's JSON;
- ``report(data, setup, folder, section)``: write CSVs and PNGs into ``folder`` and add the
  tables and figures (each with its computed paragraph) to ``section``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from disaggctl.experiment.fanout import Job

__all__ = ["Plan", "Settings", "regime_of"]


@dataclass(frozen=True)
class Settings:
    quick: bool = False
    trials: int = 3
    traces: str | None = None  # where the full traces are (``traces``); None: ../shared/traces

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(range(self.trials))


@dataclass
class Plan:
    setup: dict[str, Any]
    jobs: list[Job] = field(default_factory=list)


def regime_of(ttft_p99_s: float | None, theta1: float, theta2: float) -> str | None:
    """The controller's regime for a TTFT P99 (``controller.detector``: below θ1, transition up
    to θ2, saturated from θ2 on), without its smoothing, hysteresis and dwell: the label of a
    steady operating point.

    >>> regime_of(0.1, 0.3, 0.9), regime_of(0.5, 0.3, 0.9), regime_of(0.9, 0.3, 0.9)
    ('below', 'transition', 'saturated')
    """
    if ttft_p99_s is None:
        return None
    if ttft_p99_s < theta1:
        return "below"
    return "transition" if ttft_p99_s < theta2 else "saturated"
