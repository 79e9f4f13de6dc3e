"""One arm of ``disaggctl replay`` on the simulator, as a job (in this process or a Ray task).

:func:`run_sim_arm` takes plain values only (the trace's path and the replay's settings), reads
the trace itself, replays it through one arm (``cluster.sim.replay``), writes the arm's
per-request JSONL and per-tick JSON into ``out`` and returns an :class:`ArmOutcome`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cluster.sim.profile import load_profile
from cluster.sim.records import RequestRecord
from cluster.sim.replay import ReplayRun, parse_arm, replay_on_sim
from cluster.traces import (
    ReplayWindow,
    TracePrompts,
    TraceReader,
    TraceRequest,
    parse_sharing,
    trace_requests,
)
from controller.detector import Thresholds
from disaggctl.jsonout import strict_dumps
from disaggctl.replay.outcome import ArmOutcome, arm_slug, write_jsonl

__all__ = ["TraceSpec", "open_trace", "run_sim_arm"]

TraceSpec = dict[str, Any]  # trace, format, skip_bad_lines, window, seed, sharing, context


def open_trace(spec: TraceSpec) -> tuple[TraceReader, Iterator[TraceRequest], TracePrompts]:
    """The reader, the replay's requests and their prompts for a trace spec (plain values:
    ``trace``, ``format``, ``skip_bad_lines``, ``window`` (``ReplayWindow`` fields),
    ``block_tokens``, ``context_tokens``, ``seed``, ``sharing``)."""
    reader = TraceReader(
        spec["trace"],
        spec.get("format", "auto"),
        block_tokens=spec.get("block_tokens", 512),
        max_context_tokens=spec.get("context_tokens"),
        skip_bad_lines=spec.get("skip_bad_lines", False),
    )
    window = ReplayWindow.model_validate(spec.get("window", {}))
    requests = trace_requests(reader, window)
    prompts = TracePrompts(
        reader.block_tokens, seed=spec.get("seed", 0), sharing=parse_sharing(spec.get("sharing"))
    )
    return reader, requests, prompts


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _request_row(index: int, line: int, r: RequestRecord) -> dict[str, Any]:
    return {
        "index": index,
        "line": line,
        "arrival_s": r.arrival,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "output_tokens": r.output_tokens,
        "ttft_s": r.ttft,
        "e2e_s": r.e2e,
        "itl_mean_s": r.mean_itl,
        "prefill_worker": r.prefill_worker,
        "decode_worker": r.decode_worker,
        "policy_version": None if r.decision is None else r.decision.policy_version,
        "status": r.status,
    }


def outcome_of(run: ReplayRun, out: Path | None) -> ArmOutcome:
    """The report's view of a run; with ``out``, its requests and ticks are written there."""
    name = run.arm.name
    records = run.records
    files: list[str] = []
    ticks = [
        {
            "t": s.t,
            "regime": s.regime,
            "tau": s.tau,
            "omega": s.omega,
            "ttft_p99_smoothed_s": s.ttft_p99_smoothed_s,
            "poa_hat": s.poa_hat,
            "poa_routing": s.poa_routing,
            "poa_capacity": s.poa_capacity,
            "queue_depth": s.queue_depth,
            "in_flight": s.in_flight,
            "prefill_workers": s.prefill_workers,
            "decode_workers": s.decode_workers,
            "arrival_rate": s.arrival_rate,
        }
        for s in run.timeline
    ]
    if out is not None:
        slug = arm_slug(name)
        rows = (_request_row(k, run.lines[k], r) for k, r in enumerate(records))
        requests = out / f"requests-{slug}.jsonl"
        write_jsonl(requests, rows)
        tick_file = out / f"ticks-{slug}.json"
        tick_file.write_text(strict_dumps(ticks) + "\n")
        files = [requests.name, tick_file.name]
    return ArmOutcome(
        name=name,
        summary=run.summary(),
        arrival_s=[r.arrival for r in records],
        ttft_s=[_nan(r.ttft) for r in records],
        finish_s=[_nan(r.finished) for r in records],
        prompt_tokens=[r.prompt_tokens for r in records],
        cached_tokens=[r.cached_tokens if r.first_token is not None else 0 for r in records],
        ticks=ticks,
        files=files,
    )


def run_sim_arm(
    *,
    spec: TraceSpec,
    profile: str,
    topology: str,
    policy: str,
    resplit: bool,
    thresholds: tuple[float, float],
    seed: int,
    out: str | None,
    on_progress: Callable[[int, int, float], None] | None = None,
) -> ArmOutcome:
    """Replay the trace of ``spec`` through one arm (module docstring)."""
    reader, requests, prompts = open_trace(spec)
    run = replay_on_sim(
        requests,
        prompts,
        load_profile(profile),
        topology,
        parse_arm(policy, resplit),
        seed=seed,
        thresholds=Thresholds(*thresholds),
        on_progress=on_progress,
    )
    outcome = outcome_of(run, None if out is None else Path(out))
    outcome.summary["trace"] = reader.stats.as_dict()
    return outcome
